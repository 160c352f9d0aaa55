"""The feature cache and frozen captioner a run uses: a path each, or the embedded ones, built
on first use. Training and evaluation both resolve their assets here."""
from __future__ import annotations

from pathlib import Path

from avex.captioner.train import ensure_captioner
from avex.data.embedded import ensure_benchmark
from avex.paths import default_captioner_path

__all__ = ["resolve_asset_paths"]


def resolve_asset_paths(data: str, captioner: str, *, benchmark_preset: str = "default",
                        captioner_preset: str = "default", cache_dir=None,
                        progress: bool = True) -> tuple[Path, Path]:
    """(feature cache, captioner directory) for ``data`` / ``captioner`` settings: "embedded"
    (built and trained first if missing) or a path."""
    if data == "embedded":
        data_path = ensure_benchmark(benchmark_preset, cache_dir=cache_dir, progress=progress)
    else:
        data_path = Path(data)
    if captioner != "embedded":
        return data_path, Path(captioner)
    if data != "embedded":
        raise ValueError("captioner='embedded' goes with data='embedded'; for your own feature "
                         "cache pass --captioner PATH to its Hugging Face causal LM")
    ensure_captioner(benchmark_preset, captioner_preset, cache_dir=cache_dir, progress=progress)
    return data_path, default_captioner_path(data_path.name, captioner_preset, cache_dir)
