"""Gumbel-Top-K sampling with the Plackett-Luce log-probability, fused in Triton.

Reads top to bottom: the public functions and their argument checks, the Triton kernels
(one program per row: sort once, one reverse logsumexp scan), the host launchers, and the
``autograd.Function`` whose backward is one fused kernel. The PyTorch reference beside this
file (``gumbel_topk_ref.py``) states the exact semantics; the kernels reproduce it.

Precision: with |s| ~ 1e4 and tau = 0.05 the logits reach 4e5, where a float32 ulp is 0.03,
so a denominator L_t must never be held as one absolute number, nor built from rounded logits.
Scans carry it as (anchor a, offset r) with L = a / tau + r, a the largest raw score of the
group and 0 <= r <= log(n); a term is then (s_{o_t} - a_t) / tau - r_t, and differences of
nearby float32 scores are exact.

Gradient of log pi = sum_t [x_{o_t} - L_t] with respect to x = s / tau, with
A_p = log sum_{t<=p} exp(-L_t) (a second pair scan, over -L):

    d/dx_j = [j = o_p] - exp(x_j + A_{p_j}),   p_j = rank of j if chosen, else K - 1.

x_j + A_p <= log(K) always, so nothing overflows.
"""
from __future__ import annotations

import math

import numpy
import torch

from . import _checks
from ._utils import (ROW_KERNEL_MAX_WIDTH, first_true, next_power_of_2,
                     ranked_row_launch_config, resolve_row_backend)
from .cuda_lib import TOPK_MAX_WIDTH as CUDA_TOPK_MAX_WIDTH
from .cuda_lib import load as load_cuda_library
from .gumbel_topk_ref import (compute_dtype, gumbel_topk_indices_ref, gumbel_topk_ref,
                              plackett_luce_log_prob_ref)

try:
    import triton
    import triton.language as tl
except ImportError:  # the PyTorch reference still works
    triton = None

try:  # the inference tie check in C (gumbel_topk_host.c); optional, NumPy does the same
    from . import _gumbel_topk_host
except ImportError:
    _gumbel_topk_host = None

__all__ = ["gumbel_topk", "plackett_luce_log_prob"]

MAX_TRITON_WIDTH = ROW_KERNEL_MAX_WIDTH  # wider rows: the reference (or backend="cuda")


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------

def gumbel_topk(scores: torch.Tensor, k, *, tau: float = 1.0, lengths=None, seed=None,
                sample: bool = True, backend: str = "auto", log_prob: bool | None = None):
    """Sample K tokens per row without replacement (Gumbel-Top-K) and score the sample.

    Args:
        scores: [B, M] float logits. ``-inf`` marks a token that can't be chosen (padding).
        k: tokens to keep, an int or an integer tensor [B] (each row its own K).
        tau: temperature; the policy is Plackett-Luce over ``scores / tau``.
        lengths: optional integer tensor [B]; row b uses positions ``[0, lengths[b])``.
        seed: int; the noise is a function of ``(seed, b * M + m)``. ``None`` draws one from
            torch's global generator, so ``torch.manual_seed`` makes runs repeatable.
        sample: ``False`` gives deterministic Top-K (the inference path).
        backend: ``"auto"`` (CUDA -> Triton, CPU -> PyTorch), ``"triton"``, ``"torch"``, or
            ``"cuda"``: the CUDA C++ library picks the tokens (``sample=False`` only) and the
            log-probability comes from ``plackett_luce_log_prob``.
        log_prob: whether to compute the second output. ``None`` (default): yes, except on the
            inference path, ``sample=False`` with no gradient wanted (grad mode off, or
            ``scores`` not requiring grad), which returns ``None`` in its place and skips
            the log-probability (on a CPU: ``torch.topk`` plus one check, same ranking and
            ties). ``True``: always; ``False``: never.

    Returns:
        indices: int64 [B, Kmax], chosen tokens in sampled order, ``-1`` past a row's K.
        log_prob: [B] log pi(S|x), differentiable w.r.t. ``scores``; float32 (float64 for
            float64 scores); ``None`` where not computed (see ``log_prob``).
    """
    _checks.flag("sample", sample)
    if log_prob is None:
        log_prob = bool(sample) or (torch.is_grad_enabled()
                                    and getattr(scores, "requires_grad", False))
    elif not isinstance(log_prob, bool):
        raise TypeError(f"log_prob must be None, True or False, got {log_prob!r}")
    if not sample and not log_prob and lengths is None:
        indices = _topk_inference(scores, k, tau, backend)
        if indices is not None:
            return indices, None
    scores, k_rows, kmax, lengths = _check_common(scores, k, lengths, tau)
    seed = _check_seed(seed) if sample else 0
    path = resolve_row_backend(backend, scores, op="gumbel_topk", max_width=MAX_TRITON_WIDTH,
                               cuda_max_width=CUDA_TOPK_MAX_WIDTH)
    if path == "torch":
        if not log_prob:
            return gumbel_topk_indices_ref(scores, k_rows, kmax, lengths, tau, seed,
                                           bool(sample)), None
        return gumbel_topk_ref(scores, k_rows, kmax, lengths, tau, seed, bool(sample))
    if path == "cuda":
        if sample:
            raise ValueError("gumbel_topk: backend='cuda' is deterministic Top-K only; pass "
                             "sample=False, or use backend='triton' to sample")
        indices = load_cuda_library().topk_rows(scores.float(), k_rows, kmax, lengths, tau)
        return indices, (plackett_luce_log_prob(scores, indices, tau=tau, lengths=lengths)
                         if log_prob else None)
    indices, logp = _GumbelTopK.apply(scores, k_rows, kmax, lengths, float(tau), seed,
                                      bool(sample))
    return indices, logp if log_prob else None


def _topk_inference(scores, k, tau, backend):
    """Deterministic Top-K without the log-probability, for rows without ``lengths``.

    ``torch.topk`` takes the K + 1 largest scores (NaN ranks first); their ranking keys,
    (s - row max) / tau as the reference computes them, must then fall strictly from one to the
    next. That one check proves the reference would choose the same tokens in the same order,
    and fails on a tie (which the reference breaks toward the lower index), on NaN or +inf
    (the key turns NaN) and on a row with fewer than K selectable tokens (the key turns
    -inf). Returns None to hand such calls, and any argument this path doesn't take, to the
    general path, which ranks ties and raises the errors.

    Taken under ``backend="auto"`` on any device and ``"torch"``; a forced ``"triton"`` or
    ``"cuda"`` runs what it names. On an H100 at B=64, M=320 this path took 55-101 us against
    351-686 us for the checked Triton call (``bench/results/kernels-h100.md``).
    """
    if not (isinstance(scores, torch.Tensor) and scores.dim() == 2 and scores.is_floating_point()
            and scores.numel() > 0):
        return None
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0 < tau < math.inf:
        return None
    if backend != "auto" and resolve_row_backend(backend, scores, op="gumbel_topk",
                                                 max_width=MAX_TRITON_WIDTH,
                                                 cuda_max_width=CUDA_TOPK_MAX_WIDTH) != "torch":
        return None
    batch, width = scores.shape
    k_rows = None
    if isinstance(k, int) and not isinstance(k, bool):
        kmax = kmin = k
    elif (isinstance(k, torch.Tensor) and k.shape == (batch,) and k.device == scores.device
          and not k.is_floating_point() and not k.is_complex() and k.dtype != torch.bool):
        k_rows = k
        kmin, kmax = (int(v) for v in torch.aminmax(k))
    else:
        return None
    if kmin < 1 or kmax > width:
        return None
    values, indices = (scores.detach() if scores.requires_grad else scores).topk(
        min(kmax + 1, width), dim=1)
    if not _keys_fall_strictly(values, tau, kmax, k_rows):
        return None
    indices = indices[:, :kmax]
    if k_rows is None:
        return indices
    return indices.masked_fill(torch.arange(kmax, device=scores.device) >= k_rows[:, None], -1)


def _keys_fall_strictly(values, tau, kmax, k_rows) -> bool:
    """Whether the ranking keys of ``topk``'s sorted ``values`` [B, min(kmax + 1, M)] fall
    strictly over each row's first K + 1 (the (M+1)-th of a full row counts as -inf).

    On the host, in one C pass where the extension is built (a torch op per step would cost a
    few microseconds of dispatch each, a fifth of ``torch.topk`` at K = 32), else in NumPy;
    ``_keys_fall_strictly_numpy`` is the reference the C pass is tested against.
    """
    if values.dtype not in (torch.float32, torch.float64):
        values = values.to(compute_dtype(values.dtype))
    if not values.is_cpu:
        values = values.cpu()
    if not values.is_contiguous():
        values = values.contiguous()
    if _gumbel_topk_host is None:
        return _keys_fall_strictly_numpy(values, tau, kmax, k_rows)
    if k_rows is not None:
        k_rows = k_rows.to("cpu", torch.int64).contiguous()
    rows, width = values.shape
    return _gumbel_topk_host.keys_fall_strictly(
        values.data_ptr(), rows, width, kmax, float(tau), values.dtype == torch.float64,
        None if k_rows is None else k_rows.data_ptr())


def _keys_fall_strictly_numpy(values, tau, kmax, k_rows) -> bool:
    """``_keys_fall_strictly`` in NumPy, for contiguous float32 or float64 CPU ``values``.

    NumPy's float32 subtraction and division round as torch's do (IEEE, to nearest), so the
    keys are the reference's bit for bit.
    """
    key = values.numpy()
    with numpy.errstate(invalid="ignore"):  # +-inf - +-inf: NaN, which fails the check
        key = key - key[:, :1]
        if tau != 1:  # by tau rounded to the key dtype, as the reference's tensor division
            key = key / key.dtype.type(tau)
    falls = key[:, 1:] < key[:, :-1]  # False at a tie and wherever a NaN takes part
    if kmax == key.shape[1]:  # K = M: the last key must still rise above -inf
        falls = numpy.concatenate([falls, key[:, -1:] > -numpy.inf], axis=1)
    if k_rows is not None:  # a row's check ends at its own K + 1
        falls |= numpy.arange(kmax) >= k_rows.cpu().numpy()[:, None]
    return numpy.count_nonzero(falls) == falls.size  # a third of falls.all()'s cost here


def plackett_luce_log_prob(scores: torch.Tensor, indices: torch.Tensor, *, tau: float = 1.0,
                           lengths=None, backend: str = "auto") -> torch.Tensor:
    """log pi(S|x) of a given ordered selection, with the same fused backward.

    ``indices`` is [B, K] int, each row a prefix of distinct valid positions followed by ``-1``
    padding (the layout ``gumbel_topk`` returns).
    """
    _checks.tensor("indices", indices, ndim=2, integer=True)
    _checks.tensor("scores", scores, ndim=2, floating=True)
    _checks.same_device("indices", indices, "scores", scores)
    if indices.shape[0] != scores.shape[0]:
        raise ValueError(f"indices has {indices.shape[0]} rows but scores has {scores.shape[0]}")
    k_rows = (indices >= 0).sum(dim=1)
    scores, k_rows, kmax, lengths = _check_common(scores, k_rows, lengths, tau,
                                                  k_name="indices (its non-negative prefix)")
    indices = check_selection(scores, indices.to(torch.int64), k_rows, lengths)
    path = resolve_row_backend(backend, scores, op="plackett_luce_log_prob",
                               max_width=MAX_TRITON_WIDTH)
    if path == "torch":
        return plackett_luce_log_prob_ref(scores, indices, k_rows, lengths, tau)
    return _PlackettLuceLogProb.apply(scores, indices, k_rows, lengths, float(tau))


def _check_common(scores, k, lengths, tau, k_name: str = "k"):
    _checks.tensor("scores", scores, ndim=2, floating=True)
    _checks.tau_for_keys(_checks.positive_float("tau", tau), scores)
    batch, width = scores.shape
    if width == 0:
        raise ValueError("scores has no tokens (shape [B, 0])")
    if lengths is None:
        lengths = torch.full((batch,), width, dtype=torch.int64, device=scores.device)
    else:
        _checks.tensor("lengths", lengths, ndim=1, integer=True)
        _checks.same_device("lengths", lengths, "scores", scores)
        if lengths.shape[0] != batch:
            raise ValueError(f"lengths must have shape [{batch}], got {list(lengths.shape)}")
        lengths = lengths.to(torch.int64)
    if isinstance(k, torch.Tensor):
        _checks.tensor(k_name, k, ndim=(0, 1), integer=True)
        _checks.same_device(k_name, k, "scores", scores)
        k_rows = k.to(torch.int64).expand(batch).contiguous() if k.dim() == 0 else k.to(torch.int64)
        if k_rows.shape[0] != batch:
            raise ValueError(f"{k_name} must have shape [{batch}], got {list(k.shape)}")
    elif isinstance(k, int) and not isinstance(k, bool):
        if k < 1:  # checked here too: an empty batch has no row to check it on
            raise ValueError(f"{k_name} must be >= 1 for every row, got {k}")
        k_rows = torch.full((batch,), k, dtype=torch.int64, device=scores.device)
    else:
        raise TypeError(f"{k_name} must be an int or an integer tensor, got {type(k).__name__}")
    # Every data-dependent check in one device sync.
    cols = torch.arange(width, device=scores.device)
    valid = (cols < lengths[:, None]) & (scores > float("-inf"))
    valid_counts = valid.sum(dim=1)
    stats = torch.stack([
        torch.isnan(scores).any().long(), torch.isposinf(scores).any().long(),
        lengths.min() if batch else torch.zeros((), dtype=torch.int64, device=scores.device),
        lengths.max() if batch else torch.zeros((), dtype=torch.int64, device=scores.device),
        k_rows.min() if batch else torch.ones((), dtype=torch.int64, device=scores.device),
        k_rows.max() if batch else torch.ones((), dtype=torch.int64, device=scores.device),
        (k_rows > valid_counts).any().long(),
        _checks.key_overflow(scores, valid, tau).long(),
    ]).tolist()
    has_nan, has_posinf, len_min, len_max, k_min, k_max, k_too_big, overflow = stats
    if has_nan:
        raise ValueError("scores contains NaN")
    if has_posinf:
        raise ValueError("scores contains +inf; only finite values and -inf (padding) are allowed")
    if overflow:
        raise _checks.key_range_error(scores, valid, float(tau))
    if len_min < 0 or len_max > width:
        bad = len_min if len_min < 0 else len_max
        raise ValueError(f"lengths must lie in [0, {width}] (the width of scores), got {bad}")
    if k_min < 1:
        raise ValueError(f"{k_name} must be >= 1 for every row, got {k_min}")
    if k_too_big:
        row = int(torch.nonzero(k_rows > valid_counts)[0, 0])
        raise ValueError(
            f"{k_name} = {int(k_rows[row])} for row {row} exceeds its {int(valid_counts[row])} "
            "selectable tokens (positions < lengths with a score > -inf)")
    if batch == 0:  # no row to take K from: an empty batch keeps the K it was asked for
        k_max = k if isinstance(k, int) else (int(k) if k.dim() == 0 else 0)
        if k_max > width:  # every backend refuses it, as it would on a row
            raise ValueError(f"{k_name} = {k_max} exceeds the {width} tokens of a row (the "
                             "width of scores)")
    return scores, k_rows, int(k_max), lengths


def _check_seed(seed) -> int:
    if seed is None:
        return int(torch.randint(0, 2**31 - 1, (1,)).item())
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
    if not 0 <= seed < 2**63:
        raise ValueError(f"seed must lie in [0, 2**63), got {seed}")
    return seed


def gumbel_topk_unchecked(scores, k_rows, kmax: int, lengths, *, tau: float, seed: int,
                          sample: bool):
    """``gumbel_topk`` without its argument checks: no host sync, no extra launches.

    For hot loops and benchmarks whose inputs are valid by construction: ``k_rows`` and
    ``lengths`` int64 [B] on the device of ``scores``, ``kmax = max(k_rows)``, every
    ``k_rows[b]`` at most row b's selectable tokens, no NaN or +inf, ``tau > 0``, an int
    ``seed``. Invalid input gives undefined results rather than an error.
    """
    path = resolve_row_backend("auto", scores, op="gumbel_topk", max_width=MAX_TRITON_WIDTH)
    if path == "torch":
        return gumbel_topk_ref(scores, k_rows, kmax, lengths, tau, seed, bool(sample))
    return _GumbelTopK.apply(scores, k_rows, kmax, lengths, float(tau), seed, bool(sample))


def check_selection(scores, indices, k_rows, lengths):
    batch, width = scores.shape
    kmax = indices.shape[1]
    pos = torch.arange(kmax, device=indices.device)
    in_prefix = pos < k_rows[:, None]
    safe = indices.clamp(0, width - 1)
    sorted_idx = torch.where(in_prefix, indices, torch.full_like(indices, -1)).sort(dim=1).values
    stats = torch.stack([
        (indices < -1).any(),
        ((indices >= 0) != in_prefix).any(),  # -1 only as trailing padding
        (in_prefix & ((indices >= lengths[:, None]) | (indices >= width))).any(),
        (in_prefix & (scores.gather(1, safe) == float("-inf"))).any(),
        ((sorted_idx[:, 1:] == sorted_idx[:, :-1]) & (sorted_idx[:, 1:] >= 0)).any(),
    ]).tolist()
    if stats[0]:
        b, k = first_true(indices < -1)
        raise ValueError(f"indices must hold positions >= 0 and -1 padding, got "
                         f"{int(indices[b, k])} at row {b}, position {k}")
    if stats[1]:
        b, k = first_true((indices >= 0) != in_prefix)  # a -1 with a chosen position after it
        after = k + first_true(indices[b, k:] >= 0)[0]
        raise ValueError(f"indices: each row must be chosen positions followed by -1 padding "
                         f"only; row {b} has -1 at position {k}, then {int(indices[b, after])} "
                         f"at position {after}")
    if stats[2]:
        b, k = first_true(in_prefix & ((indices >= lengths[:, None]) | (indices >= width)))
        raise ValueError(f"indices: a chosen position lies outside its row's valid length: row "
                         f"{b}, position {k} holds {int(indices[b, k])}, but the row has "
                         f"{min(int(lengths[b]), width)} positions")
    if stats[3]:
        b, k = first_true(in_prefix & (scores.gather(1, safe) == float("-inf")))
        raise ValueError(f"indices: a chosen position has score -inf (padding cannot be "
                         f"chosen): row {b}, position {k} holds {int(indices[b, k])}")
    if stats[4]:
        b, j = first_true((sorted_idx[:, 1:] == sorted_idx[:, :-1]) & (sorted_idx[:, 1:] >= 0))
        value = int(sorted_idx[b, j])
        where = torch.nonzero(in_prefix[b] & (indices[b] == value)).flatten().tolist()
        raise ValueError(f"indices: a row chooses the same position twice: row {b} holds "
                         f"{value} at positions {where[0]} and {where[1]}")
    return indices


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _logaddexp(a, b):
        hi = tl.maximum(a, b)
        lo = tl.minimum(a, b)
        return tl.where(hi == float("-inf"), hi, hi + tl.log(1.0 + tl.exp(lo - hi)))

    @triton.jit
    def _lse_pair(a1, r1, tau1, a2, r2, tau2):
        """Combine two logsumexps held as (anchor a, offset r), L = a / tau + r.

        tau rides along as a constant third component: a combine function takes no other
        arguments. The new anchor is the larger one.
        """
        a = tl.maximum(a1, a2)
        safe = tl.where(a == float("-inf"), 0.0, a)
        r = _logaddexp(r1 + (a1 - safe) / tau1, r2 + (a2 - safe) / tau1)
        return a, tl.where(a == float("-inf"), float("-inf"), r), tau1

    @triton.jit
    def _lse_scan(anchor, offset, tau, REVERSE: tl.constexpr):
        taus = tl.full(anchor.shape, tau, tl.float32)
        anchor, offset, _ = tl.associative_scan((anchor, offset, taus), 0, _lse_pair,
                                                reverse=REVERSE)
        return anchor, offset

    @triton.jit
    def _load_row(scores_ptr, lengths_ptr, row, width, BLOCK_M: tl.constexpr):
        """Scores of one (contiguous) row as float32, -inf where not valid."""
        cols = tl.arange(0, BLOCK_M)
        length = tl.load(lengths_ptr + row)
        s = tl.load(scores_ptr + row * width + cols, mask=cols < length,
                    other=float("-inf")).to(tl.float32)
        return s, s > float("-inf")

    @triton.jit
    def _gumbel_topk_fwd_kernel(scores_ptr, k_ptr, lengths_ptr, indices_ptr, anchor_ptr,
                                offset_ptr, logp_ptr, width, kmax, tau, seed,
                                SAMPLE: tl.constexpr, BLOCK_M: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK_M)
        s, valid = _load_row(scores_ptr, lengths_ptr, row, width, BLOCK_M)
        row_max = tl.max(s, axis=0)
        row_max = tl.where(row_max > float("-inf"), row_max, 0.0)
        # Shifted, so the noise adds precisely; divided with IEEE rounding (div_rn), as torch
        # divides in the reference: "/" compiles to an approximate division on a GPU, and
        # near-ties could then rank differently from the reference.
        key = tl.where(valid, tl.div_rn(s - row_max, tau), float("-inf"))
        if SAMPLE:
            u = tl.rand(seed, row.to(tl.int64) * width + cols)
            key = key - tl.log(-tl.log(tl.maximum(u, 1e-20)))
        key = tl.where(key == 0.0, 0.0, key)  # -0.0 ties with +0.0, as in torch.sort

        # One sort of int64 keys: order-preserving float bits above, reversed index below,
        # so a descending sort ranks by key and breaks ties toward the lower index.
        bits = key.to(tl.int32, bitcast=True)
        ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
        ordered = tl.where(valid, ordered, -2147483648)  # invalid tokens rank last
        packed = (ordered.to(tl.int64) << 32) | (BLOCK_M - 1 - cols).to(tl.int64)
        packed = tl.sort(packed, descending=True)
        order = (BLOCK_M - 1 - (packed & 0xFFFF)).to(tl.int32)

        # Sorted layout: rank r holds the r-th choice; ranks >= k are the unchosen tokens,
        # so one reverse scan gives every step's denominator at once.
        n_valid = tl.sum(valid.to(tl.int32), axis=0)
        k = tl.load(k_ptr + row)
        valid_sorted = cols < n_valid
        s_sorted = tl.load(scores_ptr + row * width + order, mask=valid_sorted,
                           other=float("-inf")).to(tl.float32)
        anchor, offset = _lse_scan(s_sorted, tl.where(valid_sorted, 0.0, float("-inf")), tau,
                                   REVERSE=True)
        chosen = cols < k
        logp = tl.sum(tl.where(chosen, (s_sorted - anchor) / tau - offset, 0.0), axis=0)

        out = cols < kmax
        tl.store(indices_ptr + row * kmax + cols, tl.where(chosen, order, -1).to(tl.int64),
                 mask=out)
        tl.store(anchor_ptr + row * kmax + cols, tl.where(chosen, anchor, 0.0), mask=out)
        tl.store(offset_ptr + row * kmax + cols, tl.where(chosen, offset, 0.0), mask=out)
        tl.store(logp_ptr + row, logp)

    @triton.jit
    def _pl_log_prob_fwd_kernel(scores_ptr, k_ptr, lengths_ptr, indices_ptr, anchor_ptr,
                                offset_ptr, logp_ptr, width, kmax, tau,
                                BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                                CHUNK_K: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK_M)
        s, valid = _load_row(scores_ptr, lengths_ptr, row, width, BLOCK_M)
        k = tl.load(k_ptr + row)

        # Which tokens are chosen: compare against the indices a chunk at a time.
        is_chosen = tl.zeros((BLOCK_M,), dtype=tl.int32)
        for start in tl.range(0, BLOCK_K, CHUNK_K):
            t = start + tl.arange(0, CHUNK_K)
            idx = tl.load(indices_ptr + row * kmax + t, mask=t < k, other=-1)
            hit = (idx[:, None] == cols[None, :]).to(tl.int32)
            is_chosen = tl.maximum(is_chosen, tl.max(hit, axis=0))
        rest = tl.where(is_chosen == 0, s, float("-inf"))
        rest_anchor = tl.max(rest, axis=0)
        safe = tl.where(rest_anchor > float("-inf"), rest_anchor, 0.0)
        rest_offset = tl.where(rest_anchor > float("-inf"),
                               tl.log(tl.sum(tl.exp((rest - safe) / tau), axis=0)),
                               float("-inf"))

        t = tl.arange(0, BLOCK_K)
        chosen = t < k
        idx = tl.load(indices_ptr + row * kmax + t, mask=chosen, other=0)
        s_chosen = tl.load(scores_ptr + row * width + idx, mask=chosen,
                           other=float("-inf")).to(tl.float32)
        tail_anchor, tail_offset = _lse_scan(s_chosen, tl.where(chosen, 0.0, float("-inf")), tau,
                                             REVERSE=True)
        anchor, offset, _ = _lse_pair(tail_anchor, tail_offset, tau, rest_anchor, rest_offset,
                                      tau)
        logp = tl.sum(tl.where(chosen, (s_chosen - anchor) / tau - offset, 0.0), axis=0)
        tl.store(anchor_ptr + row * kmax + t, tl.where(chosen, anchor, 0.0), mask=t < kmax)
        tl.store(offset_ptr + row * kmax + t, tl.where(chosen, offset, 0.0), mask=t < kmax)
        tl.store(logp_ptr + row, logp)

    @triton.jit
    def _pl_log_prob_bwd_kernel(scores_ptr, k_ptr, lengths_ptr, indices_ptr, anchor_ptr,
                                offset_ptr, dlogp_ptr, dscores_ptr, width, kmax, tau,
                                BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK_M)
        s, valid = _load_row(scores_ptr, lengths_ptr, row, width, BLOCK_M)
        k = tl.load(k_ptr + row)
        g = tl.load(dlogp_ptr + row).to(tl.float32) / tau

        # A_p = log sum_{t<=p} exp(-L_t), as a pair scan over -L_t = (-a_t) / tau + (-r_t).
        t = tl.arange(0, BLOCK_K)
        chosen = t < k
        neg_anchor = tl.where(chosen, -tl.load(anchor_ptr + row * kmax + t, mask=chosen,
                                               other=0.0), float("-inf"))
        neg_offset = tl.where(chosen, -tl.load(offset_ptr + row * kmax + t, mask=chosen,
                                               other=0.0), float("-inf"))
        a_anchor, a_offset = _lse_scan(neg_anchor, neg_offset, tau, REVERSE=False)
        last = t == k - 1
        last_anchor = tl.max(tl.where(last, a_anchor, float("-inf")), axis=0)
        last_offset = tl.max(tl.where(last, a_offset, float("-inf")), axis=0)

        # Unchosen tokens sit in every denominator; chosen ones are overwritten just below.
        dense = tl.where(valid, -g * tl.exp((s + last_anchor) / tau + last_offset), 0.0)
        tl.store(dscores_ptr + row * width + cols, dense, mask=cols < width)
        tl.debug_barrier()

        idx = tl.load(indices_ptr + row * kmax + t, mask=chosen, other=0)
        s_chosen = tl.load(scores_ptr + row * width + idx, mask=chosen, other=0.0).to(tl.float32)
        tl.store(dscores_ptr + row * width + idx,
                 g * (1.0 - tl.exp((s_chosen + a_anchor) / tau + a_offset)), mask=chosen)


# ----------------------------------------------------------------------------------------------
# Launchers and autograd
# ----------------------------------------------------------------------------------------------

def _alloc(shape, dtype, device):
    """Output buffers; tests swap in a NaN/sentinel filler to catch unwritten elements."""
    return torch.empty(shape, dtype=dtype, device=device)


def _launch_gumbel_topk_fwd(scores, k_rows, kmax, lengths, tau, seed, sample):
    batch, width = scores.shape
    block_m = next_power_of_2(width)
    indices = _alloc((batch, kmax), torch.int64, scores.device)
    anchor = _alloc((batch, kmax), torch.float32, scores.device)
    offset = _alloc((batch, kmax), torch.float32, scores.device)
    logp = _alloc((batch,), torch.float32, scores.device)
    if batch:
        _gumbel_topk_fwd_kernel[(batch,)](
            scores, k_rows, lengths, indices, anchor, offset, logp, width, kmax, tau, seed,
            SAMPLE=sample, BLOCK_M=block_m, **ranked_row_launch_config(block_m))
    return indices, (anchor, offset), logp


def _launch_pl_fwd(scores, indices, k_rows, lengths, tau):
    batch, width = scores.shape
    kmax = indices.shape[1]
    block_m, block_k = next_power_of_2(width), next_power_of_2(kmax)
    anchor = _alloc((batch, kmax), torch.float32, scores.device)
    offset = _alloc((batch, kmax), torch.float32, scores.device)
    logp = _alloc((batch,), torch.float32, scores.device)
    if batch:
        _pl_log_prob_fwd_kernel[(batch,)](
            scores, k_rows, lengths, indices, anchor, offset, logp, width, kmax, tau,
            BLOCK_M=block_m, BLOCK_K=block_k, CHUNK_K=min(block_k, 16),
            **ranked_row_launch_config(block_m))
    return (anchor, offset), logp


def _launch_pl_bwd(scores, indices, k_rows, lengths, denominators, tau, grad_logp):
    batch, width = scores.shape
    kmax = indices.shape[1]
    block_m, block_k = next_power_of_2(width), next_power_of_2(kmax)
    anchor, offset = denominators
    grad = _alloc((batch, width), torch.float32, scores.device)
    if batch:
        _pl_log_prob_bwd_kernel[(batch,)](
            scores, k_rows, lengths, indices, anchor, offset, grad_logp.contiguous(), grad,
            width, kmax, tau, BLOCK_M=block_m, BLOCK_K=block_k, **ranked_row_launch_config(block_m))
    return grad.to(scores.dtype)


def _prepare(scores, k_rows, lengths):
    return scores.contiguous(), k_rows.contiguous(), lengths.contiguous()


class _GumbelTopK(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, k_rows, kmax, lengths, tau, seed, sample):
        scores, k_rows, lengths = _prepare(scores, k_rows, lengths)
        indices, denominators, logp = _launch_gumbel_topk_fwd(scores, k_rows, kmax, lengths,
                                                              tau, seed, sample)
        ctx.save_for_backward(scores, indices, k_rows, lengths, *denominators)
        ctx.tau = tau
        ctx.mark_non_differentiable(indices)
        return indices, logp.to(compute_dtype(scores.dtype))

    @staticmethod
    def backward(ctx, grad_indices, grad_logp):
        scores, indices, k_rows, lengths, *denominators = ctx.saved_tensors
        grad = _launch_pl_bwd(scores, indices, k_rows, lengths, denominators, ctx.tau, grad_logp)
        return grad, None, None, None, None, None, None


class _PlackettLuceLogProb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, indices, k_rows, lengths, tau):
        scores, k_rows, lengths = _prepare(scores, k_rows, lengths)
        indices = indices.contiguous()
        denominators, logp = _launch_pl_fwd(scores, indices, k_rows, lengths, tau)
        ctx.save_for_backward(scores, indices, k_rows, lengths, *denominators)
        ctx.tau = tau
        return logp.to(compute_dtype(scores.dtype))

    @staticmethod
    def backward(ctx, grad_logp):
        scores, indices, k_rows, lengths, *denominators = ctx.saved_tensors
        grad = _launch_pl_bwd(scores, indices, k_rows, lengths, denominators, ctx.tau, grad_logp)
        return grad, None, None, None, None
