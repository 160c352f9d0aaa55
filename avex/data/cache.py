"""The feature-cache format: safetensors shards plus a JSON-lines manifest.

A cache is a directory::

    meta.json          dataset-wide facts: format version, feature dim, frames, tokenizer, shards
    manifest.jsonl     one JSON object per clip (id, split, shard, token counts, references)
    shards/*.safetensors   per clip: "<clip_id>/visual" [Nv, d], "<clip_id>/audio" [Na, d],
                           "<clip_id>/prompt_prefix_ids" [Lp], "<clip_id>/prompt_suffix_ids" [Ls]
                           (or "..._embeds" [L, D] instead of ids), optional annotations;
                           a clip exported from a real model (CacheWriter.add_merged) also holds
                           "<clip_id>/merged_embeds" [L, D], "<clip_id>/merged_modality" [L] and
                           optionally "<clip_id>/merged_position_ids" [..., L]

docs/benchmark.md's "Feature-cache format" section is the user-facing specification; this
module is its reference writer (:class:`CacheWriter`) and reader (:class:`FeatureCache`).
Reading memory-maps the shards and copies out one clip at a time; nothing is loaded whole.
"""
from __future__ import annotations

import hashlib
import json
import numbers
import os
import re
import shutil
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import torch
from safetensors import safe_open
from safetensors.torch import save_file

import avex
from avex import _checks
from avex.files import write_json_atomically
from avex.registry import SPLITS

FORMAT_NAME = "avex-feature-cache"
FORMAT_VERSION = 1
META_FILE = "meta.json"
MANIFEST_FILE = "manifest.jsonl"
SHARD_DIR = "shards"
# which shards passed their SHA-256 check, under which avex version (FeatureCache.verify_shards)
STAMP_FILE = ".avex-verified.json"
STAMP_FORMAT = "avex-verified/1"

CLIP_ID_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]{1,200}$")
FLOAT_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
INT_DTYPES = {"I64": torch.int64, "I32": torch.int32}
# Keys a row may carry per clip in its shard; the first four are the ones every row needs
# (prompt ids or prompt embeddings for each side).
FEATURE_KEYS = ("visual", "audio")
PROMPT_SIDES = ("prefix", "suffix")
ANNOTATION_KEYS = ("visual_role", "audio_role")
REQUIRED_ROW_FIELDS = ("clip_id", "split", "shard", "n_visual", "n_audio", "refs_av", "refs_v",
                       "refs_a")


class CacheError(ValueError):
    """A cache that cannot be read as written: the message names the file and, where one is at
    fault, the manifest row (1-based line number) and clip id."""


def _where(path, row: int | None = None, clip_id: str | None = None) -> str:
    text = str(path)
    if row is not None:
        text += f" row {row}"
    if clip_id is not None:
        text += f" (clip {clip_id!r})"
    return text


@dataclass
class Clip:
    """One clip as read from a cache. Tensors are CPU copies; ``visual``/``audio`` keep the stored
    dtype. Prompt ids are int64; a prompt side stored as embeddings has ``*_ids`` None and
    ``*_embeds`` set."""

    clip_id: str
    split: str
    visual: torch.Tensor                      # [Nv, d]
    audio: torch.Tensor                       # [Na, d]
    prompt_prefix_ids: torch.Tensor | None    # [Lp]
    prompt_suffix_ids: torch.Tensor | None    # [Ls]
    refs_av: list[str]
    refs_v: list[str]
    refs_a: list[str]
    prompt_prefix_embeds: torch.Tensor | None = None
    prompt_suffix_embeds: torch.Tensor | None = None
    annotations: dict[str, torch.Tensor] = field(default_factory=dict)
    info: dict = field(default_factory=dict)
    # a clip exported from a real model: "inputs_embeds" [L, D] (the model's merged embeddings),
    # "modality" int64 [L] (avex.modality codes), "position_ids" int64 [..., L] or None
    merged: dict | None = None

    @property
    def n_visual(self) -> int:
        return self.visual.shape[0]

    @property
    def n_audio(self) -> int:
        return self.audio.shape[0]


@dataclass(frozen=True)
class CacheMeta:
    dim: int
    n_frames: int | None
    dtype: str
    tokenizer: str | None           # path relative to the cache root, or a model path / name
    splits: dict
    shards: dict                    # relative shard path -> {"bytes", "sha256", "clips"}
    source: dict
    version: int = FORMAT_VERSION


# ---------------------------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------------------------

def _sha256(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _owned(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``value`` as a contiguous CPU tensor of ``dtype`` that the writer alone holds. A
    conversion that copied nothing is cloned: safetensors refuses two entries that share memory
    (the same prompt tensor handed to every clip, or slices of one tensor), and a caller may
    change its tensor after ``add`` returns."""
    stored = value.detach().to("cpu", dtype).contiguous()
    if stored.untyped_storage().data_ptr() == value.untyped_storage().data_ptr():
        stored = stored.clone()
    return stored


def _check_refs(name: str, refs, clip_id: str) -> list[str]:
    """A clip's references of one kind: a list of non-empty strings, possibly empty (a clip
    without AV references is legal: a label-free cache trains with the fidelity reward)."""
    if not isinstance(refs, (list, tuple)) or not all(isinstance(r, str) and r.strip()
                                                      for r in refs):
        raise ValueError(f"{name} for clip {clip_id!r} must be a list of non-empty strings, "
                         f"got {refs!r}")
    return list(refs)


def _check_finite(values: torch.Tensor, what: str, *, stored_as=None) -> None:
    """Features must be finite (as stored: a float32 value past float16's range becomes inf)."""
    finite = torch.isfinite(values)
    if not bool(finite.all()):
        token = int(torch.nonzero(~finite)[0, 0])
        note = f" once stored as {stored_as}" if stored_as is not None else ""
        raise ValueError(f"{what} holds NaN or inf{note} (token {token}); features must be "
                         "finite")


ANNOTATION_LENGTH = {"visual_role": lambda visual, audio: visual.shape[0],
                     "audio_role": lambda visual, audio: audio.shape[0]}


def _annotation(name: str, value, clip_id: str, length: int) -> torch.Tensor:
    """A per-token int8 annotation: one integer in [-128, 127] per token of its modality."""
    value = torch.as_tensor(value)
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"annotation {name} for clip {clip_id!r} must hold integers, got "
                        f"{value.dtype}")
    if value.dim() != 1 or value.shape[0] != length:
        raise ValueError(f"annotation {name} for clip {clip_id!r} must have one value per "
                         f"token ([{length}]), got shape {list(value.shape)}")
    if value.numel() and (int(value.min()) < -128 or int(value.max()) > 127):
        bad = int(value.max()) if int(value.max()) > 127 else int(value.min())
        raise ValueError(f"annotation {name} for clip {clip_id!r} is stored as int8 and must "
                         f"lie in [-128, 127], got {bad}")
    return _owned(value, torch.int8)


def is_feature_cache(path) -> bool:
    """Whether ``path`` is a folder holding a feature cache's meta.json (the format's name in
    it): the one kind of folder ``overwrite`` may replace."""
    try:
        meta = json.loads((Path(path) / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("format") == FORMAT_NAME


def check_replaceable(root: Path, overwrite: bool, *, when: str = "") -> None:
    """A cache may be written at ``root`` when nothing is there or an empty folder is, and,
    with ``overwrite``, when a feature cache is. Any other folder is refused, as are the
    working directory, the home directory and the folders that hold them, cache or not."""
    resolved = Path(root).resolve()
    for name, protected in (("the working directory", Path.cwd()), ("the home directory",
                                                                     Path.home())):
        protected = protected.resolve()
        if resolved == protected or resolved in protected.parents:
            raise FileExistsError(f"cache directory {str(root)!r} is {name} or holds it "
                                  f"({protected}); write the cache to a folder of its own")
    if not root.exists():
        return
    if not root.is_dir():
        raise FileExistsError(f"{when}cache directory {str(root)!r} is a file")
    if is_feature_cache(root):
        if not overwrite:
            raise FileExistsError(f"{when}cache directory {str(root)!r} already exists (a "
                                  "feature cache); pass overwrite=True to replace it")
        return
    if any(root.iterdir()):
        raise FileExistsError(f"{when}{str(root)!r} exists and is not a feature cache (no "
                              f"{META_FILE} of format {FORMAT_NAME!r}); overwrite only ever "
                              "replaces a feature cache, so choose another folder or empty "
                              "this one yourself")


class CacheWriter:
    """Writes a cache directory. Use as a context manager; nothing appears at ``root`` until the
    writer closes without error (it builds in a sibling temporary directory, then renames).

    ``tokenizer`` says how to read the prompt ids: a path relative to the cache root (a tokenizer
    saved inside the cache), or a model path / hub name; None when prompts are stored as
    embeddings. ``source`` is free-form provenance written into meta.json.
    """

    def __init__(self, root, *, dim: int, n_frames: int | None = None,
                 dtype: torch.dtype = torch.float32, tokenizer: str | None = None,
                 source: dict | None = None, clips_per_shard: int = 256, overwrite: bool = False):
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"dim must be a positive int, got {dim!r}")
        if dtype not in FLOAT_DTYPES.values():
            raise ValueError(f"dtype must be one of float32, float16, bfloat16, got {dtype}")
        if isinstance(clips_per_shard, bool) or not isinstance(clips_per_shard, int) \
                or clips_per_shard < 1:
            raise ValueError(f"clips_per_shard must be a positive int, got {clips_per_shard!r}")
        if n_frames is not None and (isinstance(n_frames, bool) or not isinstance(n_frames, int)
                                     or n_frames < 1):
            raise ValueError(f"n_frames must be a positive int or None, got {n_frames!r}")
        if tokenizer is not None and not isinstance(tokenizer, str):
            raise TypeError(f"tokenizer must be a str or None, got {type(tokenizer).__name__}")
        if source is not None and not isinstance(source, dict):
            raise TypeError(f"source must be a dict or None, got {type(source).__name__}")
        self.root = Path(root)
        check_replaceable(self.root, overwrite)
        self.dim, self.n_frames, self.dtype = dim, n_frames, dtype
        self.tokenizer, self.source = tokenizer, dict(source or {})
        self.clips_per_shard, self.overwrite = clips_per_shard, overwrite
        self.staging = self.root.parent / f".{self.root.name}.tmp-{os.getpid()}"
        if self.staging.exists():
            shutil.rmtree(self.staging)
        (self.staging / SHARD_DIR).mkdir(parents=True)
        self._pending: dict[str, list[tuple[dict, dict]]] = {}
        self._shard_count: dict[str, int] = {}
        self._rows: list[dict] = []
        self._ids: set[str] = set()
        self._shards: dict[str, dict] = {}
        self._closed = False

    @property
    def staging_dir(self) -> Path:
        """Where files written before :meth:`close` live (e.g. to save a tokenizer into)."""
        return self.staging

    def add(self, clip_id: str, split: str, visual: torch.Tensor, audio: torch.Tensor, *,
            refs_av: Sequence[str], refs_v: Sequence[str] = (), refs_a: Sequence[str] = (),
            prompt_prefix_ids=None, prompt_suffix_ids=None, prompt_prefix_embeds=None,
            prompt_suffix_embeds=None, prompt_text: dict | None = None,
            annotations: dict | None = None, info: dict | None = None,
            _merged: tuple[dict, dict] | None = None) -> None:
        if not isinstance(clip_id, str) or not CLIP_ID_PATTERN.match(clip_id):
            raise ValueError("clip_id must match [A-Za-z0-9_.-]{1,200}, got " + repr(clip_id))
        if clip_id in self._ids:
            raise ValueError(f"clip_id {clip_id!r} was already added")
        if split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
        tensors = {}
        for name, value in (("visual", visual), ("audio", audio)):
            if not isinstance(value, torch.Tensor) or value.dim() != 2 \
                    or value.shape[1] != self.dim or not value.is_floating_point():
                shape = list(value.shape) if isinstance(value, torch.Tensor) else type(value)
                raise ValueError(f"{name} for clip {clip_id!r} must be a float tensor "
                                 f"[N, {self.dim}], got {shape}")
            stored = _owned(value, self.dtype)
            _check_finite(stored, f"{name} for clip {clip_id!r}", stored_as=self.dtype)
            tensors[f"{clip_id}/{name}"] = stored
        for side, ids, embeds in (("prefix", prompt_prefix_ids, prompt_prefix_embeds),
                                  ("suffix", prompt_suffix_ids, prompt_suffix_embeds)):
            if (ids is None) == (embeds is None):
                raise ValueError(f"clip {clip_id!r}: give exactly one of prompt_{side}_ids and "
                                 f"prompt_{side}_embeds")
            if ids is not None:
                ids = torch.as_tensor(ids)
                if ids.dim() != 1 or ids.is_floating_point() or ids.dtype == torch.bool:
                    raise ValueError(f"prompt_{side}_ids for clip {clip_id!r} must be a 1-D "
                                     f"integer sequence, got {ids.dtype} of shape "
                                     f"{list(ids.shape)}")
                if ids.numel() and int(ids.min()) < 0:
                    raise ValueError(f"prompt_{side}_ids for clip {clip_id!r} must be token ids "
                                     f">= 0, got {int(ids.min())}")
                tensors[f"{clip_id}/prompt_{side}_ids"] = _owned(ids, torch.int64)
            else:
                if not isinstance(embeds, torch.Tensor) or embeds.dim() != 2 \
                        or not embeds.is_floating_point():
                    raise ValueError(f"prompt_{side}_embeds for clip {clip_id!r} must be a "
                                     "float tensor [L, D]")
                stored = _owned(embeds, self.dtype)
                _check_finite(stored, f"prompt_{side}_embeds for clip {clip_id!r}",
                              stored_as=self.dtype)
                tensors[f"{clip_id}/prompt_{side}_embeds"] = stored
        for name, value in (annotations or {}).items():
            if name not in ANNOTATION_KEYS:
                raise ValueError(f"annotation {name!r} is not one of {list(ANNOTATION_KEYS)}")
            tensors[f"{clip_id}/{name}"] = _annotation(name, value, clip_id,
                                                        ANNOTATION_LENGTH[name](visual, audio))
        if info is not None and not isinstance(info, dict):
            raise TypeError(f"info for clip {clip_id!r} must be a dict, got "
                            f"{type(info).__name__}")
        row = {
            "clip_id": clip_id,
            "split": split,
            "shard": None,  # filled when the shard is written
            "n_visual": int(visual.shape[0]),
            "n_audio": int(audio.shape[0]),
            # empty: a label-free clip (python -m avex.data export without captions)
            "refs_av": _check_refs("refs_av", refs_av, clip_id),
            "refs_v": _check_refs("refs_v", refs_v, clip_id),
            "refs_a": _check_refs("refs_a", refs_a, clip_id),
        }
        if prompt_text is not None:
            row["prompt"] = {k: str(prompt_text[k]) for k in PROMPT_SIDES if k in prompt_text}
        if info:
            row["info"] = info
        if _merged is not None:
            merged_tensors, row["merged"] = _merged
            tensors.update({f"{clip_id}/{k}": v for k, v in merged_tensors.items()})
        self._ids.add(clip_id)
        self._pending.setdefault(split, []).append((row, tensors))
        if len(self._pending[split]) >= self.clips_per_shard:
            self._flush(split)

    def add_merged(self, clip_id: str, split: str, inputs_embeds: torch.Tensor,
                   modality: torch.Tensor, position_ids: torch.Tensor | None = None, *,
                   refs_av: Sequence[str], refs_v: Sequence[str] = (),
                   refs_a: Sequence[str] = (), info: dict | None = None) -> None:
        """A clip as a real model's decoder reads it (e.g. ``avex.adapters.adapt`` of one
        row, padding removed): its merged ``inputs_embeds`` [L, D], modality codes [L] and, for
        a model with its own positions, ``position_ids`` [..., L] (M-RoPE: [3, L]). The AV rows
        are also stored as ``visual`` / ``audio`` and the text before the first AV token as
        the prompt prefix, the rest of the text as the suffix, so every reader of the plain
        format still works; the captioner reads the merged sequence as it is."""
        if not isinstance(inputs_embeds, torch.Tensor) or inputs_embeds.dim() != 2 \
                or inputs_embeds.shape[1] != self.dim or not inputs_embeds.is_floating_point():
            shape = list(inputs_embeds.shape) if isinstance(inputs_embeds, torch.Tensor) \
                else type(inputs_embeds).__name__
            raise ValueError(f"inputs_embeds for clip {clip_id!r} must be a float tensor "
                             f"[L, {self.dim}], got {shape}")
        length = inputs_embeds.shape[0]
        if not isinstance(modality, torch.Tensor) or modality.shape != (length,) \
                or modality.is_floating_point():
            shape = list(modality.shape) if isinstance(modality, torch.Tensor) else modality
            raise ValueError(f"modality for clip {clip_id!r} must be an int tensor [{length}], "
                             f"got {shape}")
        if bool(((modality < 0) | (modality > 2)).any()):
            raise ValueError(f"modality for clip {clip_id!r} must hold 0 (visual), 1 (audio) "
                             f"or 2 (text) (no padding), got {sorted(set(modality.tolist()))}")
        if not bool((modality == 2).any()):
            raise ValueError(f"modality for clip {clip_id!r} has no text token (code 2)")
        tensors = {"merged_embeds": _owned(inputs_embeds, self.dtype),
                   "merged_modality": _owned(modality, torch.int8)}
        rank = None
        if position_ids is not None:
            if not isinstance(position_ids, torch.Tensor) or position_ids.is_floating_point() \
                    or position_ids.dim() < 1 or position_ids.shape[-1] != length:
                shape = list(position_ids.shape) if isinstance(position_ids, torch.Tensor) \
                    else position_ids
                raise ValueError(f"position_ids for clip {clip_id!r} must be an int tensor "
                                 f"[..., {length}], got {shape}")
            tensors["merged_position_ids"] = _owned(position_ids, torch.int64)
            rank = position_ids.dim()
        embeds, codes = tensors["merged_embeds"], modality.cpu()
        av = torch.nonzero(codes != 2).flatten()
        first_av = int(av[0]) if av.numel() else length
        is_text = codes == 2
        before = is_text & (torch.arange(length) < first_av)
        self.add(clip_id, split, embeds[codes == 0], embeds[codes == 1], refs_av=refs_av,
                 refs_v=refs_v, refs_a=refs_a, prompt_prefix_embeds=embeds[before],
                 prompt_suffix_embeds=embeds[is_text & ~before], info=info,
                 _merged=(tensors, {"length": length, "position_rank": rank}))

    def _flush(self, split: str) -> None:
        items = self._pending.pop(split, [])
        if not items:
            return
        index = self._shard_count.get(split, 0)
        self._shard_count[split] = index + 1
        relative = f"{SHARD_DIR}/{split}-{index:05d}.safetensors"
        tensors = {}
        for row, clip_tensors in items:
            row["shard"] = relative
            tensors.update(clip_tensors)
            self._rows.append(row)
        path = self.staging / relative
        # one metadata key only: safetensors writes the metadata map in hash order, so two
        # keys would make byte-identical rebuilds impossible
        save_file(tensors, str(path), metadata={"format": f"{FORMAT_NAME}/{FORMAT_VERSION}"})
        self._shards[relative] = {"bytes": path.stat().st_size, "sha256": _sha256(path),
                                  "clips": len(items)}

    def close(self) -> Path:
        if self._closed:
            return self.root
        for split in list(self._pending):
            self._flush(split)
        if not self._rows:
            raise ValueError("no clips were added; an empty cache is not written")
        order = {s: i for i, s in enumerate(SPLITS)}
        self._rows.sort(key=lambda r: (order[r["split"]], r["shard"]))
        with open(self.staging / MANIFEST_FILE, "w", encoding="utf-8") as handle:
            for row in self._rows:
                handle.write(json.dumps(row, ensure_ascii=True) + "\n")
        counts = {s: sum(r["split"] == s for r in self._rows) for s in SPLITS}
        meta = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "dim": self.dim,
            "dtype": {v: k for k, v in FLOAT_DTYPES.items()}[self.dtype],
            "n_frames": self.n_frames,
            "tokenizer": self.tokenizer,
            "token_order": ["video", "audio"],
            "splits": {s: n for s, n in counts.items() if n},
            "shards": dict(sorted(self._shards.items())),
            "source": self.source,
        }
        with open(self.staging / META_FILE, "w", encoding="utf-8") as handle:
            json.dump(meta, handle, indent=1, sort_keys=True)
            handle.write("\n")
        check_replaceable(self.root, self.overwrite, when="appeared while writing: ")
        if is_feature_cache(self.root):
            # the old cache moves aside first: a cache is at root at every moment
            old = self.root.parent / f".{self.root.name}.old-{os.getpid()}"
            os.replace(self.root, old)
            os.replace(self.staging, self.root)
            shutil.rmtree(old)
        else:   # absent, or an empty folder (a rename replaces an empty folder)
            os.replace(self.staging, self.root)
        self._closed = True
        return self.root

    def abort(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
        self._closed = True

    def __enter__(self) -> "CacheWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            try:
                self.close()
            except BaseException:   # the staging folder never outlives a failed close
                self.abort()
                raise
        else:
            self.abort()


# ---------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------

def _read_meta(root: Path) -> CacheMeta:
    path = root / META_FILE
    if not path.is_file():
        raise CacheError(f"{path}: missing; {root} is not a feature cache (no {META_FILE})")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CacheError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
        raise CacheError(f"{path}: 'format' must be {FORMAT_NAME!r}, got {raw.get('format')!r}"
                         if isinstance(raw, dict) else f"{path}: must hold a JSON object")
    if raw.get("version") != FORMAT_VERSION:
        raise CacheError(f"{path}: format version {raw.get('version')!r} is not supported "
                         f"(this reader knows version {FORMAT_VERSION})")
    dim = raw.get("dim")
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise CacheError(f"{path}: 'dim' must be a positive int, got {dim!r}")
    if raw.get("dtype") not in FLOAT_DTYPES:
        raise CacheError(f"{path}: 'dtype' must be one of {list(FLOAT_DTYPES)}, "
                         f"got {raw.get('dtype')!r}")
    shards = raw.get("shards", {})
    if not isinstance(shards, dict):
        raise CacheError(f"{path}: 'shards' must be an object, got {type(shards).__name__}")
    for name, record in shards.items():
        if not isinstance(record, dict):
            raise CacheError(f"{path}: shards[{name!r}] must be an object with 'bytes', "
                             f"'sha256' and 'clips', got {record!r}")
        for key in ("bytes", "clips"):
            if key in record and not _count(record[key]):
                raise CacheError(f"{path}: shards[{name!r}][{key!r}] must be an int >= 0, "
                                 f"got {record[key]!r}")
        sha = record.get("sha256")
        if sha is not None and not (isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha)):
            raise CacheError(f"{path}: shards[{name!r}]['sha256'] must be 64 hex digits, got "
                             f"{sha!r}")
    n_frames = raw.get("n_frames")
    if n_frames is not None and not (_count(n_frames) and n_frames >= 1):
        raise CacheError(f"{path}: 'n_frames' must be a positive int or null, got {n_frames!r}")
    splits = raw.get("splits", {})
    if not isinstance(splits, dict) or not all(k in SPLITS and _count(v)
                                               for k, v in splits.items()):
        raise CacheError(f"{path}: 'splits' must map split names {list(SPLITS)} to clip counts "
                         f"(ints >= 0), got {splits!r}")
    tokenizer = raw.get("tokenizer")
    if tokenizer is not None and not isinstance(tokenizer, str):
        raise CacheError(f"{path}: 'tokenizer' must be a string or null, got {tokenizer!r}")
    if not isinstance(raw.get("source", {}), dict):
        raise CacheError(f"{path}: 'source' must be an object, got {raw.get('source')!r}")
    return CacheMeta(dim=dim, n_frames=raw.get("n_frames"), dtype=raw["dtype"],
                     tokenizer=raw.get("tokenizer"), splits=raw.get("splits", {}),
                     shards=shards, source=raw.get("source", {}))


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def json_lines(path, error: type = ValueError, unit: str = "row"):
    """(line number, object) of each non-blank line of the JSON-lines file ``path``; a line
    that is not a JSON object raises ``error`` naming the file and the ``unit`` ("row 3")."""
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as err:
                raise error(f"{path} {unit} {number}: not valid JSON ({err})") from None
            if not isinstance(value, dict):
                raise error(f"{path} {unit} {number}: must be a JSON object, got "
                            f"{type(value).__name__}")
            yield number, value


def _read_manifest(root: Path) -> list[dict]:
    path = root / MANIFEST_FILE
    if not path.is_file():
        raise CacheError(f"{path}: missing")
    rows, seen = [], {}
    for line_no, row in json_lines(path, CacheError):
        missing = [k for k in REQUIRED_ROW_FIELDS if k not in row]
        if missing:
            raise CacheError(f"{_where(path, line_no, row.get('clip_id'))}: missing "
                             f"field(s) {missing}")
        clip_id = row["clip_id"]
        if not isinstance(clip_id, str) or not CLIP_ID_PATTERN.match(clip_id):
            raise CacheError(f"{_where(path, line_no)}: clip_id {clip_id!r} must match "
                             "[A-Za-z0-9_.-]{1,200}")
        if clip_id in seen:
            raise CacheError(f"{_where(path, line_no, clip_id)}: duplicate clip_id (first "
                             f"on row {seen[clip_id]})")
        seen[clip_id] = line_no
        if row["split"] not in SPLITS:
            raise CacheError(f"{_where(path, line_no, clip_id)}: split must be one of "
                             f"{list(SPLITS)}, got {row['split']!r}")
        for key in ("n_visual", "n_audio"):
            value = row[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise CacheError(f"{_where(path, line_no, clip_id)}: {key} must be an int "
                                 f">= 0, got {value!r}")
        for key in ("refs_av", "refs_v", "refs_a"):
            refs = row[key]
            if not isinstance(refs, list) or not all(isinstance(r, str) and r.strip()
                                                     for r in refs):
                raise CacheError(f"{_where(path, line_no, clip_id)}: {key} must be a list "
                                 f"of non-empty strings, got {refs!r}")
        for key in ("info", "prompt"):
            if key in row and not isinstance(row[key], dict):
                raise CacheError(f"{_where(path, line_no, clip_id)}: {key} must be an "
                                 f"object, got {row[key]!r}")
        shard = row["shard"]
        if not isinstance(shard, str) or Path(shard).is_absolute() or ".." in Path(shard).parts:
            raise CacheError(f"{_where(path, line_no, clip_id)}: shard must be a path "
                             f"inside the cache, got {shard!r}")
        row["_line"] = line_no
        rows.append(row)
    if not rows:
        raise CacheError(f"{path}: holds no rows")
    return rows


def _read_stamp(path: Path, version: str) -> dict:
    """Shard -> the state it was verified in, from a stamp of this avex version (an absent,
    unreadable or other-version stamp counts for nothing)."""
    try:
        stamp = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(stamp, dict) or stamp.get("format") != STAMP_FORMAT \
            or stamp.get("avex_version") != version or not isinstance(stamp.get("shards"), dict):
        return {}
    return stamp["shards"]


def _write_stamp(path: Path, version: str, shards: dict) -> bool:
    """Write the stamp atomically (a temporary file, then a rename); False where the cache
    can't be written."""
    try:
        write_json_atomically(path, {"format": STAMP_FORMAT, "avex_version": version,
                                     "shards": shards}, indent=1, sort_keys=True)
    except OSError:
        return False
    return True


def _clip_index(index, count: int, what: str) -> int:
    """An int index in [-count, count) (a bool or a float is refused, not read as 0 or 1)."""
    if isinstance(index, bool) or not isinstance(index, numbers.Integral):
        raise TypeError(f"{what} must be an int, got {type(index).__name__}: {index!r} (use "
                        ".get(clip_id) for a clip id)")
    if not -count <= index < count:
        raise IndexError(f"{what} {index} out of range for {count} clips")
    return int(index)


class FeatureCache:
    """Read access to a feature cache.

    Opening reads ``meta.json`` and the manifest and checks every row against its shard's header
    (shapes, dtypes, keys) without reading tensor data. ``verify="hash"`` also checks each shard's
    SHA-256 against meta.json the first time a clip from it is read; ``verify="none"`` skips the
    header checks. ``expected_dim`` (e.g. a captioner's feature dim) is checked against the cache's.

    Errors are :class:`CacheError` naming the file and, for row problems, the manifest row.
    """

    def __init__(self, root, *, verify: str = "header", expected_dim: int | None = None,
                 max_open_shards: int = 8):
        if not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"root must be the path of a feature cache directory (a str or "
                            f"Path), got {type(root).__name__}: {root!r}")
        _checks.choice("verify", verify, ("none", "header", "hash"))
        _checks.optional_int_at_least("expected_dim", expected_dim, 1)
        _checks.int_at_least("max_open_shards", max_open_shards, 1)
        self.root = Path(root)
        if not self.root.is_dir():
            raise CacheError(f"{self.root}: no such cache directory")
        self.meta = _read_meta(self.root)
        if expected_dim is not None and expected_dim != self.meta.dim:
            raise CacheError(f"{self.root / META_FILE}: feature dim is {self.meta.dim} but "
                             f"{expected_dim} was expected (expected_dim)")
        self.rows = _read_manifest(self.root)
        self._by_id = {row["clip_id"]: i for i, row in enumerate(self.rows)}
        self.verify = verify
        self._handles: OrderedDict[str, object] = OrderedDict()
        self._max_open = max_open_shards
        self._hashed: set[str] = set()
        if verify != "none":
            self._check_all_rows()
        self._check_counts()

    # -- checks ---------------------------------------------------------------------------------
    def _check_counts(self) -> None:
        """meta.json's split sizes and per-shard clip counts against the manifest."""
        meta_path = self.root / META_FILE
        for split in SPLITS:
            rows = sum(row["split"] == split for row in self.rows)
            if self.meta.splits.get(split, 0) != rows:
                raise CacheError(f"{meta_path}: splits[{split!r}] is "
                                 f"{self.meta.splits.get(split, 0)} but {MANIFEST_FILE} has "
                                 f"{rows} {split} rows")
        for shard, record in self.meta.shards.items():
            rows = sum(row["shard"] == shard for row in self.rows)
            if "clips" in record and record["clips"] != rows:
                raise CacheError(f"{meta_path}: shards[{shard!r}] records {record['clips']} "
                                 f"clips but {MANIFEST_FILE} names it in {rows} rows")

    def _row_where(self, row: dict) -> str:
        return _where(self.root / MANIFEST_FILE, row["_line"], row["clip_id"])

    def _shard_path(self, row: dict) -> Path:
        path = self.root / row["shard"]
        if not path.is_file():
            raise CacheError(f"{path}: shard missing (named by {self._row_where(row)})")
        return path

    def _check_shard_size(self, path: Path, row: dict) -> None:
        # Listing shards in meta.json is optional; a listed shard must have its recorded size.
        record = self.meta.shards.get(row["shard"], {})
        size = path.stat().st_size
        if "bytes" in record and size != record["bytes"]:
            raise CacheError(f"{path}: shard is {size} bytes but meta.json records "
                             f"{record['bytes']} (truncated or replaced; named by "
                             f"{self._row_where(row)})")

    def _header(self, path: Path, row: dict) -> dict:
        """Key -> (dtype string, shape) from a shard's header, without reading tensor data."""
        with open(path, "rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                raise CacheError(f"{path}: corrupted shard, shorter than a safetensors header "
                                 f"(named by {self._row_where(row)})")
            n = int.from_bytes(head, "little")
            if n <= 0 or n > min(path.stat().st_size - 8, 100 << 20):
                raise CacheError(f"{path}: corrupted shard, header length {n} does not fit the "
                                 f"file (named by {self._row_where(row)})")
            try:
                header = json.loads(handle.read(n))
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise CacheError(f"{path}: corrupted shard, header is not valid JSON (named by "
                                 f"{self._row_where(row)})") from None
        data_size = path.stat().st_size - 8 - n
        out = {}
        for key, spec in header.items():
            if key == "__metadata__":
                continue
            try:
                start, end = spec["data_offsets"]
                dtype, shape = spec["dtype"], list(spec["shape"])
            except (KeyError, TypeError, ValueError):
                raise CacheError(f"{path}: corrupted shard, bad header entry {key!r} (named by "
                                 f"{self._row_where(row)})") from None
            if not (0 <= start <= end <= data_size):
                raise CacheError(f"{path}: corrupted shard, tensor {key!r} lies outside the "
                                 f"file (named by {self._row_where(row)})")
            out[key] = (dtype, shape)
        return out

    def _check_row(self, row: dict, header: dict, path: Path) -> None:
        where, clip_id, dim = self._row_where(row), row["clip_id"], self.meta.dim
        for name, count_key in (("visual", "n_visual"), ("audio", "n_audio")):
            key = f"{clip_id}/{name}"
            if key not in header:
                raise CacheError(f"{where}: shard {path} has no tensor {key!r}")
            dtype, shape = header[key]
            if dtype != self.meta.dtype:
                raise CacheError(f"{where}: {key} in {path} has dtype {dtype} but meta.json "
                                 f"'dtype' is {self.meta.dtype}")
            if len(shape) != 2 or shape[1] != dim:
                raise CacheError(f"{where}: {key} in {path} has shape {shape} but the feature "
                                 f"dim is {dim} (meta.json 'dim'); expected [{row[count_key]}, "
                                 f"{dim}]")
            if shape[0] != row[count_key]:
                raise CacheError(f"{where}: manifest says {count_key}={row[count_key]} but "
                                 f"{key} in {path} has {shape[0]} tokens")
        for side in PROMPT_SIDES:
            ids_key, emb_key = f"{clip_id}/prompt_{side}_ids", f"{clip_id}/prompt_{side}_embeds"
            if ids_key in header:
                dtype, shape = header[ids_key]
                if dtype not in INT_DTYPES or len(shape) != 1:
                    raise CacheError(f"{where}: {ids_key} in {path} must be a 1-D int64/int32 "
                                     f"tensor, got {dtype} {shape}")
            elif emb_key in header:
                dtype, shape = header[emb_key]
                if dtype != self.meta.dtype or len(shape) != 2:
                    raise CacheError(f"{where}: {emb_key} in {path} must be a {self.meta.dtype} "
                                     f"(meta.json 'dtype') [L, D] tensor, got {dtype} {shape}")
            else:
                raise CacheError(f"{where}: shard {path} has neither {ids_key!r} nor "
                                 f"{emb_key!r}")
        for name, count_key in (("visual_role", "n_visual"), ("audio_role", "n_audio")):
            key = f"{clip_id}/{name}"
            if key in header and (header[key][0] != "I8" or header[key][1] != [row[count_key]]):
                raise CacheError(f"{where}: {key} in {path} must be an I8 tensor "
                                 f"[{row[count_key]}] (one role per token), got "
                                 f"{header[key][0]} {header[key][1]}")
        if row.get("merged") is not None:
            self._check_merged(row, header, path)

    def _check_merged(self, row: dict, header: dict, path: Path) -> None:
        where, clip_id, merged = self._row_where(row), row["clip_id"], row["merged"]
        length, rank = merged.get("length"), merged.get("position_rank")
        expect = {"merged_embeds": (FLOAT_DTYPES, [length, self.meta.dim]),
                  "merged_modality": ({"I8"}, [length])}
        if rank is not None:
            expect["merged_position_ids"] = (INT_DTYPES, None)
        for name, (dtypes, shape) in expect.items():
            key = f"{clip_id}/{name}"
            if key not in header:
                raise CacheError(f"{where}: shard {path} has no tensor {key!r}")
            dtype, got = header[key]
            if dtype not in dtypes or (shape is not None and got != shape) or \
                    (shape is None and (len(got) != rank or got[-1] != length)):
                raise CacheError(f"{where}: {key} in {path} is {dtype} {got}; the manifest "
                                 f"says length {length}" + ("" if rank is None else
                                                            f", position rank {rank}"))

    def _check_all_rows(self) -> None:
        by_shard: dict[str, list[dict]] = {}
        for row in self.rows:
            by_shard.setdefault(row["shard"], []).append(row)
        for rows in by_shard.values():
            path = self._shard_path(rows[0])
            self._check_shard_size(path, rows[0])
            header = self._header(path, rows[0])
            for row in rows:
                self._check_row(row, header, path)

    def _check_hash(self, path: Path, row: dict) -> None:
        if row["shard"] in self._hashed:
            return
        expected = self.meta.shards.get(row["shard"], {}).get("sha256")
        if expected is None:
            raise CacheError(f"{path}: meta.json records no sha256 for this shard; cannot "
                             f"verify it (named by {self._row_where(row)})")
        if _sha256(path) != expected:
            raise CacheError(f"{path}: corrupted shard, SHA-256 differs from meta.json (named by "
                             f"{self._row_where(row)})")
        self._hashed.add(row["shard"])

    def verify_shards(self, indices: Sequence[int] | None = None) -> str:
        """Check by SHA-256 the shards that hold the clips ``indices`` (default: every clip),
        once per cache and avex version, and return a line saying what was done.

        A shard passes once its hash matches meta.json; that is recorded in ``STAMP_FILE``
        (written atomically) with the hash, the size and the modification time it had, under
        this avex version, and later calls skip it while all of those still hold. A cache that
        can't be written is verified in memory only (said in the line: the next command hashes
        again). Shards meta.json records no hash for can't be verified (said in the line).
        A mismatch is a :class:`CacheError` naming the shard."""
        chosen = range(len(self.rows)) if indices is None else indices
        rows = {}
        for index in chosen:
            row = self.rows[_clip_index(index, len(self.rows), "clip index")]
            rows.setdefault(row["shard"], row)
        if not rows:
            return f"no shard of {self.root} to verify"
        stamp_path = self.root / STAMP_FILE
        stamp = _read_stamp(stamp_path, avex.__version__)
        unrecorded, reused, hashed = [], 0, {}
        for shard, row in sorted(rows.items()):
            path = self._shard_path(row)
            expected = self.meta.shards.get(shard, {}).get("sha256")
            if expected is None:
                unrecorded.append(shard)
                continue
            stat = path.stat()
            state = {"sha256": expected, "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns}
            if stamp.get(shard) == state or shard in self._hashed:
                reused += 1
                self._hashed.add(shard)
                continue
            self._check_hash(path, row)
            hashed[shard] = state
        where = f"{len(rows) - len(unrecorded)} shard(s) of {self.root} verified by SHA-256"
        if not hashed:
            note = f"{where} (checked before under avex {avex.__version__})" if reused else ""
        elif _write_stamp(stamp_path, avex.__version__, {**stamp, **hashed}):
            note = f"{where} ({len(hashed)} hashed now, {reused} checked before; recorded in " \
                   f"{STAMP_FILE})"
        else:
            note = f"{where} ({len(hashed)} hashed now, in memory only: the cache can't be " \
                   "written, so the next command hashes them again)"
        if unrecorded:
            note += ("; " if note else "") + (
                f"{len(unrecorded)} shard(s) NOT verified: meta.json records no sha256 for "
                f"{', '.join(unrecorded[:3])}{' ...' if len(unrecorded) > 3 else ''}")
        return note

    def verify_all(self) -> None:
        """Full check: every row against its shard header and every shard's SHA-256."""
        self._check_all_rows()
        for row in self.rows:
            self._check_hash(self._shard_path(row), row)

    # -- access ---------------------------------------------------------------------------------
    def _handle(self, row: dict):
        shard = row["shard"]
        handle = self._handles.get(shard)
        if handle is not None:
            self._handles.move_to_end(shard)
            return handle
        path = self._shard_path(row)
        if self.verify == "hash":
            self._check_hash(path, row)
        try:
            handle = safe_open(str(path), framework="pt", device="cpu")
        except Exception as err:  # safetensors raises its own error types
            raise CacheError(f"{path}: corrupted shard, safetensors cannot open it ({err}; "
                             f"named by {self._row_where(row)})") from None
        self._handles[shard] = handle
        if len(self._handles) > self._max_open:
            self._handles.popitem(last=False)
        return handle

    def _tensor(self, handle, row: dict, name: str, *, optional: bool = False):
        key = f"{row['clip_id']}/{name}"
        if key not in handle.keys():
            if optional:
                return None
            raise CacheError(f"{self._row_where(row)}: shard {self.root / row['shard']} has no "
                             f"tensor {key!r}")
        try:
            return handle.get_tensor(key)
        except Exception as err:
            raise CacheError(f"{self.root / row['shard']}: corrupted shard, cannot read {key!r} "
                             f"({err}; named by {self._row_where(row)})") from None

    def _check_features(self, tensor: torch.Tensor, row: dict, name: str) -> None:
        """Stored dtype as meta.json says, and finite values (a bit flip can make a NaN)."""
        where = f"{self._row_where(row)}: {name} in {self.root / row['shard']}"
        if tensor.dtype != FLOAT_DTYPES[self.meta.dtype]:
            raise CacheError(f"{where} has dtype {tensor.dtype} but meta.json 'dtype' is "
                             f"{self.meta.dtype}")
        try:
            _check_finite(tensor, where)
        except ValueError as err:
            raise CacheError(str(err) + "; the cache is corrupt, rebuild or re-export it") from None

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Clip:
        index = _clip_index(index, len(self.rows), "clip index")
        row = self.rows[index]
        handle = self._handle(row)
        visual = self._tensor(handle, row, "visual")
        audio = self._tensor(handle, row, "audio")
        for name, tensor, count_key in (("visual", visual, "n_visual"),
                                        ("audio", audio, "n_audio")):
            if tensor.dim() != 2 or tensor.shape[1] != self.meta.dim \
                    or tensor.shape[0] != row[count_key]:
                raise CacheError(f"{self._row_where(row)}: {name} has shape "
                                 f"{list(tensor.shape)}, expected [{row[count_key]}, "
                                 f"{self.meta.dim}]")
            self._check_features(tensor, row, name)
        prompt = {}
        for side in PROMPT_SIDES:
            ids = self._tensor(handle, row, f"prompt_{side}_ids", optional=True)
            embeds = None if ids is not None else \
                self._tensor(handle, row, f"prompt_{side}_embeds")
            if embeds is not None:
                self._check_features(embeds, row, f"prompt_{side}_embeds")
            prompt[side] = (None if ids is None else ids.to(torch.int64), embeds)
        annotations = {}
        for name, count_key in zip(ANNOTATION_KEYS, ("n_visual", "n_audio")):
            value = self._tensor(handle, row, name, optional=True)
            if value is not None:
                if value.dtype != torch.int8 or list(value.shape) != [row[count_key]]:
                    raise CacheError(f"{self._row_where(row)}: {name} in "
                                     f"{self.root / row['shard']} must be int8 "
                                     f"[{row[count_key]}], got {value.dtype} "
                                     f"{list(value.shape)}")
                annotations[name] = value
        merged = None
        if row.get("merged") is not None:
            positions = self._tensor(handle, row, "merged_position_ids", optional=True)
            merged = {"inputs_embeds": self._tensor(handle, row, "merged_embeds"),
                      "modality": self._tensor(handle, row, "merged_modality").to(torch.int64),
                      "position_ids": None if positions is None else positions.to(torch.int64)}
        return Clip(clip_id=row["clip_id"], split=row["split"], visual=visual, audio=audio,
                    prompt_prefix_ids=prompt["prefix"][0], prompt_suffix_ids=prompt["suffix"][0],
                    prompt_prefix_embeds=prompt["prefix"][1],
                    prompt_suffix_embeds=prompt["suffix"][1],
                    refs_av=list(row["refs_av"]), refs_v=list(row["refs_v"]),
                    refs_a=list(row["refs_a"]), annotations=annotations,
                    info=dict(row.get("info", {})), merged=merged)

    def __iter__(self) -> Iterator[Clip]:
        for i in range(len(self.rows)):
            yield self[i]

    def get(self, clip_id: str) -> Clip:
        if clip_id not in self._by_id:
            raise KeyError(f"clip_id {clip_id!r} is not in {self.root / MANIFEST_FILE}")
        return self[self._by_id[clip_id]]

    @property
    def clip_ids(self) -> list[str]:
        return [row["clip_id"] for row in self.rows]

    def split(self, name: str) -> "CacheSplit":
        if name not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {name!r}")
        indices = [i for i, row in enumerate(self.rows) if row["split"] == name]
        if not indices:
            raise CacheError(f"{self.root / MANIFEST_FILE}: no rows with split {name!r} "
                             f"(splits present: {sorted({r['split'] for r in self.rows})})")
        return CacheSplit(self, indices, name)

    def check_tokenizer(self) -> str | None:
        """Load the tokenizer meta.json names (a folder inside the cache, a local path, or a
        model already in the Hugging Face cache; nothing is downloaded) and return where it
        came from; None when prompts are stored as embeddings. A missing or broken one is a
        :class:`CacheError`: the prompt ids couldn't be read."""
        from transformers import AutoTokenizer

        name = self.meta.tokenizer
        if name is None:
            return None
        path, inside = self.tokenizer_path(), self.root / name
        try:
            AutoTokenizer.from_pretrained(path, local_files_only=True)
        except Exception as err:  # OSError, ValueError, and the tokenizer libraries' own
            if not inside.exists() and not Path(name).exists():
                # transformers' own message would be about the hub and the internet
                raise CacheError(f"{self.root / META_FILE} names tokenizer {name!r}, but the "
                                 f"cache has no {name}/ ({inside} is missing), and it is not a "
                                 "local path or a model in the Hugging Face cache either, so "
                                 "the prompt ids can't be read; restore that folder or rebuild "
                                 "the cache") from None
            raise CacheError(f"{self.root / META_FILE}: tokenizer {name!r} can't be loaded "
                             f"from the cache ({path}), so the prompt ids can't be read "
                             f"({type(err).__name__}: {str(err)[:200]})") from None
        return path

    def tokenizer_path(self) -> str | None:
        """The tokenizer for prompt ids: a directory inside the cache when one was saved there,
        otherwise meta.json's string as given (a model path or name)."""
        name = self.meta.tokenizer
        if name is None:
            return None
        inside = self.root / name
        return str(inside) if inside.exists() else name

    def close(self) -> None:
        self._handles.clear()


class CacheSplit(torch.utils.data.Dataset):
    """The clips of one split, as a map-style dataset over the parent :class:`FeatureCache`."""

    def __init__(self, cache: FeatureCache, indices: list[int], name: str):
        self.cache, self.indices, self.name = cache, indices, name

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, index: int) -> Clip:
        index = _clip_index(index, len(self.indices), f"index into split {self.name!r}")
        return self.cache[self.indices[index]]

    def __iter__(self) -> Iterator[Clip]:
        for i in range(len(self.indices)):
            yield self[i]

    @property
    def clip_ids(self) -> list[str]:
        return [self.cache.rows[i]["clip_id"] for i in self.indices]

    def references(self, kind: str = "av") -> list[list[str]]:
        """The references of every clip (from the manifest; no tensor is read)."""
        key = {"av": "refs_av", "v": "refs_v", "a": "refs_a"}.get(kind)
        if key is None:
            raise ValueError(f"kind must be 'av', 'v' or 'a', got {kind!r}")
        return [list(self.cache.rows[i][key]) for i in self.indices]
