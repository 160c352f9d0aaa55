"""The feature cache and frozen captioner a run uses: a path each, or the embedded ones, built
on first use. Training and evaluation both resolve and load their assets here."""
from __future__ import annotations

from pathlib import Path

from avex.captioner import FrozenCaptioner
from avex.captioner.pairing import check_captioner_benchmark
from avex.captioner.train import ensure_captioner
from avex.data import FeatureCache
from avex.data.embedded import default_benchmark_path, ensure_benchmark
from avex.data.identity import tokenizer_record
from avex.paths import default_captioner_path

__all__ = ["resolve_asset_paths", "load_cache_and_captioner", "reference_sample",
           "check_tokenizer", "check_captioner_benchmark", "asset_names",
           "embedded_captioner_path"]

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
    return data_path, embedded_captioner_path(benchmark_preset, captioner_preset, cache_dir)


def embedded_captioner_path(benchmark_preset: str = "default",
                            captioner_preset: str = "default", cache_dir=None) -> Path:
    """Where the embedded captioner of these presets lives (built there or not)."""
    benchmark = default_benchmark_path(benchmark_preset, cache_dir).name
    return default_captioner_path(benchmark, captioner_preset, cache_dir)


def load_cache_and_captioner(data_path, captioner_path, *, device=None, progress: bool = True):
    """(feature cache, frozen captioner) at these paths; the captioner's tokenizer must
    round-trip a sample of the cache's references (:func:`reference_sample`) and, where the
    cache records the tokenizer its clips were exported with, be that tokenizer
    (:func:`check_tokenizer`)."""
    cache = FeatureCache(data_path)
    check_captioner_benchmark(cache.meta.source, captioner_path, cache.root)
    captioner = FrozenCaptioner.load(captioner_path, device=device,
                                     references=reference_sample(cache), progress=progress)
    check_tokenizer(cache, captioner, captioner_path)
    return cache, captioner


def check_tokenizer(cache, captioner, captioner_path) -> None:
    """An exported cache records its model's tokenizer (``meta.json`` source.tokenizer: its
    class and the hash of what it maps, :func:`avex.data.identity.tokenizer_sha256`); a
    captioner whose tokenizer hashes otherwise would be rewarded against references it reads
    with other ids (the issue's run that ended with rewards of 0-60), so it is refused."""
    recorded = cache.meta.source.get("tokenizer")
    if not isinstance(recorded, dict) or "sha256" not in recorded:
        return
    mine = tokenizer_record(captioner.tokenizer)
    if mine["sha256"] != recorded["sha256"]:
        raise ValueError(
            f"the captioner's tokenizer is not the one the cache was exported with: the cache "
            f"{cache.root} records {recorded.get('class')} sha256 {recorded['sha256'][:16]}... "
            f"(meta.json source.tokenizer), the captioner {captioner_path} has "
            f"{mine['class']} sha256 {mine['sha256'][:16]}... (read from its tokenizer/ "
            "sub-folder when it has one, else its folder). Their ids differ, so the captions "
            "would be scored against references read otherwise; train with the model the cache "
            "was exported from, or save that model's tokenizer in the captioner's tokenizer/")


def asset_names(settings: dict) -> tuple[str, str]:
    """(benchmark, captioner): the folder names of the feature cache and the captioner that a
    run's settings (its config.json, or TrainConfig.to_dict()) name, the embedded ones by their
    presets. Names, not paths: a cache or captioner that only moved keeps its name."""
    data = settings.get("data", "embedded")
    benchmark = default_benchmark_path(settings.get("benchmark_preset", "default")).name \
        if data == "embedded" else Path(str(data)).name
    captioner = settings.get("captioner", "embedded")
    captioner = f"{benchmark}-{settings.get('captioner_preset', 'default')}" \
        if captioner == "embedded" else Path(str(captioner)).name
    return benchmark, captioner


def reference_sample(cache, count: int = 32) -> list[str]:
    """Reference captions spread over the cache (the manifest's; no tensor is read), for the
    captioner's tokenizer round-trip check; none from clips without references."""
    rows = cache.rows[::max(1, len(cache.rows) // count)]
    return [row["refs_av"][0] for row in rows if row["refs_av"]][:count]
