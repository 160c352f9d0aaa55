"""``python -m avex.data export``: a folder of media files (and, optionally, their reference
captions) -> the feature cache that ``python -m avex.train --data`` reads, through the model's
own processor and :func:`avex.adapters.adapt`.

Per clip, what is cached is what the adapter gives (``CacheWriter.add_merged``): the merged
embeddings the model's decoder reads, the modality codes, the model's own positions. Training
captions exactly that sequence, and serving (``adapt(model, **processor(...)).prune(policy=)``)
builds it the same way, so the two see the same layout.

The captions file is JSON lines, one clip a line::

    {"file": "clips/dog.mp4", "captions": ["a dog barks at a door", ...], "split": "train"}

``file`` is relative to the media folder; ``split`` one of train, val, test, transfer;
``captions`` may be left out (a label-free clip: training with the fidelity reward needs no
references); optional ``id`` (default: the file's path, made a clip id), ``visual_captions``
and ``audio_captions`` (the C_v / C_a references); no media file in two splits. Without a
captions file, every media file under the folder is a train clip without references, and what
else the folder holds is named in a printed note (:func:`read_rows`).

What is checked when (docs/workflow.md says the same):

* before anything is written, in this order: the settings and the output path (an existing
  folder only if it is a feature cache and ``overwrite`` is given; never a symbolic link, the
  working or home directory), the model family, every captions line (or the media folder's
  files), the processor against the model, every file's header and whether the model takes
  its kind and its processor makes tokens of it (an image not too elongated, audio long
  enough for one audio token); then the lock (a second export into the same output is
  refused at once); then the probe pass: every file still to export is decoded in full
  once, and one that can't be decoded or decodes shorter than its header says is refused,
  naming its captions line. The CLI makes every check that needs no model (all but the
  processor's) before it loads the model (:func:`check_out`, :func:`read_rows`,
  :func:`model_dir_family`, :func:`check_headers`), and hands the clips to :func:`export_cache`;
* while exporting: each file is decoded again and checked against its header the same way,
  and a clip whose processed sequence has no audio-visual token is refused before it is
  written.

Clips are kept as they are done in ``.<out>.export/`` beside the output, so an export stopped
(Ctrl-C, SIGTERM: at a clip boundary) or killed resumes where it stopped when run again with
the same model, weights, tokenizer, processor settings and export settings (anything else is
refused: clips of two models never mix). The cache appears at ``out`` only when every clip is
done. Under ``torchrun``, each process exports its share of the clips (on its own GPU where
there are GPUs) and packs them into shards; the first merges the parts into the cache and
verifies it.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as torch_dist
from safetensors import SafetensorError, safe_open

from avex import _checks
from avex.adapters import FAMILIES as ADAPTERS
from avex.adapters import adapt, adapter_for
from avex.adapters._export import family_processor_inputs, unusable_kind
from avex.data.cache import CacheWriter, FeatureCache, check_replaceable
from avex.data.captions import (CaptionRow, ExportError, check_headers, media_rows,
                                note_cut_audio, note_unmeasured, read_captions, read_rows)
from avex.data.identity import settings_sha256, tokenizer_record, weights_sha256
from avex.data.media import MediaError, MediaSettings, check_media, read_media
from avex.data.parts import ExportLock, merge_parts, partial_dir, remove_stale
from avex.data.processor import with_frames_video_processor
from avex.files import save_tensors_atomically, write_json_atomically
from avex.modality import AUDIO, PAD, VISUAL
from avex.processes import TorchrunProcess
from avex.progress import progress_bar, transformers_progress
from avex.stop_signals import StopSignals

__all__ = ["ExportSettings", "ExportError", "ExportInterrupted", "read_captions",
           "media_rows", "check_processor", "family_inputs", "export_cache", "load_model",
           "check_out", "read_rows", "check_headers", "model_dir_family", "EXPORT_FAMILIES"]

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
#: model types export knows how to prompt (their adapter's export_inputs); the other adapters
#: say why not (EXPORT_REFUSED)
EXPORT_FAMILIES = tuple(m.MODEL_TYPES[0] for m in ADAPTERS.values()
                        if not getattr(m, "EXPORT_REFUSED", None))


class ExportInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped the export at a clip boundary; the clips done are kept.
    ``resume``: the command that continues it. The CLI prints it and exits with 130."""

    def __init__(self, done: int, total: int, resume: str):
        super().__init__(f"export stopped after {done} of {total} clips (kept); resume with: "
                         f"{resume}")
        self.done, self.total, self.resume = done, total, resume


@dataclass
class ExportSettings(MediaSettings):
    """How media become the cache's processor inputs: :class:`~avex.data.media.MediaSettings`
    (prompt, frame sampling, audio in video: what a server reads a request with too), plus
    ``dtype``: the cache's float type, and ``clips_per_shard``."""
    dtype: str = "float32"
    clips_per_shard: int = 256

    def validate(self) -> "ExportSettings":
        super().validate()
        _checks.choice("dtype", self.dtype, tuple(DTYPES))
        _checks.int_at_least("clips_per_shard", self.clips_per_shard, 1)
        return self


# ----------------------------------------------------------------------------------------------
# Checks: the processor
# ----------------------------------------------------------------------------------------------

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
# What each family's processor takes (each family's adapter module says it: export_inputs)
# ----------------------------------------------------------------------------------------------

def export_family(model):
    """The adapter module of ``model``'s family, where export knows how to prompt it; a model
    of another type, or one whose cache couldn't be trained on (Gemma 3n), is refused."""
    kind = getattr(getattr(model, "config", None), "model_type", None)
    try:
        family = adapter_for(model)
    except ValueError:
        raise ExportError(f"model: export knows the processor inputs of "
                          f"{list(EXPORT_FAMILIES)}, not model type {kind!r} "
                          "(docs/workflow.md)") from None
    if getattr(family, "EXPORT_REFUSED", None):
        raise ExportError(f"model: model type {kind!r} is refused by export: "
                          f"{family.EXPORT_REFUSED}")
    return family


def family_inputs(model, processor, media, settings: ExportSettings) -> tuple[dict, dict]:
    """(processor keywords, extra ``adapt`` keywords) for one decoded file (:class:`Media`):
    the prompt with the family's placeholders (the processor's chat template when it has
    one), the media, and the family's settings; each family's adapter module says how
    (``export_inputs``, docs/workflow.md's table)."""
    family = export_family(model)
    reason = unusable_kind(family, media.kind, media.audio is not None)
    if reason:
        raise ExportError(f"{media.path}: {reason}")
    inputs, model_kwargs = family_processor_inputs(
        family, model, processor, media, settings.prompt,
        use_audio_in_video=settings.use_audio_in_video)
    return inputs, model_kwargs


def model_dir_family(path, name: str = "model"):
    """The adapter module of the model a local Hugging Face folder holds, from its
    config.json alone (a full Qwen2.5-Omni's is its thinker's): what export checks before the
    model loads. A folder without a readable config.json, or of a family export can't prompt,
    is refused naming ``name``."""
    file = Path(path, "config.json")
    if not file.is_file():
        raise ExportError(f"{name}: {str(path)!r} is not a Hugging Face model directory "
                          "(no config.json)")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
        kind = config["model_type"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise ExportError(f"{name}: {file} is not a readable model config "
                          f"({type(err).__name__}: {err})") from None
    wrapped = {m.WRAPPED_BY[0]: m.MODEL_TYPES[0] for m in ADAPTERS.values()
               if hasattr(m, "WRAPPED_BY")}
    kind = wrapped.get(kind, kind)
    try:
        return export_family(SimpleNamespace(config=SimpleNamespace(model_type=kind)))
    except ExportError as err:
        raise ExportError(f"{name}: {str(err).removeprefix('model: ')}") from None


# ----------------------------------------------------------------------------------------------
# Export
# ----------------------------------------------------------------------------------------------

def load_model(path, device: str = "cpu", name: str = "model", progress: bool = True):
    """The audio-visual model of a local Hugging Face directory, as the class its config.json
    names (``architectures``), in eval mode on ``device`` (the frozen captioner loads it the
    same way); the thinker of a full Qwen2.5-Omni. A folder whose config or weights can't be
    read (missing, cut short, corrupt) is refused naming ``name``."""
    import transformers

    try:
        config = transformers.AutoConfig.from_pretrained(str(path))
        names = [n for n in (config.architectures or []) if hasattr(transformers, n)]
        if not names:
            raise ExportError(f"{name}: {path}/config.json (model_type {config.model_type!r}) "
                              "names no model class this transformers has")
        with transformers_progress(progress):   # --no-progress: no "Loading weights" bar
            model = getattr(transformers, names[0]).from_pretrained(str(path),
                                                                    dtype=torch.float32)
    except ExportError:
        raise
    except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as err:
        raise ExportError(f"{name}: can't load the model in {str(path)!r} "
                          f"({type(err).__name__}: {str(err)[:300]}); are its config.json "
                          "and weights complete?") from None
    return getattr(model, "thinker", model).eval().to(device)


def _processor_settings(processor) -> str:
    """A hash of every part of the processor but its tokenizer (hashed on its own): image
    sizes, patching, mel bins, the chat template all change what is exported."""
    parts = {}
    for name, value in vars(processor).items():
        if name == "tokenizer":
            continue
        to_dict = getattr(value, "to_dict", None)
        parts[name] = to_dict() if callable(to_dict) else value
    return settings_sha256({"class": type(processor).__name__, "parts": parts})


def _fingerprint(model, processor, settings) -> dict:
    """What the exported tensors depend on besides the media file (the captions don't: they
    are added when the cache is written, so a fixed caption doesn't void a partial export):
    the model (its type, its weights' hash), the tokenizer, the processor, the settings."""
    return {"model_type": model.config.model_type,
            "model": _model_path(model),
            "weights_sha256": weights_sha256(model),
            "tokenizer": tokenizer_record(processor.tokenizer),
            "processor": type(processor).__name__,
            "processor_sha256": _processor_settings(processor),
            "settings": asdict(settings)}


def _model_path(model) -> str:
    """Where ``model`` was loaded from, resolved where it is a path: the same folder spelt
    otherwise (relative, a trailing slash, a link) is the same model."""
    name = str(getattr(model.config, "_name_or_path", "") or "")
    return str(Path(name).resolve()) if name and Path(name).exists() else name


def _source(row: CaptionRow) -> str:
    """The media file as a done clip records it: a changed file is exported again."""
    stat = row.file.stat()
    return f"{row.file.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"


def _clip_path(partial: Path, row: CaptionRow) -> Path:
    return partial / "clips" / f"{row.clip_id}.safetensors"


def _done(partial: Path, row: CaptionRow) -> bool:
    path = _clip_path(partial, row)
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
    try:
        media = read_media(row.file, fps=settings.fps, max_frames=settings.max_frames,
                           sampling_rate=rate)
    except MediaError as err:
        raise ExportError(f"{err} ({row.where})") from None
    if media.kind == "video" and media.audio is not None and media.audio.size == 0:
        media.audio = None
    if media.kind == "audio" and (media.audio is None or media.audio.size == 0):
        raise ExportError(f"{row.file} ({row.where}): the audio decodes to no samples")
    inputs, model_kwargs = family_inputs(model, processor, media, settings)
    processed = dict(processor(**inputs))
    device = next(model.parameters()).device
    processed = {k: v.to(device) for k, v in processed.items() if isinstance(v, torch.Tensor)}
    adapted = adapt(model, **processed, **model_kwargs)
    modality = adapted.modality[0]
    present = modality != PAD
    if not bool(((modality == VISUAL) | (modality == AUDIO)).any()):
        raise ExportError(f"{row.file} ({row.where}): the processed clip has no audio or "
                          "visual token (the processor expanded no placeholder); nothing could "
                          "be pruned or learned from it")
    positions = None if adapted.position_ids is None else adapted.position_ids[..., 0, :]
    return {"inputs_embeds": adapted.inputs_embeds[0][present].float().cpu(),
            "modality": modality[present].cpu(),
            **({} if positions is None else {"position_ids": positions[..., present].cpu()})}


# ----------------------------------------------------------------------------------------------
# Checks that need no model loaded: the output (the clips and their headers: avex.data.captions)
# ----------------------------------------------------------------------------------------------

def check_out(out, overwrite: bool, inputs: list, *, cli: bool = False) -> None:
    """The output before anything is read: a folder that may be written (nothing there, an
    empty folder, or, with ``overwrite``, a feature cache), not a symbolic link, not the
    working or home directory, and no folder holding one of ``inputs`` ((what, path): the
    media, the captions, the model). ``cli``: the messages name the CLI's flags."""
    out = Path(out)
    name = "--out" if cli else "out"
    if out.is_symlink():
        raise ExportError(f"{name}: {str(out)!r} is a symbolic link (to "
                          f"{os.readlink(out)!r}); the cache is written beside it and renamed "
                          f"into place, which would replace the link: pass the folder it "
                          f"points to ({out.resolve()}) instead")
    _checks.output_dir(name, str(out))
    target = out.resolve()
    for what, path in inputs:
        if path is not None and (Path(path).resolve() == target
                                 or target in Path(path).resolve().parents):
            raise ExportError(f"{name}: {str(out)!r} holds the {what} ({path}); write the "
                              "cache to a folder of its own")
    try:
        check_replaceable(out, overwrite)
    except FileExistsError as err:
        text = str(err).replace("overwrite=True", "--overwrite") if cli else \
            str(err) + ("" if overwrite else " (the CLI's --overwrite)")
        raise ExportError(f"{name}: {text}") from None


class _Ranks(TorchrunProcess):
    """This process's place in a torchrun job (one process outside torchrun), and the
    agreement of every process on each step: one process's error stops them all, naming it."""

    def __init__(self):
        super().__init__("gloo")   # messages only: gloo, whatever the devices

    def agree(self, step, *args):
        """Run ``step`` on this process and raise, on every process, the first error any of
        them met (ExportError and the like; an interrupt is raised where it happened)."""
        error = None
        try:
            result = step(*args)
        except (ExportError, ValueError, OSError, RuntimeError) as err:
            error, result = err, None
        if self.world == 1:
            if error is not None:
                raise error
            return result
        errors = [None] * self.world
        torch_dist.all_gather_object(errors, None if error is None else
                                     f"{type(error).__name__}: {error}")
        if error is not None:
            raise error
        for rank, message in enumerate(errors):
            if message is not None:
                raise ExportError(f"process {rank} of {self.world} stopped the export: "
                                  f"{message}")
        return result


def export_cache(media_dir, captions, out, *, model, processor,
                 settings: ExportSettings | None = None, overwrite: bool = False,
                 progress: bool = True, split: str = "train",
                 resume_command: str | None = None, rows: list | None = None,
                 cli: bool = False) -> Path:
    """Export every clip of ``captions`` (a JSONL file, :func:`read_captions`; None: every
    media file under ``media_dir`` as a ``split`` clip without references, :func:`media_rows`)
    through ``processor`` and ``model`` into a feature cache at ``out``; see the module
    docstring for what is checked when. ``rows``: the clips as :func:`read_rows` and
    :func:`check_headers` gave them (the CLI reads them before it loads the model); None reads
    them here. Under torchrun each process exports its share; every process returns ``out``.
    Ctrl-C or SIGTERM stops at a clip boundary: :class:`ExportInterrupted`, the clips done
    kept, naming ``resume_command`` (the CLI's own command line) as the way on."""
    settings = (settings or ExportSettings()).validate()
    out = Path(out)
    check_out(out, overwrite, [("media folder", media_dir), ("captions file", captions),
                               ("model", getattr(model.config, "_name_or_path", None) or None)],
              cli=cli)
    family = export_family(model)
    rows = read_rows(media_dir, captions, split) if rows is None else rows
    check_processor(model, processor)
    processor = with_frames_video_processor(processor, model)
    rate = _sampling_rate(model, processor)
    check_headers(rows, family,   # every header, before anything is decoded or written
                  extractor=getattr(processor, "feature_extractor", None) if rate else None,
                  use_audio_in_video=settings.use_audio_in_video)
    note_cut_audio(rows, family, processor, settings)
    note_unmeasured(rows, family, hears=bool(rate))
    ranks = _Ranks()
    lock = ExportLock(partial_dir(out))
    try:
        with StopSignals() as stop:
            return _export(rows, out, model, processor, settings, rate, ranks, lock,
                           overwrite, progress, stop, resume_command or
                           "call export_cache again with the same arguments")
    finally:
        if lock.fd is not None:   # a run stopped before its first clip leaves nothing behind
            partial = partial_dir(out)
            if partial.exists() and not any((partial / "clips").glob("*.safetensors")):
                shutil.rmtree(partial, ignore_errors=True)
        lock.release()
        ranks.close()


def _export(rows, out, model, processor, settings, rate, ranks, lock, overwrite, progress,
            stop, resume):
    partial = partial_dir(out)
    fingerprint = _fingerprint(model, processor, settings)

    def take_lock():
        if ranks.rank == 0:
            if not lock.acquire():
                raise ExportError(f"out: another export is writing {out} (it holds the lock "
                                  f"on {partial}); wait for it to finish, or stop it")
            remove_stale(out)
            _open_partial(partial, fingerprint)

    ranks.agree(take_lock)
    ranks.agree(_open_partial, partial, fingerprint)   # every process's model and settings
    mine = rows[ranks.rank::ranks.world]
    todo = [r for r in mine if not _done(partial, r)]
    if len(todo) < len(mine):
        print(f"resuming the export in {partial}: {len(mine) - len(todo)} of {len(mine)} "
              f"clips done{f' (process {ranks.rank})' if ranks.world > 1 else ''}")
    ranks.agree(_probe_all, todo, rate is not None, stop)
    written = 0
    with torch.no_grad():
        bar = progress_bar(todo, desc="export", unit="clip",
                           disable=not progress or ranks.rank != 0)
        for row in bar:
            if stop.requested:   # Ctrl-C or SIGTERM: stop at this clip boundary
                break
            tensors = _export_clip(model, processor, row, settings, rate)
            save_tensors_atomically(_clip_path(partial, row),
                                    {k: v.contiguous() for k, v in tensors.items()},
                                    {"source": _source(row)})
            written += 1
    if stop.requested:
        raise ExportInterrupted(len(mine) - len(todo) + written, len(mine), resume)
    dim = model.get_input_embeddings().embedding_dim
    source = {"exported_by": "python -m avex.data export", **fingerprint}
    part = ranks.agree(_pack, partial, mine, ranks.rank, dim, settings, source)
    parts = [None] * ranks.world
    if ranks.world > 1:
        torch_dist.all_gather_object(parts, None if part is None else str(part))
    else:
        parts = [None if part is None else str(part)]
    if ranks.rank == 0:
        ranks.agree(_merge, [Path(p) for p in parts if p], out, rows, source, overwrite)
    else:
        ranks.agree(lambda: None)
    if ranks.rank == 0:
        shutil.rmtree(partial, ignore_errors=True)
    ranks.barrier()
    return out


def _probe_all(rows: list, audio: bool, stop) -> None:
    """The probe pass: every file decoded in full once, before any clip is written."""
    for row in rows:
        if stop.requested:
            return
        try:
            check_media(row.file, audio=audio)
        except MediaError as err:
            raise ExportError(f"{err} ({row.where})") from None


def _pack(partial: Path, rows: list, rank: int, dim: int, settings: ExportSettings,
          source: dict) -> Path | None:
    """This process's clips packed into cache shards (a cache of its own under
    ``parts/``); None when it has none."""
    if not rows:
        return None
    root = partial / "parts" / f"rank-{rank}"
    with CacheWriter(root, dim=dim, dtype=DTYPES[settings.dtype], source=source,
                     clips_per_shard=settings.clips_per_shard, overwrite=True) as writer:
        for row in rows:
            with safe_open(str(_clip_path(partial, row)), framework="pt") as handle:
                clip = {k: handle.get_tensor(k) for k in handle.keys()}
            writer.add_merged(row.clip_id, row.split, clip["inputs_embeds"], clip["modality"],
                              clip.get("position_ids"), refs_av=row.captions,
                              refs_v=row.visual_captions, refs_a=row.audio_captions,
                              info={"file": row.name})
    return root


def _merge(parts: list, out: Path, rows: list, source: dict, overwrite: bool) -> None:
    merge_parts(parts, out, [r.clip_id for r in rows], source=source, overwrite=overwrite)
    FeatureCache(out, verify="hash").verify_all()


def _open_partial(partial: Path, fingerprint: dict) -> None:
    """Open (or start) the partial export folder; one of another model, weights, tokenizer,
    processor or settings is refused (its clips would mix two exports)."""
    settings = partial / "export.json"
    if settings.is_file():
        saved = json.loads(settings.read_text(encoding="utf-8"))
        if saved != fingerprint:
            differ = sorted(k for k in set(saved) | set(fingerprint)
                            if saved.get(k) != fingerprint.get(k))
            raise ExportError(f"{partial} holds an unfinished export with another model or "
                              f"other settings (they differ in {differ}); run that export "
                              "again to finish it, or delete the folder to start over")
        return
    (partial / "clips").mkdir(parents=True, exist_ok=True)
    write_json_atomically(settings, fingerprint, indent=1)
