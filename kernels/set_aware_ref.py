"""PyTorch reference for set-aware picks: K picks in turn, each discounting the tokens like
those already picked. The oracle in tests and the production CPU path; the Triton kernel in
``set_aware.py`` computes exactly this.

The logit of token i at pick t is (s_i - beta * r_i^(t)) / tau, with
r_i^(t) = max(0, max over the picks j so far of cos(h_i, h_j)) (``avex.set_selection`` states
the law and computes its log-probability). Here:

* keys: x = (s - max_valid(s)) / tau as ``gumbel_topk`` ranks them (float32 for float32
  scores), plus the same Gumbel noise ``gumbel_noise(seed, ...)`` when sampling, then cast to
  float64 (exactly) for the updates, -inf at padding;
* similarities in the hidden states' own precision (float32, or float64 for float64 hidden
  states): cos of the unit vectors;
* each step takes the argmax key (ties: the lower index), sets it to -inf, and lowers every
  other key by (beta / tau) times the growth of its redundancy. Greedy: subtract. Sampling:
  the remaining keys are Gumbels truncated at the pick's key T, and a key whose logit moves by
  -d is carried to the Gumbel of its new logit truncated at the same T by its own CDF
  (:func:`shift_truncated`), so every pick follows its step's softmax; a key whose logit did
  not move keeps its bits.

Arguments are assumed checked (``avex.set_selection``): ``budget`` int64 [B] with
0 <= budget[b] <= the row's tokens with a score > -inf.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .gumbel_topk_ref import gumbel_noise, shifted_logits

__all__ = ["set_aware_picks_ref", "initial_keys", "unit_vectors", "shift_truncated",
           "similarity_to"]


def initial_keys(scores: torch.Tensor, seed: int, sample: bool, tau: float) -> torch.Tensor:
    """float64 [B, M]: each token's first ranking key, -inf at padding."""
    batch, width = scores.shape
    valid = scores > float("-inf")
    # keys as gumbel_topk ranks them (float32 for float32 scores), then in float64 for the
    # updates: the cast is exact, so the order and the ties are gumbel_topk's
    base = shifted_logits(scores.detach(), valid, tau)
    if sample:
        base = base + gumbel_noise(seed, batch, width, scores.device).to(base.dtype)
    return base.double().masked_fill(~valid, float("-inf"))


def unit_vectors(hidden: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``hidden`` scaled to unit length, in ``dtype`` (default: float64 for float64 hidden
    states, else float32, the precision serving compares them in)."""
    if dtype is None:
        dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    return F.normalize(hidden.to(dtype), dim=-1, eps=1e-12)


def similarity_to(unit: torch.Tensor, pick: torch.Tensor) -> torch.Tensor:
    """cos(h_i, h_pick) [B, M] for one pick per row (``pick`` int64 [B], any valid index):
    one batched matrix-vector product, no [B, M, D] temporary."""
    chosen = unit.gather(1, pick[:, None, None].expand(-1, 1, unit.shape[-1]))  # [B, 1, D]
    return torch.bmm(unit, chosen.transpose(1, 2)).squeeze(-1)


def shift_truncated(key: torch.Tensor, shift: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """A Gumbel ``key`` of location mu, truncated at ``top``, carried by its CDF to location
    mu - ``shift`` truncated at the same ``top``:
    key' = key - shift - log((1 - a) + a e^-shift), a = e^(key - top) in (0, 1]."""
    gap = key - top                                        # <= 0
    log_rest = torch.log(-torch.expm1(gap))                # log(1 - a), -inf at the top
    return key - shift - torch.logaddexp(log_rest, gap - shift)


@torch.no_grad()
def set_aware_picks_ref(scores: torch.Tensor, hidden: torch.Tensor, budget: torch.Tensor,
                        beta: float, tau: float, seed: int, sample: bool) -> torch.Tensor:
    """int64 [B, Kmax]: the picks in order, ``-1`` past each row's ``budget``."""
    batch, width = scores.shape
    kmax = int(budget.max()) if batch else 0
    key = initial_keys(scores, seed, sample, tau)
    # the penalty's rounding in float32, ~1e-7 of beta, is far below any gap the picks could
    # turn on
    unit = unit_vectors(hidden.detach())
    redundant = torch.zeros(batch, width, dtype=torch.float64, device=scores.device)
    picks = torch.full((batch, kmax), -1, dtype=torch.int64, device=scores.device)
    rows = torch.arange(batch, device=scores.device)
    for t in range(kmax):
        active = t < budget
        pick = key.argmax(1)                               # ties: the lower index
        picks[:, t] = torch.where(active, pick, -1)
        top = key[rows, pick][:, None]
        key[rows, pick] = float("-inf")
        if beta == 0 or t + 1 == kmax:
            continue
        grown = torch.maximum(redundant, similarity_to(unit, pick).double())
        shift = (beta / tau) * (grown - redundant)
        redundant = grown
        if not sample:  # a key of -inf (picked, padding) stays -inf
            key = key - shift
            continue
        moved = (shift != 0) & (key > float("-inf")) & active[:, None]
        key = torch.where(moved, shift_truncated(key, shift, top), key)
    return picks
