"""The feature cache's reader (:class:`FeatureCache`) and its splits as datasets
(:class:`CacheSplit`). Reading memory-maps the shards and copies out one clip at a time;
nothing is loaded whole."""
from __future__ import annotations

import json
import numbers
import os
import re
from collections import OrderedDict
from pathlib import Path
from typing import Iterator, Sequence

import torch
from safetensors import safe_open

import avex
from avex import _checks
from avex.data.cache.format import (ANNOTATION_KEYS, CLIP_ID_PATTERN, FLOAT_DTYPES,
                                    FORMAT_NAME, FORMAT_VERSION, INT_DTYPES, MANIFEST_FILE,
                                    META_FILE, PROMPT_SIDES, REQUIRED_ROW_FIELDS, SPLITS,
                                    STAMP_FILE, STAMP_FORMAT, TOKEN_ORDER, CacheError,
                                    CacheMeta, Clip, check_finite, file_sha256, is_count,
                                    json_lines, location)
from avex.files import write_json_atomically


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
            if key in record and not is_count(record[key]):
                raise CacheError(f"{path}: shards[{name!r}][{key!r}] must be an int >= 0, "
                                 f"got {record[key]!r}")
        sha = record.get("sha256")
        if sha is not None and not (isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha)):
            raise CacheError(f"{path}: shards[{name!r}]['sha256'] must be 64 hex digits, got "
                             f"{sha!r}")
    n_frames = raw.get("n_frames")
    if n_frames is not None and not (is_count(n_frames) and n_frames >= 1):
        raise CacheError(f"{path}: 'n_frames' must be a positive int or null, got {n_frames!r}")
    splits = raw.get("splits", {})
    if not isinstance(splits, dict) or not all(k in SPLITS and is_count(v)
                                               for k, v in splits.items()):
        raise CacheError(f"{path}: 'splits' must map split names {list(SPLITS)} to clip counts "
                         f"(ints >= 0), got {splits!r}")
    tokenizer = raw.get("tokenizer")
    if tokenizer is not None and not isinstance(tokenizer, str):
        raise CacheError(f"{path}: 'tokenizer' must be a string or null, got {tokenizer!r}")
    # absent: a cache from before the field, in the one order there is; present: that order
    if "token_order" in raw and raw["token_order"] != list(TOKEN_ORDER):
        raise CacheError(f"{path}: 'token_order' must be {list(TOKEN_ORDER)} (the reader reads "
                         f"every video token, then every audio token), got "
                         f"{raw['token_order']!r}")
    if not isinstance(raw.get("source", {}), dict):
        raise CacheError(f"{path}: 'source' must be an object, got {raw.get('source')!r}")
    return CacheMeta(dim=dim, n_frames=raw.get("n_frames"), dtype=raw["dtype"],
                     tokenizer=raw.get("tokenizer"), splits=raw.get("splits", {}),
                     shards=shards, source=raw.get("source", {}))


def _read_manifest(root: Path) -> list[dict]:
    path = root / MANIFEST_FILE
    if not path.is_file():
        raise CacheError(f"{path}: missing")
    rows, seen = [], {}
    for line_no, row in json_lines(path, CacheError):
        missing = [k for k in REQUIRED_ROW_FIELDS if k not in row]
        if missing:
            raise CacheError(f"{location(path, line_no, row.get('clip_id'))}: missing "
                             f"field(s) {missing}")
        clip_id = row["clip_id"]
        if not isinstance(clip_id, str) or not CLIP_ID_PATTERN.match(clip_id):
            raise CacheError(f"{location(path, line_no)}: clip_id {clip_id!r} must match "
                             "[A-Za-z0-9_.-]{1,200}")
        if clip_id in seen:
            raise CacheError(f"{location(path, line_no, clip_id)}: duplicate clip_id (first "
                             f"on row {seen[clip_id]})")
        seen[clip_id] = line_no
        if row["split"] not in SPLITS:
            raise CacheError(f"{location(path, line_no, clip_id)}: split must be one of "
                             f"{list(SPLITS)}, got {row['split']!r}")
        for key in ("n_visual", "n_audio"):
            value = row[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise CacheError(f"{location(path, line_no, clip_id)}: {key} must be an int "
                                 f">= 0, got {value!r}")
        for key in ("refs_av", "refs_v", "refs_a"):
            refs = row[key]
            if not isinstance(refs, list) or not all(isinstance(r, str) and r.strip()
                                                     for r in refs):
                raise CacheError(f"{location(path, line_no, clip_id)}: {key} must be a list "
                                 f"of non-empty strings, got {refs!r}")
        for key in ("info", "prompt"):
            if key in row and not isinstance(row[key], dict):
                raise CacheError(f"{location(path, line_no, clip_id)}: {key} must be an "
                                 f"object, got {row[key]!r}")
        shard = row["shard"]
        if not isinstance(shard, str) or Path(shard).is_absolute() or ".." in Path(shard).parts:
            raise CacheError(f"{location(path, line_no, clip_id)}: shard must be a path "
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
        # shard -> (its open safetensors handle, the set of its tensor names): the handle's
        # keys() builds a new list on every call, and a clip's lookups read it 4-6 times
        self._handles: OrderedDict[str, tuple] = OrderedDict()
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
        return location(self.root / MANIFEST_FILE, row["_line"], row["clip_id"])

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
        if file_sha256(path) != expected:
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
        opened = self._handles.get(shard)
        if opened is not None:
            self._handles.move_to_end(shard)
            return opened
        path = self._shard_path(row)
        if self.verify == "hash":
            self._check_hash(path, row)
        try:
            handle = safe_open(str(path), framework="pt", device="cpu")
        except Exception as err:  # safetensors raises its own error types
            raise CacheError(f"{path}: corrupted shard, safetensors cannot open it ({err}; "
                             f"named by {self._row_where(row)})") from None
        opened = self._handles[shard] = (handle, frozenset(handle.keys()))
        if len(self._handles) > self._max_open:
            self._handles.popitem(last=False)
        return opened

    def _tensor(self, opened: tuple, row: dict, name: str, *, optional: bool = False):
        handle, keys = opened
        key = f"{row['clip_id']}/{name}"
        if key not in keys:
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
            check_finite(tensor, where)
        except ValueError as err:
            raise CacheError(str(err) + "; the cache is corrupt, rebuild or re-export it") from None

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Clip:
        index = _clip_index(index, len(self.rows), "clip index")
        row = self.rows[index]
        opened = self._handle(row)
        visual = self._tensor(opened, row, "visual")
        audio = self._tensor(opened, row, "audio")
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
            ids = self._tensor(opened, row, f"prompt_{side}_ids", optional=True)
            embeds = None if ids is not None else \
                self._tensor(opened, row, f"prompt_{side}_embeds")
            if embeds is not None:
                self._check_features(embeds, row, f"prompt_{side}_embeds")
            prompt[side] = (None if ids is None else ids.to(torch.int64), embeds)
        annotations = {}
        for name, count_key in zip(ANNOTATION_KEYS, ("n_visual", "n_audio")):
            value = self._tensor(opened, row, name, optional=True)
            if value is not None:
                if value.dtype != torch.int8 or list(value.shape) != [row[count_key]]:
                    raise CacheError(f"{self._row_where(row)}: {name} in "
                                     f"{self.root / row['shard']} must be int8 "
                                     f"[{row[count_key]}], got {value.dtype} "
                                     f"{list(value.shape)}")
                annotations[name] = value
        merged = None
        if row.get("merged") is not None:
            positions = self._tensor(opened, row, "merged_position_ids", optional=True)
            merged = {"inputs_embeds": self._tensor(opened, row, "merged_embeds"),
                      "modality": self._tensor(opened, row, "merged_modality").to(torch.int64),
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
