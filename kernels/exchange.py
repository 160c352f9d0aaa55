"""Exchange-set construction (paper Section 3.3), batched over samples and types in one launch.

Reads top to bottom: the public function and its argument checks, the Triton kernels (one
program per (sample, exchange type): mark the anchor set, rank both candidate pools with one
sort each, write the groups, delta F and the counterfactual keep-set), the host launchers, and
the ``autograd.Function`` whose backward is one fused kernel. The semantics are stated in the
PyTorch reference beside this file (``exchange_ref.py``).

delta F = sum_{i in G} s_i - sum_{j in G'} s_j, so d delta F / d s is +1 on G, -1 on G' and 0
elsewhere; the backward sums those signs over the exchange types of a sample.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from . import _checks
from ._utils import (ROW_KERNEL_MAX_WIDTH, first_true, next_power_of_2,
                     ranked_row_launch_config, resolve_row_backend)
from .exchange_ref import (EXCHANGE_TYPES, build_exchanges_ref, group_width, type_codes)
from .gumbel_topk import check_selection
from .gumbel_topk_ref import compute_dtype

try:
    import triton
    import triton.language as tl
except ImportError:  # the PyTorch reference still works
    triton = None

__all__ = ["build_exchanges", "Exchanges", "EXCHANGE_TYPES"]

MAX_TRITON_WIDTH = ROW_KERNEL_MAX_WIDTH  # wider rows: the reference (or backend="cuda")
INDEX_CHUNK = 16          # anchor indices compared against the row per step


class Exchanges(NamedTuple):
    """Output of :func:`build_exchanges`. T = len(types), W = min(g, M).

    Attributes:
        removed: int64 [B, T, W], G: the removed tokens (positions in the M axis), lowest
            score first, ``-1`` past the group size.
        inserted: int64 [B, T, W], G': the inserted tokens, highest score first, ``-1`` past
            the group size.
        group_size: int64 [B, T], |G| = |G'|; ``0`` means the exchange was skipped.
        delta_f: [B, T] sum s_G - sum s_G' (``0`` when skipped), differentiable w.r.t.
            ``scores``; float32 (float64 for float64 scores).
        keep: bool [B, T, M], the counterfactual sets S' = S \\ G u G' (S itself when skipped).
        anchor: bool [B, M], the anchor set S.
        types: the exchange types, in the order of the T axis.
    """
    removed: torch.Tensor
    inserted: torch.Tensor
    group_size: torch.Tensor
    delta_f: torch.Tensor
    keep: torch.Tensor
    anchor: torch.Tensor
    types: tuple

    @property
    def valid(self) -> torch.Tensor:
        """bool [B, T]: the exchanges that were not skipped."""
        return self.group_size > 0

    def sets(self) -> torch.Tensor:
        """bool [B, 1 + T, M]: the anchor followed by the counterfactuals, ready for
        ``compact`` (one batched prefill for all of them)."""
        return torch.cat([self.anchor[:, None, :], self.keep], dim=1)


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------

def build_exchanges(scores: torch.Tensor, indices: torch.Tensor, modality: torch.Tensor, *,
                    g: int = 8, types=EXCHANGE_TYPES, backend: str = "auto") -> Exchanges:
    """Build the exchange groups and counterfactual sets of every sample and type.

    Args:
        scores: [B, M] float policy scores of the audio-visual tokens. ``-inf`` marks a token
            that cannot be inserted (it can't have been chosen either).
        indices: [B, K] int, the anchor set S of each row: chosen positions followed by ``-1``
            padding (the ``indices`` output of ``gumbel_topk``); order does not matter.
        modality: [B, M] int: 0 visual, 1 audio, -1 padding (never removed or inserted).
        g: group size (>= 1). Where a side has fewer than g candidates the largest feasible
            group is used; a shortage that leaves fewer than 2 skips the exchange.
        types: exchange types, each "vv", "aa", "va" or "av" (first letter the removed
            modality, second the inserted one); the T axis of the outputs follows this order.
        backend: ``"auto"`` (CUDA -> Triton, CPU -> PyTorch), ``"triton"`` or ``"torch"``.

    Returns:
        :class:`Exchanges`. Ties break toward the lower index on both sides.
    """
    types = _check_args(scores, indices, modality, g, types)
    indices = indices.to(torch.int64)
    codes = type_codes(types)
    path = resolve_row_backend(backend, scores, op="build_exchanges",
                               max_width=MAX_TRITON_WIDTH)
    if path == "torch":
        out = build_exchanges_ref(scores, indices, modality, g, codes)
    else:
        out = _BuildExchanges.apply(scores, indices, modality, g, codes)
    return Exchanges(*out, types=types)


def build_exchanges_unchecked(scores, indices, modality, *, g: int, types=EXCHANGE_TYPES
                              ) -> Exchanges:
    """``build_exchanges`` without its argument checks: no host sync, no extra launches.

    For hot loops and benchmarks whose inputs are valid by construction (``indices`` int64,
    as ``gumbel_topk`` returns them; ``modality`` codes in {-1, 0, 1}; no NaN or +inf).
    Invalid input gives undefined results rather than an error.
    """
    codes = type_codes(types)
    path = resolve_row_backend("auto", scores, op="build_exchanges",
                               max_width=MAX_TRITON_WIDTH)
    if path == "torch":
        out = build_exchanges_ref(scores, indices, modality, g, codes)
    else:
        out = _BuildExchanges.apply(scores, indices, modality, g, codes)
    return Exchanges(*out, types=tuple(types))


def _check_args(scores, indices, modality, g, types) -> tuple:
    _checks.tensor("scores", scores, ndim=2, floating=True)
    _checks.tensor("indices", indices, ndim=2, integer=True)
    _checks.tensor("modality", modality, ndim=2, integer=True)
    _checks.same_device("indices", indices, "scores", scores)
    _checks.same_device("modality", modality, "scores", scores)
    batch, width = scores.shape
    if width == 0:
        raise ValueError("scores has no tokens (shape [B, 0])")
    if indices.shape[0] != batch:
        raise ValueError(f"indices has {indices.shape[0]} rows but scores has {batch}")
    if modality.shape != scores.shape:
        raise ValueError(f"modality must have the shape of scores {list(scores.shape)}, "
                         f"got {list(modality.shape)}")
    _checks.int_at_least("g", g, 1)
    if isinstance(types, str) or not isinstance(types, (tuple, list)):
        raise TypeError(f"types must be a tuple of exchange types such as {EXCHANGE_TYPES}, "
                        f"got {types!r}")
    if not types:
        raise ValueError("types must name at least one exchange type, got an empty sequence")
    for name in types:
        _checks.choice("types", name, EXCHANGE_TYPES)
    if len(set(types)) != len(types):
        raise ValueError(f"types must not repeat an exchange type, got {tuple(types)}")

    bad_modality = (modality < -1) | (modality > 1)
    chosen_padding = (indices >= 0) & (modality.gather(1, indices.long().clamp(0, width - 1)) < 0)
    stats = torch.stack([  # every data-dependent check in one device sync (plus the shared one)
        torch.isnan(scores).any(), torch.isposinf(scores).any(), bad_modality.any(),
        (indices < -1).any(), chosen_padding.any()]).tolist()
    if stats[0]:
        raise ValueError("scores contains NaN")
    if stats[1]:
        raise ValueError("scores contains +inf; only finite values and -inf are allowed")
    if stats[2]:
        b, m = first_true(bad_modality)
        raise ValueError(f"modality must hold -1 (padding), 0 (visual) or 1 (audio), got "
                         f"{int(modality[b, m])} at row {b}, position {m}")
    if stats[3]:
        b, k = first_true(indices < -1)
        raise ValueError(f"indices must hold positions >= 0 and -1 padding, got "
                         f"{int(indices[b, k])} at row {b}, position {k}")
    # Shared with gumbel_topk: -1 only as trailing padding, in range, no repeats, no -inf.
    k_rows = (indices >= 0).sum(dim=1)
    lengths = torch.full((batch,), width, dtype=torch.int64, device=scores.device)
    check_selection(scores, indices.to(torch.int64), k_rows, lengths)
    if stats[4]:
        b, k = first_true(chosen_padding)
        raise ValueError(f"indices: a chosen position is padding (modality -1): row {b}, "
                         f"position {k} holds {int(indices[b, k])}")
    return tuple(types)


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _descending_keys(value, candidate, cols, BLOCK_M: tl.constexpr):
        """Distinct int64 keys: a descending sort ranks candidates by value, ties to the lower
        index, and puts every non-candidate last."""
        value = tl.where(value == 0.0, 0.0, value)  # -0.0 ties with +0.0
        bits = value.to(tl.int32, bitcast=True)
        ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)  # float order as signed int order
        ordered = tl.where(candidate, ordered, -2147483648)
        return (ordered.to(tl.int64) << 32) | (BLOCK_M - 1 - cols).to(tl.int64)

    @triton.jit
    def _group_threshold(sorted_keys, n, cols):
        """The key of rank n - 1 (the group's last member); above every key when n == 0."""
        return tl.min(tl.where(cols < n, sorted_keys, 9223372036854775807), axis=0)

    @triton.jit
    def _exchange_fwd_kernel(scores_ptr, indices_ptr, modality_ptr,
                             removed_ptr, inserted_ptr, size_ptr, delta_ptr, keep_ptr,
                             anchor_ptr, width, k_width, n_types, type_bits, g, out_width,
                             BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                             CHUNK_K: tl.constexpr):
        row = tl.program_id(0)
        t = tl.program_id(1)
        cols = tl.arange(0, BLOCK_M)
        in_row = cols < width
        s = tl.load(scores_ptr + row * width + cols, mask=in_row, other=0.0).to(tl.float32)
        mod = tl.load(modality_ptr + row * width + cols, mask=in_row, other=-1).to(tl.int32)

        # Anchor membership: compare the row against its indices a chunk at a time.
        hits = tl.zeros((BLOCK_M,), dtype=tl.int32)
        for start in tl.range(0, BLOCK_K, CHUNK_K):
            k = start + tl.arange(0, CHUNK_K)
            idx = tl.load(indices_ptr + row * k_width + k, mask=k < k_width, other=-1)
            hits = tl.maximum(hits, tl.max((idx[:, None] == cols[None, :]).to(tl.int32), axis=0))
        in_anchor = hits > 0

        # Type t packs (removed, inserted) modality codes in bits 2t and 2t + 1.
        removed_code = (type_bits >> (2 * t)) & 1
        inserted_code = (type_bits >> (2 * t + 1)) & 1
        can_remove = in_anchor & (mod == removed_code)
        can_insert = (~in_anchor) & (mod == inserted_code) & (s > float("-inf")) & in_row
        n = tl.minimum(tl.minimum(tl.sum(can_remove.to(tl.int32), axis=0),
                                  tl.sum(can_insert.to(tl.int32), axis=0)), g)
        n = tl.where(n >= tl.minimum(g, 2), n, 0)

        # G: lowest scores first (descending on -s); G': highest first.
        remove_keys = _descending_keys(-s, can_remove, cols, BLOCK_M)
        insert_keys = _descending_keys(s, can_insert, cols, BLOCK_M)
        remove_sorted = tl.sort(remove_keys, descending=True)
        insert_sorted = tl.sort(insert_keys, descending=True)
        # Keys are distinct, so "key >= the rank-(n-1) key" picks exactly the group.
        in_g = can_remove & (remove_keys >= _group_threshold(remove_sorted, n, cols))
        in_g_new = can_insert & (insert_keys >= _group_threshold(insert_sorted, n, cols))

        delta = (tl.sum(tl.where(in_g, s, 0.0), axis=0)
                 - tl.sum(tl.where(in_g_new, s, 0.0), axis=0))
        keep = (in_anchor & (~in_g)) | in_g_new

        pair = row * n_types + t
        in_group = cols < n
        out_cols = cols < out_width
        removed_pos = BLOCK_M - 1 - (remove_sorted & 0x7FFFFFFF)  # the index bits
        inserted_pos = BLOCK_M - 1 - (insert_sorted & 0x7FFFFFFF)
        tl.store(removed_ptr + pair * out_width + cols, tl.where(in_group, removed_pos, -1),
                 mask=out_cols)
        tl.store(inserted_ptr + pair * out_width + cols, tl.where(in_group, inserted_pos, -1),
                 mask=out_cols)
        tl.store(size_ptr + pair, n.to(tl.int64))
        tl.store(delta_ptr + pair, delta)
        tl.store(keep_ptr + pair * width + cols, keep.to(tl.int8), mask=in_row)
        anchor_width = tl.where(t == 0, width, 0)  # the first type's program writes S
        tl.store(anchor_ptr + row * width + cols, in_anchor.to(tl.int8), mask=cols < anchor_width)

    @triton.jit
    def _exchange_bwd_kernel(removed_ptr, inserted_ptr, grad_delta_ptr, grad_scores_ptr,
                             width, out_width, N_TYPES: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_W: tl.constexpr,
                             CHUNK_W: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK_M)
        grad = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for t in tl.range(0, N_TYPES):  # constexpr trip counts, also for the interpreter
            pair = row * N_TYPES + t
            weight = tl.load(grad_delta_ptr + pair).to(tl.float32)
            for start in tl.range(0, BLOCK_W, CHUNK_W):
                j = start + tl.arange(0, CHUNK_W)
                in_out = j < out_width
                rem = tl.load(removed_ptr + pair * out_width + j, mask=in_out, other=-1)
                ins = tl.load(inserted_ptr + pair * out_width + j, mask=in_out, other=-1)
                sign = (tl.sum((rem[:, None] == cols[None, :]).to(tl.float32), axis=0)
                        - tl.sum((ins[:, None] == cols[None, :]).to(tl.float32), axis=0))
                grad += weight * sign
        tl.store(grad_scores_ptr + row * width + cols, grad, mask=cols < width)


# ----------------------------------------------------------------------------------------------
# Launchers and autograd
# ----------------------------------------------------------------------------------------------

def _type_bits(codes) -> int:
    return sum((rem << (2 * t)) | (ins << (2 * t + 1)) for t, (rem, ins) in enumerate(codes))


def _alloc(shape, dtype, device):
    """Output buffers; tests swap in a NaN/sentinel filler to catch unwritten elements."""
    return torch.empty(shape, dtype=dtype, device=device)


def _launch_exchange_fwd(scores, indices, modality, g, codes):
    batch, width = scores.shape
    n_types, k_width = len(codes), indices.shape[1]
    out_width = group_width(g, width)
    device = scores.device
    removed = _alloc((batch, n_types, out_width), torch.int64, device)
    inserted = _alloc((batch, n_types, out_width), torch.int64, device)
    size = _alloc((batch, n_types), torch.int64, device)
    delta = _alloc((batch, n_types), torch.float32, device)
    keep = _alloc((batch, n_types, width), torch.int8, device)
    anchor = _alloc((batch, width), torch.int8, device)
    if batch:
        block_m = next_power_of_2(width)
        block_k = next_power_of_2(max(k_width, 1))
        _exchange_fwd_kernel[(batch, n_types)](
            scores, indices, modality, removed, inserted, size, delta, keep, anchor,
            width, k_width, n_types, _type_bits(codes), g, out_width,
            BLOCK_M=block_m, BLOCK_K=block_k, CHUNK_K=min(block_k, INDEX_CHUNK),
            **_exchange_fwd_launch_config(block_m))
    return removed, inserted, size, delta, keep.view(torch.bool), anchor.view(torch.bool)


def _exchange_fwd_launch_config(block_m: int) -> dict:
    """The forward holds a chunk of the Top-K indices beside the row. Left to itself, the ptxas
    of Triton 3.6 (the GPU image's) keeps it to 80 registers a thread and spills 4-8 bytes
    (M=320: K=128 on sm_90, K=32 on sm_80); allowing 128 (``maxnreg``) it takes 112-118 and
    spills on neither Triton 3.6 nor 3.9, with the same warps."""
    return {**ranked_row_launch_config(block_m), "maxnreg": 128}


def _launch_exchange_bwd(removed, inserted, grad_delta, width, dtype):
    batch, n_types, out_width = removed.shape
    grad = _alloc((batch, width), torch.float32, removed.device)
    if batch:
        block_m = next_power_of_2(width)
        block_w = next_power_of_2(out_width)
        _exchange_bwd_kernel[(batch,)](
            removed, inserted, grad_delta.contiguous(), grad, width, out_width,
            N_TYPES=n_types, BLOCK_M=block_m, BLOCK_W=block_w, CHUNK_W=min(block_w, INDEX_CHUNK),
            **ranked_row_launch_config(block_m))
    return grad.to(dtype)


class _BuildExchanges(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, indices, modality, g, codes):
        scores, indices, modality = scores.contiguous(), indices.contiguous(), modality.contiguous()
        removed, inserted, size, delta, keep, anchor = _launch_exchange_fwd(
            scores, indices, modality, g, codes)
        ctx.save_for_backward(removed, inserted)
        ctx.width, ctx.dtype = scores.shape[1], scores.dtype
        ctx.mark_non_differentiable(removed, inserted, size, keep, anchor)
        return removed, inserted, size, delta.to(compute_dtype(scores.dtype)), keep, anchor

    @staticmethod
    def backward(ctx, grad_removed, grad_inserted, grad_size, grad_delta, grad_keep,
                 grad_anchor):
        removed, inserted = ctx.saved_tensors
        return _launch_exchange_bwd(removed, inserted, grad_delta, ctx.width, ctx.dtype), \
            None, None, None, None
