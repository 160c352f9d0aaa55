"""PyTorch reference for Gumbel-Top-K sampling and the Plackett-Luce log-probability.

This is the oracle in tests and the production CPU path. The Triton kernels in
``gumbel_topk.py`` compute exactly this: the ranking keys in the same float32 arithmetic (so
both choose the same tokens), the log-probabilities here in float64 (the kernels reach the
same accuracy in float32 by carrying denominators as anchor + offset):

* x = (s - max_valid(s)) / tau. The row shift changes nothing mathematically; it keeps the
  terms near the top of the ranking small, where float32 is accurate for |s| ~ 1e4.
* valid = position < length and s > -inf. Only valid tokens can be chosen or enter a
  denominator.
* ranking key = x + Gumbel(seed, offset) (or x alone for deterministic Top-K), offset being
  the element's flat index row * M + col. Ties go to the lower index. Valid tokens rank above
  invalid ones whatever their key.
* log pi(S|x) = sum_t [x_{o_t} - L_t] with L_t = logsumexp of x over every valid token not among
  o_1..o_{t-1}, chosen or not. L comes from a reverse cumulative logsumexp, which stays
  finite where log(Z - cumsum) would cancel.

Arguments are assumed checked (see ``gumbel_topk.py``): ``k`` and ``lengths`` are int64
tensors [B], ``kmax = k.max()``.
"""
from __future__ import annotations

import torch

from .philox import uniform

_UNIFORM_FLOOR = 1e-20  # keeps -log(-log(u)) finite when Philox returns exactly 0


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """dtype of the ranking keys and of the returned log-probability."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def gumbel_noise(seed: int, batch: int, width: int, device=None) -> torch.Tensor:
    """Gumbel(0, 1) noise [batch, width], float32, a function of (seed, row * width + col)."""
    offsets = torch.arange(batch * width, dtype=torch.int64, device=device).view(batch, width)
    u = uniform(seed, offsets).clamp_min(_UNIFORM_FLOOR)
    return -torch.log(-torch.log(u))


def valid_mask(scores: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    cols = torch.arange(scores.shape[1], device=scores.device)
    return (cols < lengths[:, None]) & (scores > float("-inf"))


def shifted_logits(scores: torch.Tensor, valid: torch.Tensor, tau: float,
                   dtype: torch.dtype | None = None) -> torch.Tensor:
    """(s - row max over valid) / tau in ``dtype`` (default: the key dtype); -inf if not valid."""
    s = scores.to(dtype or compute_dtype(scores.dtype))
    neg_inf = torch.full_like(s, float("-inf"))
    row_max = torch.where(valid, s, neg_inf).amax(dim=1, keepdim=True).detach()
    row_max = torch.where(row_max > float("-inf"), row_max, torch.zeros_like(row_max))
    # Divided by a tensor, not the Python float: on CUDA, torch turns division by a host scalar
    # into multiplication by its reciprocal, which the kernel's correctly rounded division
    # (tl.div_rn) would not match bit for bit.
    return torch.where(valid, (s - row_max) / torch.full_like(s, tau), neg_inf)


def plackett_luce_log_prob_ref(scores: torch.Tensor, indices: torch.Tensor, k: torch.Tensor,
                               lengths: torch.Tensor, tau: float) -> torch.Tensor:
    """log pi(S|x) of the ordered selection ``indices[b, :k[b]]`` (the rest is -1 padding)."""
    batch, width = scores.shape
    valid = valid_mask(scores, lengths)
    x = shifted_logits(scores, valid, tau, torch.float64)
    chosen = torch.arange(indices.shape[1], device=scores.device) < k[:, None]
    safe_idx = indices.clamp_min(0)
    # Padding scatters into a spill column, so it can't overwrite a real choice of position 0.
    is_chosen = torch.zeros(batch, width + 1, dtype=torch.bool, device=scores.device)
    is_chosen.scatter_(1, torch.where(chosen, indices, width), True)
    is_chosen = is_chosen[:, :width]
    neg_inf = torch.full_like(x, float("-inf"))
    unchosen_lse = torch.logsumexp(torch.where(is_chosen, neg_inf, x), dim=1, keepdim=True)
    x_chosen = torch.where(chosen, x.gather(1, safe_idx), neg_inf[:, :1])
    tail_lse = torch.logcumsumexp(x_chosen.flip(1), dim=1).flip(1)  # over o_t..o_K
    denominators = torch.logaddexp(tail_lse, unchosen_lse)
    terms = torch.where(chosen, x_chosen - denominators, torch.zeros_like(x_chosen))
    return terms.sum(dim=1).to(compute_dtype(scores.dtype))


def gumbel_topk_ref(scores: torch.Tensor, k: torch.Tensor, kmax: int, lengths: torch.Tensor,
                    tau: float, seed: int, sample: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices [B, kmax] in sampled order (-1 past each row's k) and log pi(S|x) [B]."""
    indices = gumbel_topk_indices_ref(scores, k, kmax, lengths, tau, seed, sample)
    return indices, plackett_luce_log_prob_ref(scores, indices, k, lengths, tau)


def gumbel_topk_indices_ref(scores: torch.Tensor, k: torch.Tensor, kmax: int,
                            lengths: torch.Tensor, tau: float, seed: int,
                            sample: bool) -> torch.Tensor:
    """The indices of :func:`gumbel_topk_ref` alone: the ranking rules, no log-probability."""
    batch, width = scores.shape
    valid = valid_mask(scores, lengths)
    x = shifted_logits(scores, valid, tau)
    key = x.detach()
    if sample:
        key = key + gumbel_noise(seed, batch, width, scores.device).to(key.dtype)
    key = torch.where(key == 0, torch.zeros_like(key), key)  # -0.0 ties with +0.0
    order = torch.sort(key, dim=1, descending=True, stable=True).indices
    valid_first = torch.sort(valid.gather(1, order).to(torch.int8), dim=1, descending=True,
                             stable=True).indices
    order = order.gather(1, valid_first)[:, :kmax]
    chosen = torch.arange(kmax, device=scores.device) < k[:, None]
    return torch.where(chosen, order, torch.full_like(order, -1))


def plackett_luce_log_prob_stepwise(scores: torch.Tensor, indices: torch.Tensor, k: torch.Tensor,
                                    lengths: torch.Tensor, tau: float) -> torch.Tensor:
    """The textbook loop: one logsumexp over the not-yet-chosen tokens per step.

    O(K * M) and slow; an independent check on the reference and the naive baseline in
    the benchmarks.
    """
    valid = valid_mask(scores, lengths)
    x = torch.where(valid, scores.to(compute_dtype(scores.dtype)) / tau,
                    torch.tensor(float("-inf"), dtype=compute_dtype(scores.dtype),
                                 device=scores.device))
    remaining = valid.clone()
    total = torch.zeros(scores.shape[0], dtype=x.dtype, device=scores.device)
    for t in range(indices.shape[1]):
        active = t < k
        pick = indices[:, t].clamp_min(0)
        lse = torch.logsumexp(x.masked_fill(~remaining, float("-inf")), dim=1)
        term = x.gather(1, pick[:, None]).squeeze(1) - lse
        total = total + torch.where(active, term, torch.zeros_like(term))
        remaining = remaining.scatter(1, pick[:, None], ~active[:, None] & remaining.gather(
            1, pick[:, None]))
    return total


def gumbel_topk_stepwise(scores: torch.Tensor, k: torch.Tensor, kmax: int, lengths: torch.Tensor,
                         tau: float, seed: int, sample: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Gumbel-Top-K as K rounds of argmax, then the stepwise log-probability (naive baseline)."""
    batch, width = scores.shape
    valid = valid_mask(scores, lengths)
    key = scores.detach().to(compute_dtype(scores.dtype)) / tau
    if sample:
        key = key + gumbel_noise(seed, batch, width, scores.device).to(key.dtype)
    key = key.masked_fill(~valid, float("-inf"))
    picks = []
    for t in range(kmax):
        pick = key.argmax(dim=1)
        picks.append(torch.where(t < k, pick, torch.full_like(pick, -1)))
        key = key.scatter(1, pick[:, None], float("-inf"))
    indices = torch.stack(picks, dim=1)
    return indices, plackett_luce_log_prob_stepwise(scores, indices, k, lengths, tau)
