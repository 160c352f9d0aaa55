"""Learned selectors: AVEX-Prune (the trained policy) and CaCoVID-AV.

Both score every AV token with an :class:`avex.policy.AVEXPolicy` and keep the deterministic
Top-K (``gumbel_topk(..., sample=False)``) over the joint AV span, at original positions; a
policy trained with set-aware selection (``config.selection``, :mod:`avex.set_selection`)
keeps its greedy set-aware picks instead.

CaCoVID-AV is CaCoVID's recipe (an RL policy trained with one set-level caption reward for
the sampled keep-set) on audio + visual tokens: the same policy network, warmup and budget as
AVEX-Prune, trained with ``python -m avex.train --no-exchanges`` (set-level REINFORCE, no token
exchanges). Deviation from CaCoVID: its own scorer architecture and video-only token pool are
replaced by the AVEX policy over both modalities, so the two learned rows differ only in the
training signal.
"""
from __future__ import annotations

import torch

from avex import _checks
from avex.kernels import gumbel_topk
from avex.pruning.inputs import expand_av_keep
from avex.selection import Selection, indices_to_keep


#: the RL estimators' names in a recipe (TrainConfig.rl_estimator)
_ESTIMATORS = {"rloo": "RLOO", "group": "group-normalised advantage",
               "paper": "the paper's L_RL"}


def recipe(cfg: dict) -> str:
    """What a training run's settings (its config.json, as ``read_run_config`` gives them)
    train, in words for a table's row: e.g. "RLOO over 8 anchors, no exchange term"."""
    if cfg.get("warmup_only"):
        return "warmup only"
    estimator = cfg.get("rl_estimator", "rloo")
    rl = (f"{_ESTIMATORS.get(estimator, estimator)} over {cfg.get('anchors')} anchors"
          if cfg.get("rl", True) else "no L_RL")
    if not cfg.get("exchanges"):
        words = f"{rl}, no exchange term"
    else:
        groups = " (random groups)" if cfg.get("exchange_selection") == "random" else ""
        words = f"{rl} + exchange term{groups}, lambda_ex {cfg.get('lambda_ex'):g}"
    if cfg.get("lambda_pairs"):
        words += f" + anchor-pair exchanges, lambda {cfg['lambda_pairs']:g}"
    # runs from before the reward and selection settings: CIDEr and Top-K
    if cfg.get("reward", "cider") != "cider":
        words += f", {cfg['reward']} reward"
    if cfg.get("selection", "topk") == "set-aware":
        words += f", set-aware selection (redundancy {cfg.get('redundancy'):g})"
    if cfg.get("merge_threshold") is not None:
        words += f", dropped tokens merged from cosine {cfg['merge_threshold']:g}"
    # runs from before the teacher setting imitated the prompt's attention
    if cfg.get("warmup_teacher", "prompt-attention") != "prompt-attention":
        words += f", {cfg['warmup_teacher']} warmup"
    return words


def policy_selector(policy):
    """The inference path: deterministic Top-K of ``policy``'s scores, or its greedy set-aware
    selection where the policy was trained with it (``policy.config.selection``); with the
    dropped tokens merged into the kept ones where the policy says so
    (``policy.config.merge_threshold``: a :class:`~avex.selection.Selection`)."""
    @torch.no_grad()
    def select(batch, layout, retention):
        budget = layout.budget(_checks.ratio("retention", retention))
        if policy.set_aware:
            scores, hidden = policy.score(batch.inputs_embeds, batch.modality,
                                          retention=retention, with_hidden=True)
            idx, _ = policy.select(layout.gather(scores), layout.gather_vectors(hidden), budget)
        else:
            scores = layout.gather(policy.score(batch.inputs_embeds, batch.modality,
                                                retention=retention))
            idx, _ = gumbel_topk(scores, budget, sample=False)
        keep = indices_to_keep(idx, layout.positions.shape[1])
        if policy.config.merge_threshold is None:
            return keep
        return Selection(keep, policy.merge(batch.inputs_embeds, batch.modality,
                                            expand_av_keep(keep, batch.modality)))
    return select

