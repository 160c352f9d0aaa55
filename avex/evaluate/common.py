"""What every experiment of ``python -m avex.evaluate`` shares: assets, splits, trained policies
and number formatting."""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from avex.assets import load_cache_and_captioner, resolve_asset_paths
from avex.config import TrainConfig, build_parser, resolve_config
from avex.judge import judge_record, judge_warnings


def load_assets(args):
    """(feature cache, frozen captioner) for ``args.data`` / ``args.captioner``."""
    data_path, captioner_path = resolve_asset_paths(
        args.data, args.captioner, benchmark_preset=args.benchmark_preset,
        captioner_preset=args.captioner_preset, cache_dir=args.cache_dir,
        progress=args.progress)
    device = None if args.device == "auto" else args.device
    for problem in judge_warnings(judge_record(data_path, captioner_path)):
        warnings.warn(f"the judge differs from the committed one: {problem}", stacklevel=2)
    return load_cache_and_captioner(data_path, captioner_path, device=device)


def split_clips(cache, split: str, max_clips):
    if split not in {r["split"] for r in cache.rows}:
        raise ValueError(f"split {split!r} is not in the cache (has "
                         f"{sorted({r['split'] for r in cache.rows})})")
    clips = cache.split(split)
    n = len(clips) if max_clips is None else min(len(clips), max_clips)
    # a flipped bit in a shard passes the header checks: hash what is read (once per cache)
    print(f"{split}: {cache.verify_shards(clips.indices[:n])}")
    return [clips[i] for i in range(n)]


def base_train_config(args) -> TrainConfig:
    """The training settings an experiment starts from: the default ``python -m avex.train``
    run on the same data and captioner, plus ``--train-args``, without its own evaluation."""
    parser = build_parser("--train-args", "training settings")
    flags = parser.parse_args(args.train_args.split())
    cfg = resolve_config(flags)
    return dataclasses.replace(cfg, data=args.data, captioner=args.captioner,
                               benchmark_preset=args.benchmark_preset,
                               captioner_preset=args.captioner_preset,
                               cache_dir=None if args.cache_dir is None else str(args.cache_dir),
                               progress=args.progress and cfg.progress, evaluate=False)


def fmt(values, digits=1):
    """One value, or mean ± std of several; "n/a" for none."""
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{np.mean(values):.{digits}f} ± {np.std(values):.{digits}f}"


def percent(share) -> str:
    return "n/a" if share is None else f"{100 * share:.0f}%"
