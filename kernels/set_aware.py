"""Set-aware picks in one Triton launch: K greedy (or sampled) picks per row, each discounting
the tokens like those already picked.

Reads top to bottom: the public function and its dispatch, the Triton kernel (one program per
row; the row's keys and redundancies stay in registers for all K steps), and the host launcher.
The PyTorch reference beside this file (``set_aware_ref.py``) states the exact semantics.

Why a kernel: the reference takes K sequential steps of about ten tensor operations each. On
a GPU every one is a launch, so at K = 800 (40% of a 2000-token clip) the picks cost about
8000 launches. Here the host computes the row's cosine matrix once (one batched GEMM,
[B, M, M]), and the kernel's step t reads one row of it (M numbers) to update every key.
The keys are float64, as in the reference, so greedy picks are the reference's whenever the
two similarity computations (a GEMM here, a matrix-vector product there) round alike, and
differ at most where two keys lie within their rounding (~1e-7 of beta / tau).
The sampled path's truncated-Gumbel update uses expm1 and log1p written with Kahan's
correction (full float64 precision without libdevice).

Rows wider than ``MAX_TRITON_WIDTH`` (greedy) or ``MAX_SAMPLE_WIDTH`` (sampling) go to the
reference under ``backend="auto"``. A launch's cosine matrices take at most ``GRAM_BYTES``;
a larger batch launches in chunks of rows.
"""
from __future__ import annotations

import torch

from ._utils import (ROW_KERNEL_MAX_WIDTH, next_power_of_2, ranked_row_launch_config,
                     resolve_backend)
from .set_aware_ref import initial_keys, set_aware_picks_ref, unit_vectors

try:
    import triton
    import triton.language as tl
except ImportError:  # the PyTorch reference still works
    triton = None

__all__ = ["set_aware_picks_unchecked", "MAX_TRITON_WIDTH", "MAX_SAMPLE_WIDTH", "GRAM_BYTES"]

MAX_TRITON_WIDTH = ROW_KERNEL_MAX_WIDTH
#: the widest row the sampled path takes: its float64 truncated-Gumbel update needs about
#: 160 registers a thread at 2048, and at 4096 ptxas spills to the stack with 16 or 32 warps
#: (tests/test_triton_compile.py checks for spills). Training rows are far narrower.
MAX_SAMPLE_WIDTH = 2048
#: the most memory one launch's cosine matrices [rows, M, M] take; wider batches launch in
#: chunks of rows (at M = 4096 and float32: 4 rows a launch)
GRAM_BYTES = 256 * 2 ** 20


def set_aware_picks_unchecked(scores: torch.Tensor, hidden: torch.Tensor,
                              budget: torch.Tensor, *, beta: float, tau: float, seed: int,
                              sample: bool, backend: str = "auto") -> torch.Tensor:
    """int64 [B, Kmax]: ``budget[b]`` picks of row b in order, ``-1`` past them.

    No argument checks (as ``gumbel_topk_unchecked``): the public entry is
    ``avex.set_selection.set_aware_indices``, which checks them first (scores [B, M] with
    -inf at padding, hidden [B, M, D], budget int64 [B] within each row's selectable tokens,
    beta >= 0, tau > 0); only ``backend`` is checked here: ``"auto"`` (CUDA -> Triton up to
    ``MAX_TRITON_WIDTH`` tokens a row greedy and ``MAX_SAMPLE_WIDTH`` sampling, else the
    reference), ``"triton"`` or ``"torch"``.
    """
    path = resolve_backend(backend, scores.device, op="set-aware selection")
    widest = MAX_SAMPLE_WIDTH if sample else MAX_TRITON_WIDTH
    if path == "triton" and scores.shape[1] > widest:
        if backend == "triton":
            mode = "sampling" if sample else "greedy"
            raise ValueError(f"set-aware selection: the Triton path holds a row in registers "
                             f"and takes at most {widest} tokens {mode}, got {scores.shape[1]}")
        path = "torch"
    if path == "torch":
        return set_aware_picks_ref(scores, hidden, budget, float(beta), tau, seed, sample)
    return _launch(scores, hidden, budget, float(beta), tau, seed, sample)


# ----------------------------------------------------------------------------------------------
# Triton kernel
# ----------------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _expm1(x):
        """e^x - 1 to full precision (Kahan): the rounding of u = e^x cancels in (u-1)/log u."""
        u = tl.exp(x)
        near = (u - 1.0) * x / tl.log(u)
        return tl.where(u == 1.0, x, tl.where(u - 1.0 == -1.0, -1.0, near))

    @triton.jit
    def _log1p(x):
        """log(1 + x) to full precision (Kahan), x >= 0 here."""
        u = 1.0 + x
        return tl.where(u == 1.0, x, tl.log(u) * x / (u - 1.0))

    @triton.jit
    def _set_aware_kernel(key_ptr, gram_ptr, budget_ptr, coef_ptr, picks_ptr, width, kmax,
                          SAMPLE: tl.constexpr, BLOCK_M: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK_M)
        inside = cols < width
        key = tl.load(key_ptr + row * width + cols, mask=inside, other=float("-inf"))
        redundant = tl.zeros([BLOCK_M], dtype=tl.float64)
        coef = tl.load(coef_ptr)                      # beta / tau, float64
        budget = tl.load(budget_ptr + row)
        gram = gram_ptr + row * width * width
        # kmax steps for every row, a row's picks past its budget written as -1. The loop runs
        # to BLOCK_M (>= kmax) and skips the rest: one compilation per row width serves every
        # K (a skipped step is one compare), and the interpreter takes no runtime loop bound
        for t in range(0, BLOCK_M):
            if t < kmax:
                top = tl.max(key, axis=0)
                pick = tl.argmax(key, axis=0, tie_break_left=True)   # ties: the lower index
                tl.store(picks_ptr + row * kmax + t,
                         tl.where(t < budget, pick.to(tl.int64), -1))
                key = tl.where(cols == pick, float("-inf"), key)
                similarity = tl.load(gram + pick.to(tl.int64) * width + cols, mask=inside,
                                     other=0.0).to(tl.float64)
                grown = tl.maximum(redundant, similarity)
                shift = coef * (grown - redundant)
                redundant = grown
                if SAMPLE:
                    # the reference's shift_truncated: a Gumbel truncated at top, carried by its
                    # CDF to a logit lower by shift; a key that did not move keeps its bits
                    moved = (shift != 0.0) & (key > float("-inf"))
                    gap = tl.where(moved, key - top, -1.0)                   # <= 0
                    log_rest = tl.log(-_expm1(gap))                          # -inf at the top
                    low = gap - shift
                    hi = tl.maximum(log_rest, low)
                    lse = hi + _log1p(tl.exp(tl.minimum(log_rest, low) - hi))
                    key = tl.where(moved, key - shift - lse, key)
                else:
                    key = key - shift                 # -inf (picked, padding) stays -inf


# ----------------------------------------------------------------------------------------------
# Launcher
# ----------------------------------------------------------------------------------------------

def launch_config(block_m: int) -> dict:
    """The ranked row kernels' warps for a row of ``block_m`` keys, without FP fusion: the key
    update rounds the product before the subtraction, as the reference does, so that a fused
    multiply-add cannot move a near-tie."""
    return {**ranked_row_launch_config(block_m), "enable_fp_fusion": False}


def _alloc(shape, dtype, device):
    """Output buffers; tests swap in a NaN/sentinel filler to catch unwritten elements."""
    return torch.empty(shape, dtype=dtype, device=device)


def _launch(scores, hidden, budget, beta, tau, seed, sample):
    batch, width = scores.shape
    kmax = int(budget.max()) if batch else 0
    picks = _alloc((batch, kmax), torch.int64, scores.device)
    if batch == 0 or kmax == 0:
        return picks.fill_(-1)
    keys = initial_keys(scores, seed, sample, tau).contiguous()
    unit = unit_vectors(hidden.detach())
    coef = torch.tensor([beta / tau], dtype=torch.float64, device=scores.device)
    budget = budget.contiguous()   # int64, as set_aware_indices returns it checked
    block_m = next_power_of_2(width)
    rows = max(1, GRAM_BYTES // (width * width * unit.element_size()))
    for start in range(0, batch, rows):
        part = slice(start, min(batch, start + rows))
        gram = torch.bmm(unit[part], unit[part].transpose(1, 2)).contiguous()
        _set_aware_kernel[(part.stop - part.start,)](
            keys[part], gram, budget[part], coef, picks[part], width, kmax,
            SAMPLE=bool(sample), BLOCK_M=block_m, **launch_config(block_m))
    return picks
