"""What export (``python -m avex.data export``) needs from every family, shared by the family
modules. Each family module says its own part next to its ``adapt``:

* ``PROCESSOR``: the transformers processor class its model's processor is;
* ``VIDEO``: how its video processor works (a style of :mod:`avex.data.video`), or None;
* ``SEES`` / ``HEARS``: whether it takes images and video / audio;
* ``export_inputs(model, processor, media, prompt)``: the processor keywords of one decoded
  file, and the keywords its ``adapt`` needs besides the processor's output (with
  ``AUDIO_IN_VIDEO``, also ``use_audio_in_video``);
* or ``EXPORT_REFUSED``: why a cache of it can't be trained on;
* optionally ``MAX_ASPECT_RATIO``: the most elongated image or video frame its processor
  takes, and ``audio_tokens(frames)``: the audio tokens its processor makes of so many valid
  mel frames; export refuses a file past either from its header (:func:`unusable_header`).

``media`` is an :class:`avex.data.media.Media`: ``kind`` ("video", "audio", "image"), the
sampled ``frames`` and the rate they were taken at (``fps``), ``audio`` samples at the
feature extractor's rate.
"""
from __future__ import annotations

__all__ = ["family_processor_inputs", "unusable_kind", "unusable_header", "shortest_audio",
           "marker", "prompt_text", "vision_inputs"]


def family_processor_inputs(family, model, processor, media, prompt: str, *,
                            use_audio_in_video: bool = True) -> tuple[dict, dict]:
    """(processor keywords, extra ``adapt`` keywords) of one decoded file (``media``) for
    ``model`` of ``family`` (its adapter module): the prompt with the family's placeholders
    (the processor's chat template when it has one), the media, and the family's settings.
    Export and serving both call this, so the processor sees the same inputs in each. A
    family that can't be exported from, or can't take the file's kind, is refused."""
    if getattr(family, "EXPORT_REFUSED", None):
        raise ValueError(f"model type {family.MODEL_TYPES[0]!r}: {family.EXPORT_REFUSED}")
    reason = unusable_kind(family, media.kind, media.audio is not None)
    if reason:
        raise ValueError(f"{media.path}: {reason}")
    if getattr(family, "AUDIO_IN_VIDEO", False):
        return family.export_inputs(model, processor, media, prompt,
                                    use_audio_in_video=use_audio_in_video)
    return family.export_inputs(model, processor, media, prompt)


def unusable_kind(family, kind: str, has_audio: bool) -> str | None:
    """Why ``family`` can't take a file of ``kind`` (None where it can): audio for a model
    that hears nothing, images for one that sees nothing, and video for one that sees
    nothing unless the video has an audio track (the track is what it gets)."""
    name = family.MODEL_TYPES[0]
    if kind == "audio" and not family.HEARS:
        return f"{name} takes no audio"
    if kind == "image" and not family.SEES:
        return f"{name} takes no images"
    if kind == "video" and not family.SEES and not has_audio:
        return f"{name} takes no video, and this video has no audio track for it"
    return None


def unusable_header(family, header: dict, *, extractor=None,
                    use_audio_in_video: bool = True) -> str | None:
    """Why ``family`` can't make a clip of a file with this header (:func:`avex.data.media.probe`;
    None where it can, or where the header doesn't say): an image or video frame more
    elongated than its ``MAX_ASPECT_RATIO``, or audio it hears too short for one audio token
    (:func:`shortest_audio`; ``extractor``: the processor's feature extractor, None: not
    checked)."""
    name, kind = family.MODEL_TYPES[0], header["kind"]
    limit = getattr(family, "MAX_ASPECT_RATIO", None)
    width, height = header.get("width") or 0, header.get("height") or 0
    if limit and family.SEES and kind in ("image", "video") and width and height \
            and max(width, height) / min(width, height) > limit:
        what = "the image is" if kind == "image" else "its video frames are"
        return (f"{what} {width}x{height} pixels (width x height), the longer side "
                f"{max(width, height) / min(width, height):.4g} times the shorter; {name}'s "
                f"processor takes at most {limit} times: crop or pad it")
    heard = kind == "audio" or (kind == "video" and header["audio"] and (
        not family.SEES or (getattr(family, "AUDIO_IN_VIDEO", False) and use_audio_in_video)))
    least = shortest_audio(family, extractor) if heard and family.HEARS else None
    seconds = header["audio_seconds"]
    if least is None or not seconds:
        return None
    rate = int(extractor.sampling_rate)
    samples = int(seconds * rate + 1e-6)
    if samples >= least:
        return None
    with_video = kind == "video" and family.SEES
    track = "its audio" if kind == "audio" else \
        "its audio track (heard with the video)" if with_video else "its audio track"
    fix = " (or export without use_audio_in_video)" if with_video else ""
    return (f"{track} lasts {seconds * 1e3:.1f} ms as its header says ({samples} samples at "
            f"{rate} Hz), under the {least / rate * 1e3:.2f} ms ({least} samples) from which "
            f"{name}'s processor makes one audio token ({type(extractor).__name__}, hop length "
            f"{extractor.hop_length}); the model would hear nothing of it: lengthen it or leave "
            f"it out{fix}")


def shortest_audio(family, extractor) -> int | None:
    """The fewest samples (at ``extractor``'s sampling rate) of which ``family``'s processor
    makes one audio token; None where the family or extractor doesn't say. A Whisper-style
    extractor marks one valid mel frame per ``hop_length`` samples begun (its attention mask
    taken every ``hop_length``), and the family's ``audio_tokens`` counts the tokens of so many
    frames."""
    count = getattr(family, "audio_tokens", None)
    hop = getattr(extractor, "hop_length", None)
    if count is None or not isinstance(hop, int) or hop < 1 \
            or not getattr(extractor, "sampling_rate", None):
        return None
    frames = next((n for n in range(1, 1025) if count(n) >= 1), None)
    return None if frames is None else (frames - 1) * hop + 1


def marker(processor, config, *names: str) -> str:
    """The token the model's config names (e.g. ``vision_start_token_id``), as text."""
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int):
            return processor.tokenizer.convert_ids_to_tokens(value)
    raise ValueError(f"{type(config).__name__} sets none of {list(names)}")


def prompt_text(processor, kind: str, placeholder: str, prompt: str) -> str:
    """The prompt of one file: the processor's chat template (a user turn with the media and
    the prompt, then the assistant's turn) where it has one, else the placeholder then the
    prompt."""
    if getattr(processor, "chat_template", None):
        content = [{"type": kind}, {"type": "text", "text": prompt}]
        return processor.apply_chat_template([{"role": "user", "content": content}],
                                             add_generation_prompt=True, tokenize=False)
    return f"{placeholder}{prompt}"


def vision_inputs(media) -> dict:
    """An image or a video's frames as the processor takes them. A video's frames come with
    the rate they were sampled at (the video processor's metadata): Qwen's M-RoPE times the
    frames by it, and a video longer than ``max_frames`` allows is sampled below ``--fps``."""
    if media.kind == "image":
        # [H, W, 3]: the processor would read an image a few pixels tall as [C, H, W]
        return {"images": [media.frames[0]],
                "images_kwargs": {"input_data_format": "channels_last"}}
    count = len(media.frames)
    return {"videos": [media.frames],
            "videos_kwargs": {"fps": media.fps,
                              "video_metadata": [{"total_num_frames": count, "fps": media.fps,
                                                  "frames_indices": list(range(count))}]}}
