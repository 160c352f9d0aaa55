"""Token-selection baselines behind one interface.

Every method is a *selector* (the interface of :mod:`avex.evaluation`)::

    selector(batch, layout, retention) -> bool [B, M]            a keep-set on the AV axis
                                       | Selection(keep, inputs_embeds)

``batch`` is an :class:`avex.captioner.frozen.AVBatch`, ``layout`` its
:class:`avex.rollout.AVLayout`, ``retention`` rho in (0, 1]. Each row keeps exactly
K = ``layout.budget(retention)`` AV tokens; text is never on the AV axis, so it is never dropped.
A merging method (ToMe-AV) also returns replacement ``inputs_embeds`` [B, L, D]: the kept
positions then carry the merged embeddings (a merged token sits at its destination's position).

``make_selector(name, ...)`` builds one by name from :data:`METHODS`.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from avex import _checks


class Selection(NamedTuple):
    """A keep-set plus replacement embeddings (for methods that merge tokens)."""
    keep: torch.Tensor            # bool [B, M] on the AV axis
    inputs_embeds: torch.Tensor   # [B, L, D], the sequence to compact the kept positions from


def check_retention(retention) -> float:
    return _checks.ratio("retention", retention)


def topk_keep(scores: torch.Tensor, budget: torch.Tensor) -> torch.Tensor:
    """bool [B, M]: the ``budget[b]`` highest finite scores of each row (ties to the lower
    index). ``-inf`` marks padding and is never chosen."""
    keep = torch.zeros_like(scores, dtype=torch.bool)
    for row in range(scores.shape[0]):
        k = int(budget[row])
        if k <= 0:
            continue
        s = scores[row].double()
        # stable descending sort: ties keep their original (lower index first) order
        order = torch.sort(-s, stable=True).indices
        valid = order[torch.isfinite(s[order])]
        keep[row, valid[:k]] = True
    return keep


def split_budget(k: int, n_visual: int, n_audio: int) -> tuple[int, int]:
    """(K_v, K_a) with K_a = round(K Na / N), at least one token of a present modality when
    K >= 2, and K_v + K_a = K."""
    n = n_visual + n_audio
    ka = min(n_audio, int(k * n_audio / n + 0.5)) if n else 0
    if k >= 2 and n_audio and ka == 0:
        ka = 1
    if k >= 2 and n_visual and k - ka == 0:
        ka = k - 1
    kv = min(n_visual, k - ka)
    return kv, k - kv


from avex.baselines.random import random_selector  # noqa: E402
from avex.baselines.fastv import fastv_selector  # noqa: E402
from avex.baselines.tome import tome_selector  # noqa: E402
from avex.baselines.fastav import fastav_selector  # noqa: E402
from avex.baselines.policy import load_policy, policy_selector  # noqa: E402

#: method name -> (display label, what it needs)
METHODS = {
    "random": ("Random", ()),
    "fastv": ("FastV (AV ext.)", ("captioner",)),
    "tome": ("ToMe (AV ext.)", ()),
    "fastav": ("FastAV", ("captioner",)),
    "cacovid": ("CaCoVID (AV ext.)", ("policy",)),
    "avex": ("AVEX-Prune", ("policy",)),
}


def make_selector(name: str, *, captioner=None, policy=None, seed: int = 0, **options):
    """A selector for method ``name`` (one of :data:`METHODS`).

    ``captioner`` (a :class:`~avex.captioner.FrozenCaptioner`) is needed by FastV-AV and
    FastAV, ``policy`` (an :class:`~avex.policy.AVEXPolicy`) by CaCoVID-AV and AVEX-Prune;
    ``seed`` seeds Random; ``options`` go to the method's constructor."""
    if name not in METHODS:
        raise ValueError(f"method must be one of {sorted(METHODS)}, got {name!r}")
    needs = METHODS[name][1]
    if "captioner" in needs and captioner is None:
        raise ValueError(f"method {name!r} needs the frozen captioner (captioner=...)")
    if "policy" in needs and policy is None:
        raise ValueError(f"method {name!r} needs a trained policy (policy=...)")
    if name == "random":
        return random_selector(seed, **options)
    if name == "fastv":
        return fastv_selector(captioner, **options)
    if name == "tome":
        return tome_selector(captioner=captioner, **options)
    if name == "fastav":
        return fastav_selector(captioner, **options)
    return policy_selector(policy, **options)


__all__ = ["Selection", "METHODS", "make_selector", "random_selector", "fastv_selector",
           "tome_selector", "fastav_selector", "policy_selector", "load_policy", "topk_keep",
           "split_budget", "check_retention"]
