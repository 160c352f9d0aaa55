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
module holds its names and the checks writing and reading share, :mod:`.writer` its reference
writer (:class:`~avex.data.cache.writer.CacheWriter`) and :mod:`.reader` its reader
(:class:`~avex.data.cache.reader.FeatureCache`).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from avex.registry import SPLITS

__all__ = ["SPLITS"]  # the splits a cache holds (avex.registry names them)

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
# the order of a clip's tokens, as meta.json's "token_order" records it; the only one the reader
# reads (every video token, then every audio token)
TOKEN_ORDER = ("video", "audio")
ANNOTATION_KEYS = ("visual_role", "audio_role")
REQUIRED_ROW_FIELDS = ("clip_id", "split", "shard", "n_visual", "n_audio", "refs_av", "refs_v",
                       "refs_a")


class CacheError(ValueError):
    """A cache that cannot be read as written: the message names the file and, where one is at
    fault, the manifest row (1-based line number) and clip id."""


def location(path, row: int | None = None, clip_id: str | None = None) -> str:
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


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def check_refs(name: str, refs, clip_id: str) -> list[str]:
    """A clip's references of one kind: a list of non-empty strings, possibly empty (a clip
    without AV references is legal: a label-free cache trains with the fidelity reward)."""
    if not isinstance(refs, (list, tuple)) or not all(isinstance(r, str) and r.strip()
                                                      for r in refs):
        raise ValueError(f"{name} for clip {clip_id!r} must be a list of non-empty strings, "
                         f"got {refs!r}")
    return list(refs)


def check_finite(values: torch.Tensor, what: str, *, stored_as=None) -> None:
    """Features must be finite (as stored: a float32 value past float16's range becomes inf)."""
    finite = torch.isfinite(values)
    if not bool(finite.all()):
        token = int(torch.nonzero(~finite)[0, 0])
        note = f" once stored as {stored_as}" if stored_as is not None else ""
        raise ValueError(f"{what} holds NaN or inf{note} (token {token}); features must be "
                         "finite")


ANNOTATION_LENGTH = {"visual_role": lambda visual, audio: visual.shape[0],
                     "audio_role": lambda visual, audio: audio.shape[0]}


def peek_meta(path) -> dict | None:
    """The JSON object in ``path``'s meta.json, read without opening the cache (no manifest, no
    check); None where there is none to read (opening the cache names why)."""
    try:
        meta = json.loads((Path(path) / META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def is_feature_cache(path) -> bool:
    """Whether ``path`` is a folder holding a feature cache's meta.json (the format's name in
    it): the one kind of folder ``overwrite`` may replace."""
    return (peek_meta(path) or {}).get("format") == FORMAT_NAME


def is_count(value) -> bool:
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
