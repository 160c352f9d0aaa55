"""``python -m avex.data export``: a folder of media files and their reference captions -> the
feature cache that ``python -m avex.train --data`` reads, through the model's own processor and
:func:`avex.adapters.adapt`.

Per clip, what is cached is what the adapter gives (``CacheWriter.add_merged``): the merged
embeddings the model's decoder reads, the modality codes, the model's own positions. Training
captions exactly that sequence, and serving (``adapt(model, **processor(...)).prune(policy=)``)
builds it the same way, so the two see the same layout.

The captions file is JSON lines, one clip a line::

    {"file": "clips/dog.mp4", "captions": ["a dog barks at a door", ...], "split": "train"}

``file`` is relative to the media folder; ``split`` one of train, val, test, transfer;
optional ``id`` (default: the file's path, made a clip id), ``visual_captions`` and
``audio_captions`` (the C_v / C_a references). Every check runs before anything is written:
the captions file, every media file's header, the processor against the model. A clip whose
processed sequence has no audio-visual token is refused before it is written. Clips are kept
as they are done in ``.<out>.export/`` beside the output, so an interrupted export resumes
where it stopped when run again with the same settings; the cache appears at ``out`` only
when every clip is done.

docs/workflow.md says which processor inputs each model family needs; :func:`family_inputs`
is that table in code.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from avex import _checks
from avex.adapters import adapt
from avex.data.cache import CLIP_ID_PATTERN, SPLITS, CacheWriter, json_lines
from avex.data.media import MediaError, media_kind, probe, read_media
from avex.modality import AUDIO, PAD, VISUAL
from avex.progress import progress_bar

__all__ = ["ExportSettings", "ExportError", "read_captions", "check_processor",
           "family_inputs", "export_cache"]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: model types export knows how to prompt (family_inputs); others are refused up front
FAMILIES = ("qwen2_5_omni_thinker", "qwen2_5_vl")


class ExportError(ValueError):
    """Input export refuses, before it writes anything: the message names the file, row or
    setting at fault."""


@dataclass
class ExportSettings:
    """How media become processor inputs. ``prompt``: the text after the media (the request
    the model answers with a caption); ``fps`` / ``max_frames``: video frame sampling;
    ``use_audio_in_video``: a video's audio track goes in with it (Qwen2.5-Omni interleaves
    the two); ``dtype``: the cache's float type."""
    prompt: str = "Describe what you see and hear."
    fps: float = 2.0
    max_frames: int | None = 32
    use_audio_in_video: bool = True
    dtype: str = "float32"
    clips_per_shard: int = 256

    def validate(self) -> "ExportSettings":
        _checks.text("prompt", self.prompt)
        _checks.positive_float("fps", self.fps)
        _checks.optional_int_at_least("max_frames", self.max_frames, 1)
        _checks.flag("use_audio_in_video", self.use_audio_in_video)
        _checks.choice("dtype", self.dtype, tuple(DTYPES))
        _checks.int_at_least("clips_per_shard", self.clips_per_shard, 1)
        return self


@dataclass
class CaptionRow:
    clip_id: str
    file: Path
    split: str
    captions: list
    visual_captions: list = field(default_factory=list)
    audio_captions: list = field(default_factory=list)
    line: int = 0


# ----------------------------------------------------------------------------------------------
# Checks: captions, media, processor
# ----------------------------------------------------------------------------------------------

def _clip_id(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", text)[-200:]


def _caption_list(path, line, name, value, required):
    if value is None and not required:
        return []
    if not isinstance(value, list) or not all(isinstance(c, str) and c.strip() for c in value) \
            or (required and not value):
        raise ExportError(f"{path} line {line}: {name!r} must be a list of non-empty strings"
                          f"{' (at least one)' if required else ''}, got {value!r}")
    return [" ".join(c.split()) for c in value]


def read_captions(path, media_dir) -> list[CaptionRow]:
    """The rows of a captions JSONL file, checked: JSON objects with ``file``, ``captions``
    and ``split``; files that exist under ``media_dir`` and have a known media suffix; clip
    ids unique. Every missing file is listed at once."""
    path, media_dir = Path(path), Path(media_dir)
    if not path.is_file():
        raise ExportError(f"captions: no file at {str(path)!r}")
    if not media_dir.is_dir():
        raise ExportError(f"media: no folder at {str(media_dir)!r}")
    rows, seen, missing = [], {}, []
    for line, raw in json_lines(path, ExportError, unit="line"):
        unknown = set(raw) - {"file", "captions", "split", "id", "visual_captions",
                              "audio_captions"}
        if unknown:
            raise ExportError(f"{path} line {line}: unknown field(s) {sorted(unknown)}")
        file = raw.get("file")
        if not isinstance(file, str) or not file.strip() or Path(file).is_absolute() \
                or ".." in Path(file).parts:
            raise ExportError(f"{path} line {line}: 'file' must be a path inside the media "
                              f"folder, got {file!r}")
        if raw.get("split") not in SPLITS:
            raise ExportError(f"{path} line {line}: 'split' must be one of {list(SPLITS)}, "
                              f"got {raw.get('split')!r}")
        try:
            media_kind(file)
        except MediaError as err:
            raise ExportError(f"{path} line {line}: {err}") from None
        clip_id = raw.get("id", _clip_id(file))
        if not isinstance(clip_id, str) or not CLIP_ID_PATTERN.match(clip_id):
            raise ExportError(f"{path} line {line}: 'id' must match [A-Za-z0-9_.-]{{1,200}}, "
                              f"got {clip_id!r}")
        if clip_id in seen:
            raise ExportError(f"{path} line {line}: clip id {clip_id!r} repeats line "
                              f"{seen[clip_id]} (give distinct 'id's)")
        seen[clip_id] = line
        if not (media_dir / file).is_file():
            missing.append(f"line {line}: {file}")
        rows.append(CaptionRow(clip_id, media_dir / file, raw["split"],
                               _caption_list(path, line, "captions", raw.get("captions"),
                                             True),
                               _caption_list(path, line, "visual_captions",
                                             raw.get("visual_captions"), False),
                               _caption_list(path, line, "audio_captions",
                                             raw.get("audio_captions"), False), line))
    if missing:
        shown = "; ".join(missing[:10]) + (f"; and {len(missing) - 10} more"
                                           if len(missing) > 10 else "")
        raise ExportError(f"{path} names {len(missing)} file(s) missing from {media_dir}: "
                          f"{shown}")
    if not rows:
        raise ExportError(f"{path}: holds no rows")
    if not any(r.split == "train" for r in rows):
        raise ExportError(f"{path}: no row has split 'train'; python -m avex.train needs one")
    return rows


def _token(tokenizer, model_config, *names):
    for name in names:
        value = getattr(model_config, name, None)
        if isinstance(value, int):
            return value, tokenizer.convert_ids_to_tokens(value)
    raise ExportError(f"{type(model_config).__name__} sets none of {list(names)}")


def check_processor(model, processor) -> None:
    """Refuse a processor that does not belong to ``model``: its tokenizer's placeholder ids,
    the vision patching (patch, merge and temporal patch sizes) and the audio feature size
    must be the model's, and its vocabulary must fit the model's embeddings."""
    config = model.config
    tokenizer = getattr(processor, "tokenizer", None)
    if tokenizer is None:
        raise ExportError(f"processor {type(processor).__name__} has no tokenizer; pass the "
                          "model's own processor (AutoProcessor.from_pretrained)")
    differ = []
    for attribute, names in (("image_token", ("image_token_id", "image_token_index")),
                             ("video_token", ("video_token_id", "video_token_index")),
                             ("audio_token", ("audio_token_id", "audio_token_index"))):
        token = getattr(processor, attribute, None)
        model_id = next((getattr(config, n) for n in names
                         if isinstance(getattr(config, n, None), int)), None)
        if token is None or model_id is None:
            continue
        ids = tokenizer.convert_tokens_to_ids(token)
        if ids != model_id:
            differ.append(f"{attribute} {token!r} is id {ids} in the tokenizer, the model's "
                          f"{names[0]} is {model_id}")
    vision = getattr(config, "vision_config", None)
    for part in ("image_processor", "video_processor"):
        proc = getattr(processor, part, None)
        if proc is None or vision is None:
            continue
        for ours, theirs in (("patch_size", "patch_size"), ("merge_size", "spatial_merge_size"),
                             ("temporal_patch_size", "temporal_patch_size")):
            mine, model_value = getattr(proc, ours, None), getattr(vision, theirs, None)
            if mine is not None and model_value is not None and mine != model_value:
                differ.append(f"{part}.{ours} is {mine}, the model's vision_config.{theirs} is "
                              f"{model_value}")
    audio = getattr(config, "audio_config", None)
    extractor = getattr(processor, "feature_extractor", None)
    if audio is not None and extractor is not None:
        mels = getattr(audio, "num_mel_bins", None)
        if mels is not None and getattr(extractor, "feature_size", mels) != mels:
            differ.append(f"feature_extractor.feature_size is {extractor.feature_size}, the "
                          f"model's audio_config.num_mel_bins is {mels}")
    vocab = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > vocab:
        differ.append(f"the tokenizer has {len(tokenizer)} tokens, the model embeds {vocab}")
    if differ:
        raise ExportError(f"the processor does not match the model ({type(model).__name__}): "
                          + "; ".join(differ))


# ----------------------------------------------------------------------------------------------
# What each family's processor takes
# ----------------------------------------------------------------------------------------------

def _omni_audio_in_video(processor, model, count: int) -> dict:
    """The processor keywords that interleave each video's audio track with it, on this
    transformers: ``load_audio_from_video`` + ``audio_from_video_indices`` where the
    processor has them (5.2x), ``use_audio_in_video`` before."""
    config = model.config
    timing = {"seconds_per_chunk": float(getattr(config, "seconds_per_chunk", 2)),
              "position_id_per_seconds": getattr(config, "position_id_per_seconds", 25)}
    if hasattr(processor, "_resolve_audio_from_video"):
        return {"load_audio_from_video": True, "audio_from_video_indices": list(range(count)),
                **timing}
    return {"use_audio_in_video": True, "videos_kwargs": {"use_audio_in_video": True,
                                                          **timing}}


def family_inputs(model, processor, media, settings: ExportSettings) -> tuple[dict, dict]:
    """(processor keywords, extra model keywords) for one decoded file (:class:`Media`):
    the prompt with the family's placeholders (the processor's chat template when it has one),
    the media, and the family's settings (Qwen2.5-Omni: a video's audio track interleaved,
    ``use_audio_in_video`` also handed to the model; chunking from the model's config)."""
    kind = model.config.model_type
    tokenizer = processor.tokenizer
    hears = kind == "qwen2_5_omni_thinker"
    if media.kind == "audio" and not hears:
        raise ExportError(f"{media.path}: {kind} takes no audio; export audio files with a "
                          "model that hears (Qwen2.5-Omni)")
    with_audio = hears and media.kind == "video" and settings.use_audio_in_video \
        and media.audio is not None
    if kind == "qwen2_5_omni_thinker":
        _, v_start = _token(tokenizer, model.config, "vision_start_token_id")
        _, v_end = _token(tokenizer, model.config, "vision_end_token_id")
        _, a_start = _token(tokenizer, model.config, "audio_start_token_id")
        _, a_end = _token(tokenizer, model.config, "audio_end_token_id")
        place = {"video": f"{v_start}{processor.video_token}{v_end}",
                 "image": f"{v_start}{processor.image_token}{v_end}",
                 "audio": f"{a_start}{processor.audio_token}{a_end}"}[media.kind]
    elif kind == "qwen2_5_vl":
        _, v_start = _token(tokenizer, model.config, "vision_start_token_id")
        _, v_end = _token(tokenizer, model.config, "vision_end_token_id")
        place = f"{v_start}{processor.video_token if media.kind == 'video' else processor.image_token}{v_end}"
    else:
        raise ExportError(f"export knows the processor inputs of {list(FAMILIES)}, not "
                          f"model type {kind!r}")
    if getattr(processor, "chat_template", None):
        content = [{"type": media.kind}, {"type": "text", "text": settings.prompt}]
        text = processor.apply_chat_template([{"role": "user", "content": content}],
                                             add_generation_prompt=True, tokenize=False)
    else:
        text = f"{place}{settings.prompt}"
    inputs: dict = {"text": [text], "return_tensors": "pt"}
    model_kwargs: dict = {}
    if media.kind == "image":
        inputs["images"] = [media.frames[0]]
    elif media.kind == "audio":
        inputs["audio"] = [media.audio]
    else:
        inputs["videos"] = [media.frames]
        inputs["videos_kwargs"] = {"fps": settings.fps}
        if with_audio:
            inputs["audio"] = [media.audio]
            extra = _omni_audio_in_video(processor, model, 1)
            inputs["videos_kwargs"].update(extra.pop("videos_kwargs", {}))
            inputs.update(extra)
            model_kwargs["use_audio_in_video"] = True
    return inputs, model_kwargs


# ----------------------------------------------------------------------------------------------
# Export
# ----------------------------------------------------------------------------------------------

def load_model(path):
    """The audio-visual model of a local Hugging Face directory, as the class its config.json
    names (``architectures``), in eval mode (the frozen captioner loads it the same way); the
    thinker of a full Qwen2.5-Omni."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(str(path))
    names = [n for n in (config.architectures or []) if hasattr(transformers, n)]
    if not names:
        raise ExportError(f"model: {path}/config.json (model_type {config.model_type!r}) names "
                          "no model class this transformers has")
    model = getattr(transformers, names[0]).from_pretrained(str(path), dtype=torch.float32)
    return getattr(model, "thinker", model).eval()


def _fingerprint(model, processor, settings) -> dict:
    """What the exported tensors depend on besides the media file (the captions don't: they
    are added when the cache is written, so a fixed caption doesn't void a partial export)."""
    return {"model_type": model.config.model_type,
            "model": str(getattr(model.config, "_name_or_path", "")),
            "parameters": sum(p.numel() for p in model.parameters()),
            "processor": type(processor).__name__, "settings": asdict(settings)}


def _source(row: CaptionRow) -> str:
    """The media file as a done clip records it: a changed file is exported again."""
    stat = row.file.stat()
    return f"{row.file.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"


def _done(partial: Path, row: CaptionRow) -> bool:
    path = partial / "clips" / f"{row.clip_id}.safetensors"
    if not path.is_file():
        return False
    try:
        with safe_open(str(path), framework="pt") as handle:
            return (handle.metadata() or {}).get("source") == _source(row)
    except Exception:  # a clip file cut short by a kill: exported again
        return False


def _sampling_rate(model, processor) -> int | None:
    extractor = getattr(processor, "feature_extractor", None)
    if extractor is None or getattr(model.config, "audio_config", None) is None:
        return None
    return int(extractor.sampling_rate)


def _export_clip(model, processor, row: CaptionRow, settings: ExportSettings, rate) -> dict:
    """One clip through the processor and the adapter: the tensors ``add_merged`` takes."""
    media = read_media(row.file, fps=settings.fps, max_frames=settings.max_frames,
                       sampling_rate=rate)
    if media.kind == "video" and media.audio is not None and media.audio.size == 0:
        media.audio = None
    if media.kind == "audio" and (media.audio is None or media.audio.size == 0):
        raise ExportError(f"{row.file}: the audio decodes to no samples")
    inputs, model_kwargs = family_inputs(model, processor, media, settings)
    processed = dict(processor(**inputs))
    processed = {k: v for k, v in processed.items() if isinstance(v, torch.Tensor)}
    adapted = adapt(model, **processed, **model_kwargs)
    modality = adapted.modality[0]
    present = modality != PAD
    if not bool(((modality == VISUAL) | (modality == AUDIO)).any()):
        raise ExportError(f"{row.file} (line {row.line}): the processed clip has no audio or "
                          "visual token (the processor expanded no placeholder); nothing could "
                          "be pruned or learned from it")
    positions = None if adapted.position_ids is None else adapted.position_ids[..., 0, :]
    return {"inputs_embeds": adapted.inputs_embeds[0][present].float(),
            "modality": modality[present],
            **({} if positions is None else {"position_ids": positions[..., present]})}


def export_cache(media_dir, captions, out, *, model, processor,
                 settings: ExportSettings | None = None, overwrite: bool = False,
                 progress: bool = True) -> Path:
    """Export every clip of ``captions`` (a JSONL file, :func:`read_captions`) under
    ``media_dir`` through ``processor`` and ``model`` into a feature cache at ``out``; see the
    module docstring. Returns ``out``."""
    settings = (settings or ExportSettings()).validate()
    out = Path(out)
    _checks.output_dir("out", str(out))
    if (out / "meta.json").exists() and not overwrite:
        raise ExportError(f"out: a cache already exists at {str(out)!r}; pass overwrite (the "
                          "CLI's --overwrite) to replace it")
    if getattr(model.config, "model_type", None) not in FAMILIES:
        raise ExportError(f"model: export knows the processor inputs of {list(FAMILIES)}, not "
                          f"model type {getattr(model.config, 'model_type', None)!r} "
                          "(docs/workflow.md)")
    rows = read_captions(captions, media_dir)
    check_processor(model, processor)
    rate = _sampling_rate(model, processor)
    for row in rows:  # every header, before anything is decoded or written
        try:
            info = probe(row.file)
        except MediaError as err:
            raise ExportError(f"{err} (captions line {row.line})") from None
        if info["kind"] == "audio" and rate is None:
            raise ExportError(f"{row.file} (captions line {row.line}): "
                              f"{model.config.model_type} takes no audio")
    partial = out.parent / f".{out.name}.export"
    fingerprint = _fingerprint(model, processor, settings)
    _open_partial(partial, fingerprint)
    todo = [r for r in rows if not _done(partial, r)]
    if len(todo) < len(rows):
        print(f"resuming the export in {partial}: {len(rows) - len(todo)} of {len(rows)} "
              "clips done")
    bar = progress_bar(todo, desc="export", unit="clip", disable=not progress)
    with torch.no_grad():
        for row in bar:
            tensors = _export_clip(model, processor, row, settings, rate)
            _write_atomically(partial / "clips" / f"{row.clip_id}.safetensors",
                              {k: v.contiguous() for k, v in tensors.items()},
                              {"source": _source(row)})
    dim = model.get_input_embeddings().embedding_dim
    source = {"exported_by": "python -m avex.data export", **fingerprint}
    with CacheWriter(out, dim=dim, dtype=DTYPES[settings.dtype], source=source,
                     clips_per_shard=settings.clips_per_shard, overwrite=overwrite) as writer:
        for row in rows:
            with safe_open(str(partial / "clips" / f"{row.clip_id}.safetensors"),
                           framework="pt") as handle:
                clip = {k: handle.get_tensor(k) for k in handle.keys()}
            writer.add_merged(row.clip_id, row.split, clip["inputs_embeds"], clip["modality"],
                              clip.get("position_ids"), refs_av=row.captions,
                              refs_v=row.visual_captions, refs_a=row.audio_captions,
                              info={"file": str(row.file.relative_to(Path(media_dir)))})
    shutil.rmtree(partial, ignore_errors=True)
    return out


def _open_partial(partial: Path, fingerprint: dict) -> None:
    """Open (or start) the partial export folder; one of another model or other settings is
    refused (its clips would mix two exports)."""
    settings = partial / "export.json"
    if settings.is_file():
        saved = json.loads(settings.read_text(encoding="utf-8"))
        if saved != fingerprint:
            differ = sorted(k for k in set(saved) | set(fingerprint)
                            if saved.get(k) != fingerprint.get(k))
            raise ExportError(f"{partial} holds an unfinished export with other settings "
                              f"(they differ in {differ}); run that export again to finish it, "
                              "or delete the folder to start over")
        return
    (partial / "clips").mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps(fingerprint, indent=1) + "\n", encoding="utf-8")


def _write_atomically(path: Path, tensors: dict, metadata: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    save_file(tensors, str(tmp), metadata=metadata)
    os.replace(tmp, path)

