"""Qwen2.5-Omni thinker (``Qwen2_5OmniThinkerForConditionalGeneration``): images, video and
audio, with TMRoPE positions ``[3, B, L]`` (audio interleaved with video in 2-second chunks
under ``use_audio_in_video``). Pass ``model.thinker`` of the full Omni model.

Refused before the vision and audio towers run: placeholders without their features, features
without placeholders, grids, pixel values or audio masks that disagree with the placeholders,
and a ``use_audio_in_video`` that doesn't match the prompt's layout (transformers 5.24's
processor doesn't return the flag, so it is passed by hand): with it, every video holds its
audio interleaved chunk by chunk as the model's TMRoPE expects; without it, no video does."""
from __future__ import annotations

import torch

from avex import _checks
from avex.adapters._capture import (AdaptedInputs, adapted, audio_token_counts,
                                    check_placeholders, check_processor_outputs,
                                    placeholder_runs, refuse_unused, require, token_id)
from avex.adapters._export import marker, prompt_text, vision_inputs
# its vision resize is Qwen2-VL's (the same aspect ratio limit), and its audio tower downsamples
# the mel frames as Qwen2-Audio's does (the processor's _get_feat_extract_output_lengths)
from avex.adapters.qwen2_5_vl import MAX_ASPECT_RATIO  # noqa: F401
from avex.adapters.qwen2_5_vl import check_per_video, check_vision_blocks
from avex.adapters.qwen2_audio import audio_tokens  # noqa: F401

MODEL_TYPES = ("qwen2_5_omni_thinker",)
# the model computes position ids of its own ([3, B, L] M-RoPE), which an export must
# record and every forward of a compacted sequence must pass
OWN_POSITIONS = True
# export (avex.adapters._export): its processor, its video processor's style, what it takes
PROCESSOR = "Qwen2_5OmniProcessor"
VIDEO = "qwen2_vl"
SEES, HEARS = True, True
AUDIO_INPUTS = ("input_features", "feature_attention_mask")
REFUSED = {"audio_feature_lengths": "pass feature_attention_mask, as the processor returns it"}
# the full model (thinker + talker) has this model_type and is refused: pruning serves the part
# that reads the prompt and writes text, its .thinker
WRAPPED_BY = ("qwen2_5_omni", "thinker")
# a video's audio track goes in with it, interleaved (export_inputs' use_audio_in_video)
AUDIO_IN_VIDEO = True
# vLLM (avex.integrations.vllm): the plugin refuses these architectures, and says why
VLLM_ARCHITECTURES = ("Qwen2_5OmniModel", "Qwen2_5OmniForConditionalGeneration",
                      "Qwen2_5OmniThinkerForConditionalGeneration")
VLLM_REFUSED = (
    "Qwen2.5-Omni is not covered by avex's vLLM plugin: vLLM 0.32's Omni thinker implements "
    "no multimodal-pruning interface, and its position rewrite after pruning doesn't handle "
    "audio (TMRoPE with a video's audio interleaved in 2-second chunks), so a pruned prompt "
    "would sit at wrong positions. Prune Omni with avex.adapters and avex.generate instead "
    "(docs/workflow.md)")


def adapt(model, **processor_outputs) -> AdaptedInputs:
    """``processor_outputs``: what ``Qwen2_5OmniProcessor`` returns (``input_ids``,
    ``attention_mask``, ``pixel_values_videos``, ``video_grid_thw``,
    ``video_second_per_grid``, ``input_features``, ``feature_attention_mask``, ...) plus
    ``use_audio_in_video`` as given to the processor."""
    inputs = check_processor_outputs(model, processor_outputs, refused=REFUSED)
    config = model.config
    image = token_id(config, "image_token_id", "image_token_index")
    video = token_id(config, "video_token_id", "video_token_index")
    audio = token_id(config, "audio_token_id", "audio_token_index")
    merge = config.vision_config.spatial_merge_size
    interleaved = _checks.flag("use_audio_in_video", inputs.get("use_audio_in_video", False))
    ids = inputs["input_ids"]
    check_vision_blocks(inputs, "image", image, "pixel_values", "image_grid_thw", merge,
                        [(*run, run[2] - run[1]) for run in placeholder_runs(ids, [image])])
    videos, audios, mixed = [], [], []
    for row, start, end in placeholder_runs(ids, [video, audio]):
        block = ids[row, start:end]
        n_video, n_audio = int((block == video).sum()), int((block == audio).sum())
        if n_video and n_audio and not interleaved:
            raise ValueError(
                f"use_audio_in_video is False but video {len(videos)} (sample {row}, positions "
                f"{start}..{end - 1}) holds its audio interleaved with it; pass "
                "use_audio_in_video=True as given to the processor (transformers 5.24's "
                "processor doesn't return it), or the TMRoPE positions are wrong")
        if n_video and not n_audio and interleaved:
            raise ValueError(
                f"use_audio_in_video is True but video {len(videos)} (sample {row}, positions "
                f"{start}..{end - 1}) holds no audio token: the prompt isn't interleaved (video "
                "and audio in separate blocks), and the model's TMRoPE would place it wrongly. "
                "Pass use_audio_in_video=False, or build the prompt with the processor's "
                "use_audio_in_video=True")
        if n_video:
            videos.append((row, start, end, n_video))
        if n_audio:
            audios.append((row, start, end, n_audio))
        if n_video and n_audio:
            mixed.append((len(videos) - 1, len(audios) - 1, row, start, end))
    check_vision_blocks(inputs, "video", video, "pixel_values_videos", "video_grid_thw", merge,
                        videos)
    if videos:
        require(inputs, ("video_second_per_grid",), "video", video,
                sum(block[3] for block in videos))
        check_per_video("video_second_per_grid", inputs["video_second_per_grid"], len(videos))
    if not audios:
        refuse_unused(inputs, AUDIO_INPUTS, "audio", audio)
    else:
        require(inputs, AUDIO_INPUTS, "audio", audio, sum(block[3] for block in audios))
        lengths = audio_token_counts(model, inputs)
        check_placeholders("audio", audio, audios, lengths,
                           "feature_attention_mask (valid frames through the audio tower)")
        for video_index, audio_index, row, start, end in mixed:
            _check_interleaving(model, inputs, video_index, lengths[audio_index], video, audio,
                                ids[row, start:end], f"sample {row}, positions {start}..{end - 1}")
    return adapted(model, inputs, visual_ids=[image, video], audio_ids=[audio],
                   native_positions=True)


def _check_interleaving(model, inputs, index, audio_count, video, audio, block, where):
    """The chunk-by-chunk order the model's TMRoPE assumes (its own ``get_chunked_index``)."""
    config = model.config
    merge = config.vision_config.spatial_merge_size
    t, h, w = inputs["video_grid_thw"][index].tolist()
    seconds = float(inputs["video_second_per_grid"][index])
    per_chunk = int(config.position_id_per_seconds * config.seconds_per_chunk)
    times = (torch.arange(t) * seconds * config.position_id_per_seconds).long()
    video_times = times.repeat_interleave((h // merge) * (w // merge))
    video_chunks = model.get_chunked_index(video_times, per_chunk, 0)
    audio_chunks = model.get_chunked_index(torch.arange(audio_count), per_chunk, 0)
    expected = []
    for j in range(max(len(video_chunks), len(audio_chunks))):
        for chunks, token in ((video_chunks, video), (audio_chunks, audio)):
            if j < len(chunks):
                expected += [token] * (chunks[j][1] - chunks[j][0])
    if block.tolist() != expected:
        raise ValueError(
            f"video {index} ({where}) interleaves its video and audio tokens otherwise than "
            f"the model's {per_chunk}-position chunks (position_id_per_seconds * "
            "seconds_per_chunk), so its TMRoPE positions would be wrong; build the prompt "
            "with this model's processor and use_audio_in_video=True")


def export_inputs(model, processor, media, prompt: str, *,
                  use_audio_in_video: bool = True) -> tuple[dict, dict]:
    """One image, audio file or video: the file's placeholder between its markers
    (``<|vision_bos|>``/``<|vision_eos|>``, ``<|audio_bos|>``/``<|audio_eos|>``) then the
    prompt (or the chat template). A video with an audio track and ``use_audio_in_video``
    gets the track interleaved chunk by chunk (the model's TMRoPE), and ``adapt`` is told."""
    config = model.config
    vision = (marker(processor, config, "vision_start_token_id"),
              marker(processor, config, "vision_end_token_id"))
    if media.kind == "audio":
        start = marker(processor, config, "audio_start_token_id")
        end = marker(processor, config, "audio_end_token_id")
        text = prompt_text(processor, "audio", f"{start}{processor.audio_token}{end}", prompt)
        return {"text": [text], "audio": [media.audio], "return_tensors": "pt",
                "sampling_rate": media.sampling_rate}, {}
    token = processor.video_token if media.kind == "video" else processor.image_token
    text = prompt_text(processor, media.kind, f"{vision[0]}{token}{vision[1]}", prompt)
    inputs = {"text": [text], "return_tensors": "pt", **vision_inputs(media)}
    if media.kind != "video" or not use_audio_in_video or media.audio is None:
        return inputs, {}
    inputs["audio"] = [media.audio]
    inputs["sampling_rate"] = media.sampling_rate
    extra = _audio_in_video(processor, config, 1)
    inputs["videos_kwargs"].update(extra.pop("videos_kwargs", {}))
    inputs.update(extra)
    return inputs, {"use_audio_in_video": True}


def _audio_in_video(processor, config, count: int) -> dict:
    """The processor keywords that interleave each video's audio track with it, on this
    transformers: ``load_audio_from_video`` + ``audio_from_video_indices`` where the
    processor has them (5.2x), ``use_audio_in_video`` before; chunking from the config."""
    timing = {"seconds_per_chunk": float(getattr(config, "seconds_per_chunk", 2)),
              "position_id_per_seconds": getattr(config, "position_id_per_seconds", 25)}
    if hasattr(processor, "_resolve_audio_from_video"):
        return {"load_audio_from_video": True, "audio_from_video_indices": list(range(count)),
                **timing}
    return {"use_audio_in_video": True, "videos_kwargs": {"use_audio_in_video": True,
                                                          **timing}}
