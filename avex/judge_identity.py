"""The judge's identity: the SHA-256 of the benchmark (a feature cache) and of the frozen
captioner's weights that scored a result.

Every results file records both (:func:`judge_record`), and ``python -m avex.evaluate`` warns
when an embedded benchmark or its captioner differs from the one the committed results used
(:func:`judge_warnings`; the committed hashes ship with the reference captioners in
``avex/captioner/reference/references.json``).

A benchmark can have grown without changing its judge: the default preset's val and test splits
went from 200 to 1000 clips (issue #33), and clips are seeded by (seed, split, index), so the
first 200 of each and the whole train split, on which the captioner was trained, are the same
bytes. A reference's record then keeps the hash of the benchmark as it was in
``earlier_benchmarks``, and a results file scored on that earlier benchmark is recognised as
committed too (``committed_benchmark``: "current" or "earlier").

* The benchmark's hash covers what a clip is made of: ``manifest.jsonl`` (ids, splits,
  references) and every shard file (features, prompt ids), in path order. ``meta.json`` and the
  tokenizer files are left out: they describe the cache and are written by libraries whose
  formatting changes between versions.
* The captioner's hash covers its weight files (every ``*.safetensors`` in its directory: the
  LM and the AV projector), in name order. Weights are what differs when the same captioner is
  trained on two machines.
"""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

from avex.paths import cache_relative

__all__ = ["file_sha256", "benchmark_sha256", "captioner_sha256", "references",
           "committed_judge", "committed_benchmark", "judge_record", "judge_warnings",
           "judge_line"]

#: the shipped reference captioners (avex.captioner.reference) and their manifest
REFERENCE_DIR = Path(__file__).resolve().parent / "captioner" / "reference"
MANIFEST = REFERENCE_DIR / "references.json"
MANIFEST_FORMAT = "avex-reference-captioners"

_CHUNK = 1 << 22


def file_sha256(path) -> str:
    stat = Path(path).stat()
    return _file_sha256(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4096)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    """Memoised by size and modification time: a run hashes a large model's weights once."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _combined(root: Path, files: list[Path]) -> str:
    """One digest over ``relative path, file digest`` lines: independent of how the files were
    read, and a renamed file changes it."""
    lines = [f"{f.relative_to(root).as_posix()} {file_sha256(f)}\n" for f in files]
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def benchmark_sha256(path) -> str:
    """SHA-256 of a feature cache: its ``manifest.jsonl`` and every shard file."""
    root = Path(path)
    manifest = root / "manifest.jsonl"
    if not manifest.is_file():
        raise FileNotFoundError(f"{root}: no manifest.jsonl (not a feature cache)")
    shards = sorted((root / "shards").glob("*.safetensors")) if (root / "shards").is_dir() else []
    return _combined(root, [manifest, *shards])


WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth")


def captioner_sha256(path) -> str | None:
    """SHA-256 of a captioner directory's weights: every ``*.safetensors`` (or ``*.bin``,
    ``*.pt``, ``*.pth``) file in it; None where it has none (a model loaded by name)."""
    root = Path(path)
    weights = sorted({f for pattern in WEIGHT_PATTERNS for f in root.glob(pattern)})
    return _combined(root, weights) if weights else None


def references() -> dict:
    """Captioner directory name (``<benchmark>-<preset>``) -> its record in references.json:
    ``benchmark``, ``benchmark_sha256`` (the benchmark as this version builds it),
    ``earlier_benchmarks`` (optional: the same benchmark as earlier versions built it, each
    ``{"sha256", "splits", "note"}``), ``captioner_sha256``, ``files`` (relative path ->
    sha256) and ``trained`` (where and how it was trained)."""
    if not MANIFEST.is_file():
        return {}
    data = json.loads(MANIFEST.read_text(encoding="utf-8"))
    if data.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{MANIFEST}: 'format' must be {MANIFEST_FORMAT!r}, "
                         f"got {data.get('format')!r}")
    return data["captioners"]


def committed_judge(benchmark: str, captioner: str | None = None) -> dict | None:
    """{"benchmark_sha256", "earlier_benchmark_sha256", "captioner_sha256"} the committed
    results of the embedded benchmark ``benchmark`` were scored with (the earlier hashes: a
    list, possibly empty, of the same benchmark as earlier versions built it): by the shipped
    captioner named ``captioner`` (a captioner directory's name, ``<benchmark>-<preset>``)
    where there is one, else by the benchmark's default captioner; None where nothing was
    committed."""
    shipped = references()
    record = shipped.get(captioner) if captioner in shipped else shipped.get(f"{benchmark}-default")
    if record is None or record["benchmark"] != benchmark:
        return None
    return {"benchmark_sha256": record["benchmark_sha256"],
            "earlier_benchmark_sha256": [e["sha256"] for e in
                                         record.get("earlier_benchmarks", [])],
            "captioner_sha256": record["captioner_sha256"]}


def committed_benchmark(committed: dict, sha256: str) -> str | None:
    """Which committed benchmark ``sha256`` is, given ``committed`` (:func:`committed_judge`):
    "current" (as this version builds it), "earlier" (as an earlier version built it; results
    scored on it are committed ones too), or None."""
    if sha256 == committed["benchmark_sha256"]:
        return "current"
    return "earlier" if sha256 in committed["earlier_benchmark_sha256"] else None


def judge_record(data_path, captioner_path, *, cache_dir=None) -> dict:
    """What a results file records about its judge: the paths (relative to the cache root,
    ``cache_dir`` or the default one: no machine's absolute path) and SHA-256 of the benchmark
    and of the captioner, and for an embedded benchmark whether they are the committed ones
    (``matches_committed``: True, False, or None where nothing was committed for it;
    ``committed_benchmark``: "current", "earlier" or None, :func:`committed_benchmark`)."""
    data_path, captioner_path = Path(data_path), Path(captioner_path)
    record = {"benchmark": {"name": data_path.name,
                            "path": cache_relative(data_path, cache_dir),
                            "sha256": benchmark_sha256(data_path)},
              "captioner": {"path": cache_relative(captioner_path, cache_dir),
                            "sha256": captioner_sha256(captioner_path)}}
    committed = committed_judge(data_path.name, captioner_path.name)
    version = None if committed is None else \
        committed_benchmark(committed, record["benchmark"]["sha256"])
    record["matches_committed"] = None if committed is None else (
        version is not None and committed["captioner_sha256"] == record["captioner"]["sha256"])
    record["committed_benchmark"] = version
    return record


def judge_warnings(record: dict) -> list[str]:
    """Why ``record`` (:func:`judge_record`) is not the judge the committed results used:
    one sentence per differing part, none when it is (or when nothing was committed for it)."""
    committed = committed_judge(record["benchmark"]["name"],
                                Path(record["captioner"]["path"]).name)
    if committed is None:
        return []
    out = []
    for part, key in (("benchmark", "benchmark_sha256"), ("captioner", "captioner_sha256")):
        got = record[part]["sha256"]
        known = committed_benchmark(committed, got) is not None if part == "benchmark" \
            else got == committed[key]
        if not known:
            earlier = "".join(f" (or the earlier {e[:16]}...)"
                              for e in committed["earlier_benchmark_sha256"]) \
                if part == "benchmark" else ""
            out.append(f"the {part} at {record[part]['path']} has sha256 {got[:16]}..., not the "
                       f"committed {committed[key][:16]}...{earlier} of "
                       f"{record['benchmark']['name']}: figures will not match docs/results.md")
    return out


def judge_line(record: dict) -> str:
    """One Markdown line naming the judge, for the top of a results table."""
    verdict = {True: "the committed judge", False: "NOT the committed judge",
               None: "no committed judge for this benchmark"}[record.get("matches_committed")]
    if record.get("matches_committed") and record.get("committed_benchmark") == "earlier":
        verdict += ", on the benchmark as an earlier version built it"
    return (f"Judge: benchmark `{record['benchmark']['name']}` sha256 "
            f"`{record['benchmark']['sha256'][:16]}`, captioner sha256 "
            f"`{(record['captioner']['sha256'] or 'none')[:16]}` ({verdict}).")


