"""The feature cache's reference writer (:class:`CacheWriter`): clips in, a verified cache
directory out, in the format :mod:`avex.data.cache.format` names."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Sequence

import torch
from safetensors.torch import save_file

from avex.data.cache.format import (ANNOTATION_KEYS, ANNOTATION_LENGTH, CLIP_ID_PATTERN,
                                    FLOAT_DTYPES, FORMAT_NAME, FORMAT_VERSION, MANIFEST_FILE,
                                    META_FILE, PROMPT_SIDES, SHARD_DIR, SPLITS, check_finite,
                                    check_refs, file_sha256, is_feature_cache)


def _owned(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``value`` as a contiguous CPU tensor of ``dtype`` that the writer alone holds. A
    conversion that copied nothing is cloned: safetensors refuses two entries that share memory
    (the same prompt tensor handed to every clip, or slices of one tensor), and a caller may
    change its tensor after ``add`` returns."""
    stored = value.detach().to("cpu", dtype).contiguous()
    if stored.untyped_storage().data_ptr() == value.untyped_storage().data_ptr():
        stored = stored.clone()
    return stored


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


def install_cache(staging: Path, root: Path, overwrite: bool, *, when: str = "") -> None:
    """Rename the finished cache ``staging`` into place at ``root`` (:func:`check_replaceable`
    first). An old cache moves aside first, so a cache is at ``root`` at every moment."""
    check_replaceable(root, overwrite, when=when)
    if is_feature_cache(root):
        old = root.parent / f".{root.name}.old-{os.getpid()}"
        os.replace(root, old)
        os.replace(staging, root)
        shutil.rmtree(old)
    else:   # absent, or an empty folder (a rename replaces an empty folder)
        os.replace(staging, root)


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
            check_finite(stored, f"{name} for clip {clip_id!r}", stored_as=self.dtype)
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
                check_finite(stored, f"prompt_{side}_embeds for clip {clip_id!r}",
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
            "refs_av": check_refs("refs_av", refs_av, clip_id),
            "refs_v": check_refs("refs_v", refs_v, clip_id),
            "refs_a": check_refs("refs_a", refs_a, clip_id),
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
        self._shards[relative] = {"bytes": path.stat().st_size, "sha256": file_sha256(path),
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
        install_cache(self.staging, self.root, self.overwrite, when="appeared while writing: ")
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
