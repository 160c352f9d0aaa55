"""Random selection: K = round(rho N) AV tokens uniformly at random per clip, over the joint AV
span (no per-modality quota), reproducible from a seed and the clip id (crc32, so the same in
every process). The selector itself lives in :mod:`avex.evaluation` (the training loop uses it);
this module is its place in the baseline registry."""
from __future__ import annotations

from avex.evaluation import random_selector as _random_selector


def random_selector(seed: int = 0):
    """K random AV tokens per clip from ``seed`` and the clip id."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    inner = _random_selector(seed)

    def select(batch, layout, retention):
        from avex.baselines import check_retention
        return inner(batch, layout, check_retention(retention))
    select.seed = seed
    return select
