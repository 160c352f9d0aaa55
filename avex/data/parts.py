"""The pieces of an export that are about folders, not models: the lock that keeps a second
export out of the same output, the temporary folders of runs that died, each process's part
of the cache, and the merge of the parts into the cache.

Layout beside the output ``out``::

    .<out>.export/            the partial export (kept until the cache is written)
        export.json             its identity: model weights, tokenizer, processor, settings
        clips/<clip>.safetensors  one file per exported clip, written atomically (resume unit)
        parts/rank-<r>/         process r's clips packed into cache shards (a cache of its own)
    .<out>.tmp-<pid>/         the cache being merged (renamed to out when complete)

The lock is an exclusive ``flock`` on the partial export's folder, held by the process that
merges (rank 0) from before anything is written until the folder is removed; the kernel drops
it when that process ends, however it ends, so no stale lock is ever left.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

from avex.data.cache import (FORMAT_NAME, FORMAT_VERSION, MANIFEST_FILE, META_FILE, SHARD_DIR,
                             SPLITS, install_cache)

__all__ = ["ExportLock", "remove_stale", "merge_parts", "partial_dir"]


def partial_dir(out: Path) -> Path:
    return out.parent / f".{out.name}.export"


class ExportLock:
    """An exclusive, non-blocking lock on ``folder`` (made if missing). ``acquire`` returns
    False at once when another process holds it."""

    def __init__(self, folder: Path):
        self.folder, self.fd = Path(folder), None

    def acquire(self) -> bool:
        while True:
            self.folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.folder, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            try:   # the folder may have been removed and made again while we waited
                same = os.stat(self.folder).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                return True
            os.close(fd)

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def remove_stale(out: Path) -> list[str]:
    """Remove what runs that died left beside ``out`` (their merge folders, half-written clip
    files, packed parts). Call only while holding the lock: no other export of ``out`` runs
    then, so every such folder is stale. Returns what was removed."""
    removed = []
    for pattern in (f".{out.name}.tmp-*", f".{out.name}.old-*"):
        for path in out.parent.glob(pattern):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    partial = partial_dir(out)
    for path in (partial / "clips").glob(".*.tmp-*"):
        path.unlink(missing_ok=True)
        removed.append(str(path))
    if (partial / "parts").exists():
        shutil.rmtree(partial / "parts")
        removed.append(str(partial / "parts"))
    return removed


def merge_parts(parts: list[Path], out: Path, order: list[str], *, source: dict,
                overwrite: bool) -> Path:
    """Merge the part caches ``parts`` (one per process, written by CacheWriter) into the
    cache ``out``: their shard files are moved, not copied, into a new cache whose manifest
    lists the clips in ``order`` (each split's rows together, as CacheWriter orders them)
    and whose meta.json records every shard's hash as its part did, and ``source``."""
    staging = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    (staging / SHARD_DIR).mkdir(parents=True)
    try:
        rows, shards, first = [], {}, None
        for index, part in enumerate(parts):
            meta = json.loads((part / META_FILE).read_text(encoding="utf-8"))
            first = first or meta
            for key in ("dim", "dtype", "n_frames", "tokenizer", "token_order"):
                if meta.get(key) != first.get(key):
                    raise ValueError(f"part {part} has {key} {meta.get(key)!r}, part "
                                     f"{parts[0]} {first.get(key)!r}; the parts can't merge")
            renamed = {}
            for shard, record in meta["shards"].items():
                name = f"{SHARD_DIR}/p{index:03d}-{Path(shard).name}"
                os.replace(part / shard, staging / name)
                renamed[shard], shards[name] = name, record
            for line in (part / MANIFEST_FILE).read_text(encoding="utf-8").splitlines():
                row = json.loads(line)
                row["shard"] = renamed[row["shard"]]
                rows.append(row)
        position = {clip: i for i, clip in enumerate(order)}
        missing = [r["clip_id"] for r in rows if r["clip_id"] not in position]
        if missing or len(rows) != len(order):
            raise ValueError(f"the parts hold {len(rows)} clips, the export {len(order)} "
                             f"(unknown: {missing[:5]})")
        split_order = {s: i for i, s in enumerate(SPLITS)}
        rows.sort(key=lambda r: (split_order[r["split"]], position[r["clip_id"]]))
        with open(staging / MANIFEST_FILE, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=True) + "\n")
        counts = {s: sum(r["split"] == s for r in rows) for s in SPLITS}
        meta = {**first, "format": FORMAT_NAME, "version": FORMAT_VERSION,
                "splits": {s: n for s, n in counts.items() if n},
                "shards": dict(sorted(shards.items())), "source": source}
        with open(staging / META_FILE, "w", encoding="utf-8") as handle:
            json.dump(meta, handle, indent=1, sort_keys=True)
            handle.write("\n")
        install_cache(staging, out, overwrite)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


