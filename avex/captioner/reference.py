"""The reference captioners that ship with the package, so every machine judges with the same
weights.

Training the embedded captioner runs CPU-specific kernels (an AVX-512 machine and an AVX2 one
train different weights from the same data and seed: docs/results.md, "The judge"), so the
committed results are only reproducible with the captioner they were scored with. The captioners
of the embedded benchmarks the results use ship under ``avex/captioner/reference/<name>/``, with
the SHA-256 of every file, and of the benchmark they were trained on, in ``references.json``.

``ensure_captioner`` installs a shipped one into the cache instead of training it;
``FrozenCaptioner.load`` verifies an installed one against these hashes on every load; a user's
own cache still gets a captioner trained on it (``python -m avex.captioner train``).
"""
from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import torch

from .. import judge_identity
from ..judge_identity import (MANIFEST_FORMAT, benchmark_sha256, captioner_sha256,  # noqa: F401
                              committed_judge, file_sha256, references)
from ..paths import CAPTIONER_FILE

# where they ship, and their manifest of hashes: judge_identity.REFERENCE_DIR, .MANIFEST (the
# committed judge is read there)
__all__ = ["references", "reference_name", "committed_judge", "install_reference",
           "verify_reference", "write_reference"]


def reference_name(benchmark: str, preset: str = "default") -> str | None:
    """The shipped captioner for the embedded benchmark named ``benchmark`` and the captioner
    preset ``preset``, or None."""
    name = f"{benchmark}-{preset}"
    return name if name in references() else None


def verify_reference(path, name: str) -> None:
    """Raise if the captioner directory ``path`` does not hold exactly the shipped files of
    reference ``name`` (a modified or corrupt copy)."""
    record = references().get(name)
    if record is None:
        raise ValueError(f"{path}: avex_captioner.json names the reference captioner {name!r}, "
                         f"which this version of avex does not ship (it ships "
                         f"{sorted(references())})")
    path = Path(path)
    for relative, expected in record["files"].items():
        file = path / relative
        if not file.is_file():
            raise ValueError(f"{path}: reference captioner {name!r} lacks {relative}; delete "
                             f"{path} and it is reinstalled on the next run")
        got = file_sha256(file)
        if got != expected:
            raise ValueError(f"{file}: sha256 {got} differs from the shipped reference "
                             f"captioner {name!r} ({expected}): modified or corrupt; delete "
                             f"{path} and it is reinstalled on the next run")


def install_reference(name: str, out_dir, *, benchmark_path=None) -> Path:
    """Copy the shipped reference captioner ``name`` to ``out_dir`` (verified, then renamed into
    place). With ``benchmark_path``, warn when that benchmark is not the one the reference was
    trained and scored on (the judge then differs from the committed one)."""
    record = references()[name]
    verify_reference(judge_identity.REFERENCE_DIR / name, name)
    if benchmark_path is not None:
        got = benchmark_sha256(benchmark_path)
        # the benchmark as an earlier version built it is committed too (judge_identity.py says why)
        committed = committed_judge(record["benchmark"], name)
        if judge_identity.committed_benchmark(committed, got) is None:
            warnings.warn(f"{benchmark_path} has sha256 {got[:16]}..., not the "
                          f"{record['benchmark_sha256'][:16]}... the reference captioner "
                          f"{name!r} was trained on: figures will not match docs/results.md",
                          stacklevel=2)
    out_dir = Path(out_dir)
    staging = out_dir.parent / f".{out_dir.name}.tmp"
    if staging.exists():
        shutil.rmtree(staging)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(judge_identity.REFERENCE_DIR / name, staging)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    staging.rename(out_dir)
    return out_dir


def write_reference(captioner_dir, benchmark_dir, name: str | None = None) -> dict:
    """Add (or replace) a trained captioner as a shipped reference: copy its files under
    ``judge_identity.REFERENCE_DIR/<name>`` (``name``: the captioner directory's name), mark its
    avex_captioner.json as the reference (without the paths of the machine it was trained on),
    and record every file's sha256 and the benchmark's in references.json. For maintainers
    (``scripts/make_reference_captioner.py``); returns the new record."""
    captioner_dir, benchmark_dir = Path(captioner_dir), Path(benchmark_dir)
    name = name or captioner_dir.name
    info = json.loads((captioner_dir / CAPTIONER_FILE).read_text(encoding="utf-8"))
    info["benchmark"] = {"name": benchmark_dir.name,
                         "source": info.get("benchmark", {}).get("source")}
    info["reference"] = name
    target = judge_identity.REFERENCE_DIR / name
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(captioner_dir, target,
                    ignore=shutil.ignore_patterns(CAPTIONER_FILE, ".*", "__pycache__"))
    (target / CAPTIONER_FILE).write_text(json.dumps(info, indent=1) + "\n")
    files = sorted(p for p in target.rglob("*") if p.is_file())
    record = {"benchmark": benchmark_dir.name,
              "benchmark_sha256": benchmark_sha256(benchmark_dir),
              "captioner_sha256": captioner_sha256(target),
              "files": {p.relative_to(target).as_posix(): file_sha256(p) for p in files},
              "trained": {**{k: info.get("training", {}).get(k)
                             for k in ("device", "seconds", "val_cider", "seed", "steps")},
                          "torch": torch.__version__,
                          "cpu_capability": torch.backends.cpu.get_cpu_capability()}}
    data = {"format": MANIFEST_FORMAT, "version": 1, "captioners": references()}
    data["captioners"][name] = record
    data["captioners"] = dict(sorted(data["captioners"].items()))
    judge_identity.MANIFEST.write_text(json.dumps(data, indent=1) + "\n")
    return record
