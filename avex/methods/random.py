"""Random selection: K = round(rho N) AV tokens uniformly at random per clip, over the joint AV
span (no per-modality quota), reproducible from a seed and the clip id
(:func:`avex.selection.random_keep`, the one seeded draw every caller uses)."""
from __future__ import annotations

from avex import _checks
from avex.selection import random_keep


def random_selector(seed: int = 0):
    """K random AV tokens per clip from ``seed`` and the clip id."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")

    def select(batch, layout, retention):
        budget = layout.budget(_checks.ratio("retention", retention))
        keep = random_keep(batch.clip_ids, layout.counts, budget, seed,
                           width=layout.modality.shape[1])
        return keep.to(layout.modality.device)
    select.seed = seed
    return select
