"""Set-aware selection: K picks in turn, each one discounting the tokens like those already
picked (issue #36 item 5).

A per-token Top-K spends a small budget on near-duplicates (one object seen in many frames).
Here the logit of token i at pick t is

    x_i^(t) = (s_i - beta * r_i^(t)) / tau,    r_i^(t) = max(0, max_{j in S_t} cos(h_i, h_j))

over the tokens not yet picked, where ``s`` are the policy's scores, ``h`` its per-token
hidden states (the input of its score head) and ``beta`` >= 0 the redundancy weight. With
``beta`` = 0 every logit is the score and the rule is the policy's plain Gumbel-Top-K /
Top-K (:func:`avex.kernels.gumbel_topk`), pick for pick.

* Sampling draws the K picks from the step-wise Plackett-Luce law above, exactly. One Gumbel
  key per token (the same noise, ``gumbel_noise(seed, ...)``, as ``gumbel_topk``); after a pick
  with key T, each remaining key is a Gumbel truncated at T, and a token whose logit moves by
  -d is carried to the Gumbel of its new logit truncated at the same T by its own CDF
  (:func:`avex.kernels.set_aware_ref.shift_truncated`). Truncation at a common level keeps
  the argmax softmax-distributed, so every pick follows its step's softmax; a token whose
  logit did not move keeps its key bit for bit, which is why ``beta`` = 0 reproduces
  ``gumbel_topk``'s sets.
* The log-probability is the exact step-wise sum of log-softmax over the remaining tokens,
  differentiable with respect to the scores, the hidden states and ``beta``.
* Inference (``sample=False``) is greedy: K argmax steps over the discounted logits, ties to
  the lower index; one policy call plus O(K M D) of dot products.
* The picks come from :mod:`avex.kernels.set_aware`: on a GPU one Triton launch for all K
  steps, elsewhere its PyTorch reference (``set_aware_ref.py``), which states them exactly.

Rows are ragged: ``budget[b]`` picks in row b, ``-inf`` scores (padding) are never picked.
"""
from __future__ import annotations

import torch

from avex import _checks
from avex.kernels import _checks as _key_checks
from avex.kernels.gumbel_topk import gumbel_topk
from avex.kernels.gumbel_topk_ref import compute_dtype, shifted_logits
from avex.kernels.set_aware import set_aware_picks_unchecked
from avex.kernels.set_aware_ref import similarity_to, unit_vectors

__all__ = ["SELECTIONS", "check_rule", "set_aware_indices", "set_aware_log_prob",
           "set_aware_select", "select_indices"]

#: the selection rules a policy can use (``PolicyConfig.selection``)
SELECTIONS = ("topk", "set-aware")


def check_rule(selection, redundancy) -> float:
    """A policy's selection rule as a setting names it: ``selection`` one of
    :data:`SELECTIONS`, ``redundancy`` a finite number >= 0, and 0 with ``"topk"`` (which has
    no use for it). Returns ``redundancy`` as a float."""
    _checks.choice("selection", selection, SELECTIONS)
    redundancy = _checks.real("redundancy", redundancy, low=0)
    if selection == "topk" and redundancy != 0:
        raise ValueError(f"redundancy = {redundancy!r} has no effect with selection 'topk'; "
                         "use selection 'set-aware' or redundancy 0")
    return redundancy


def _check(scores, hidden, budget, redundancy, tau) -> torch.Tensor:
    """Every argument of the public functions; returns ``budget`` as int64 [B]."""
    _checks.tensor("scores", scores, ndim=2, floating=True)
    _checks.tensor("hidden", hidden, ndim=3, floating=True)
    _checks.tensor("budget", budget, ndim=1, integer=True)
    _checks.same_device("hidden", hidden, "scores", scores)
    _checks.same_device("budget", budget, "scores", scores)
    tau = _checks.positive_float("tau", tau)
    if isinstance(redundancy, torch.Tensor):
        if redundancy.dim() != 0 or not redundancy.is_floating_point():
            raise ValueError(f"redundancy must be a number or a 0-D float tensor, got shape "
                             f"{list(redundancy.shape)} dtype {redundancy.dtype}")
        beta = float(redundancy.detach())
    else:
        beta = _checks.real("redundancy", redundancy)
    if not beta >= 0:
        raise ValueError(f"redundancy must be a finite number >= 0, got {beta}")
    if hidden.shape[:2] != scores.shape:
        raise ValueError(f"hidden must have shape {list(scores.shape)} + [D] (one vector per "
                         f"score), got {list(hidden.shape)}")
    if budget.shape[0] != scores.shape[0]:
        raise ValueError(f"budget has {budget.shape[0]} rows but scores has {scores.shape[0]}")
    if bool(torch.isnan(scores).any()) or bool(torch.isposinf(scores).any()):
        raise ValueError("scores must be finite or -inf (padding), got NaN or +inf")
    _key_checks.tau_for_keys(tau, scores)
    if bool(_key_checks.key_overflow(scores, scores > float("-inf"), tau, extra=beta)):
        raise _key_checks.key_range_error(scores, scores > float("-inf"), tau, extra=beta)
    _checks.finite("hidden", hidden)
    selectable = (scores > float("-inf")).sum(1)
    bad = (budget < 0) | (budget > selectable)
    if bool(bad.any()):
        row = int(torch.nonzero(bad)[0, 0])
        raise ValueError(f"budget[{row}] = {int(budget[row])} must lie in [0, "
                         f"{int(selectable[row])}] (row {row}'s tokens with a score > -inf)")
    return budget.to(torch.int64)


@torch.no_grad()
def set_aware_indices(scores: torch.Tensor, hidden: torch.Tensor, budget: torch.Tensor, *,
                      redundancy, tau: float = 1.0, seed: int = 0,
                      sample: bool = True, backend: str = "auto") -> torch.Tensor:
    """int64 [B, Kmax]: the picks in order, ``-1`` past each row's ``budget``. ``sample``:
    drawn from the step-wise Plackett-Luce law (noise a function of ``seed``); otherwise the
    greedy picks. ``backend``: ``"auto"`` (CUDA tensors: the Triton kernel of
    :mod:`avex.kernels.set_aware`, one launch for all K picks; otherwise the PyTorch
    reference beside it), ``"triton"`` or ``"torch"``."""
    budget = _check(scores, hidden, budget, redundancy, tau)
    _checks.flag("sample", sample)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 63:
        raise ValueError(f"seed must be an int in [0, 2**63), got {seed!r}")
    return set_aware_picks_unchecked(scores, hidden, budget, beta=float(redundancy), tau=tau,
                                     seed=seed, sample=sample, backend=backend)


def set_aware_log_prob(scores: torch.Tensor, hidden: torch.Tensor, indices: torch.Tensor,
                       budget: torch.Tensor, *, redundancy, tau: float = 1.0) -> torch.Tensor:
    """log pi(picks) [B] under the step-wise law: sum over t < budget[b] of
    x_{o_t}^(t) - logsumexp over the tokens not yet picked of x^(t). Differentiable with
    respect to ``scores``, ``hidden`` and ``redundancy`` (a tensor); float64 for float64
    scores, else float32 (computed in float64)."""
    budget = _check(scores, hidden, budget, redundancy, tau)
    _checks.tensor("indices", indices, ndim=2, integer=True)
    _checks.same_device("indices", indices, "scores", scores)
    kmax = int(budget.max()) if budget.numel() else 0
    if indices.shape[0] != scores.shape[0] or indices.shape[1] < kmax:
        raise ValueError(f"indices must have shape [{scores.shape[0]}, >= {kmax}] (each row's "
                         f"picks in order), got {list(indices.shape)}")
    picked = indices[:, :kmax]
    used = torch.arange(kmax, device=scores.device) < budget[:, None]
    outside = (picked < 0) | (picked >= scores.shape[1])
    taken = picked.masked_fill(outside, 0)
    if bool((used & outside).any()) or bool(
            (used & (scores.gather(1, taken) == float("-inf"))).any()):
        raise ValueError("indices must hold, in each row's first budget[b] places, positions of "
                         "tokens with a score > -inf")
    seen = torch.zeros(scores.shape[0], scores.shape[1] + 1, dtype=torch.int64,
                       device=scores.device)
    seen.scatter_add_(1, torch.where(used, picked, scores.shape[1]), torch.ones_like(picked))
    if bool((seen[:, :-1] > 1).any()):
        row = int(torch.nonzero((seen[:, :-1] > 1).any(1))[0, 0])
        raise ValueError(f"indices row {row} picks a token twice; picks are without replacement")
    return _log_prob(scores, hidden, picked, budget, redundancy, tau)


def _log_prob(scores, hidden, picked, budget, redundancy, tau):
    """Every step at once: [B, Kmax, M] logits instead of Kmax rounds of [B, M] ops (the
    autograd graph is a handful of nodes, not ~10 per pick). :func:`log_prob_stepwise` is the
    same sum, pick by pick: the reference the tests compare this with."""
    batch, width = scores.shape
    kmax = picked.shape[1]
    valid = scores > float("-inf")
    x = shifted_logits(scores, valid, tau, torch.float64)
    unit = unit_vectors(hidden, torch.float64)
    beta = redundancy.double() if isinstance(redundancy, torch.Tensor) else float(redundancy)
    steps = torch.arange(kmax, device=scores.device)
    active = steps < budget[:, None]                                        # [B, Kmax]
    pick = picked.clamp_min(0)
    # the step at which each token is picked (Kmax: not among a row's budget[b] picks); the
    # unused places scatter into a spare column
    order = torch.full((batch, width + 1), kmax, dtype=torch.int64, device=scores.device)
    order.scatter_(1, torch.where(active, pick, width), steps.expand(batch, -1).contiguous())
    remaining = valid[:, None, :] & (order[:, None, :width] >= steps[None, :, None])
    chosen = unit.gather(1, pick[..., None].expand(-1, -1, unit.shape[-1]))  # [B, Kmax, D]
    similarity = torch.bmm(chosen, unit.transpose(1, 2))                     # [B, Kmax, M]
    # redundancy before pick t: the running max over the picks before it (from 0), as a
    # chain of elementwise maxima, whose gradient at ties is the step-wise rule's
    chain = [similarity.new_zeros(batch, width)]
    for t in range(kmax - 1):
        chain.append(torch.maximum(chain[-1], similarity[:, t]))
    redundant = torch.stack(chain, 1)[:, :kmax]          # Kmax = 0: no steps
    logits = (x[:, None, :] - (beta / tau) * redundant).masked_fill(~remaining, float("-inf"))
    # a finished row (t >= its budget) may have nothing left: zeros keep its unused terms'
    # logsumexp, and so the gradient, finite
    logits = torch.where(active[..., None], logits, torch.zeros_like(logits))
    term = logits.gather(2, pick[..., None]).squeeze(2) - torch.logsumexp(logits, 2)
    total = torch.where(active, term, torch.zeros_like(term)).sum(1)
    return total.to(compute_dtype(scores.dtype))


def log_prob_stepwise(scores, hidden, picked, budget, redundancy, tau):
    """The reference of :func:`_log_prob` (checked arguments as it takes them): the sum of
    the definition, one pick at a time."""
    batch, width = scores.shape
    valid = scores > float("-inf")
    x = shifted_logits(scores, valid, tau, torch.float64)
    unit = unit_vectors(hidden, torch.float64)
    beta = redundancy.double() if isinstance(redundancy, torch.Tensor) else float(redundancy)
    remaining = valid.clone()
    redundant = x.new_zeros(batch, width)
    total = x.new_zeros(batch)
    for t in range(picked.shape[1]):
        active = t < budget
        pick = picked[:, t].clamp_min(0)
        logits = (x - (beta / tau) * redundant).masked_fill(~remaining, float("-inf"))
        # a finished row (t >= its budget) may have nothing left: zeros keep its unused
        # term's logsumexp, and so the gradient, finite
        logits = torch.where(active[:, None], logits, torch.zeros_like(logits))
        term = logits.gather(1, pick[:, None]).squeeze(1) - torch.logsumexp(logits, 1)
        total = total + torch.where(active, term, torch.zeros_like(term))
        remaining = remaining.scatter(1, pick[:, None], ~active[:, None] & remaining.gather(
            1, pick[:, None]))
        redundant = torch.maximum(redundant, similarity_to(unit, pick))
    return total.to(compute_dtype(scores.dtype))


def set_aware_select(scores: torch.Tensor, hidden: torch.Tensor, budget: torch.Tensor, *,
                     redundancy, tau: float = 1.0, seed: int = 0,
                     sample: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(picks int64 [B, Kmax], their log-probability [B]): :func:`set_aware_indices` then
    :func:`set_aware_log_prob`."""
    indices = set_aware_indices(scores, hidden, budget, redundancy=redundancy, tau=tau,
                                seed=seed, sample=sample)
    return indices, set_aware_log_prob(scores, hidden, indices, budget,
                                       redundancy=redundancy, tau=tau)


def select_indices(selection: str, scores: torch.Tensor, hidden: torch.Tensor | None,
                   budget: torch.Tensor, *, redundancy: float = 0.0, tau: float = 1.0,
                   seed: int = 0, sample: bool = False,
                   log_prob: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The picks of ``selection`` (one of :data:`SELECTIONS`) on AV-axis ``scores`` [B, M]
    (``hidden`` [B, M, D] for ``"set-aware"``), ``budget[b]`` >= 1 per row: ``"topk"`` is
    :func:`avex.kernels.gumbel_topk`. (indices [B, Kmax], log-probability [B] or None)."""
    _checks.choice("selection", selection, SELECTIONS)
    if selection == "topk":
        indices, logp = gumbel_topk(scores, budget, tau=tau, seed=seed, sample=sample,
                                    log_prob=log_prob)
        return indices, logp
    if hidden is None:
        raise ValueError("selection 'set-aware' needs the policy's hidden states (hidden=None)")
    if not log_prob:
        return set_aware_indices(scores, hidden, budget, redundancy=redundancy, tau=tau,
                                 seed=seed, sample=sample), None
    return set_aware_select(scores, hidden, budget, redundancy=redundancy, tau=tau, seed=seed,
                            sample=sample)
