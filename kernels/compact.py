"""Token compaction ahead of prefill: keep the marked tokens of each keep-set, in original order.

Reads top to bottom: the public function, its argument checks and output structure, the Triton
kernels (a plan kernel per keep-set: prefix sum of the mask -> gather index, positions,
attention mask and the inverse map; a row-gather kernel; and the backward, which sums each
source row's gradient over the sets that kept it), the host launchers, and the
``autograd.Function``. The PyTorch reference beside this file (``compact_ref.py``) states the
exact semantics.

S keep-sets of a sample all read the one copy of that sample's hidden states: nothing is
repeated S times. The backward is the adjoint of the gather (a scatter-add), computed as a
gather over the inverse map so that it needs no atomics and is deterministic in any dtype.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from . import _checks
from ._utils import next_power_of_2, resolve_backend, row_launch_config
from .compact_ref import compact_ref
from .cuda_lib import load as load_cuda_library

try:
    import triton
    import triton.language as tl
except ImportError:  # the PyTorch reference still works
    triton = None

__all__ = ["compact", "Compacted"]

LAYOUTS = ("padded", "varlen")
POSITIONS = ("original", "contiguous")
PADDING_SIDES = ("right", "left")

# Launch geometry. The plan kernel walks a mask row in chunks of at most PLAN_CHUNK tokens.
# The copy kernels move tiles of COPY_TILE elements: up to COPY_MAX_WIDTH features of
# COPY_TILE // width tokens, looping over wider rows.
PLAN_CHUNK = 4096
COPY_TILE = 4096
COPY_MAX_WIDTH = 1024


class Compacted(NamedTuple):
    """Output of :func:`compact`. R = B * S sequences, sequence r = b * S + s.

    Attributes:
        hidden: ``"padded"``: [R, max_seqlen, D], padding rows zero. ``"varlen"``: [total, D],
            the sequences concatenated (flash-attention's packed layout).
        position_ids: int64, the shape of ``hidden`` without D: each kept token's original
            index along L (``positions="original"``) or 0..n-1 (``"contiguous"``); 0 at padding.
            For flash-attention / HF packed inputs use ``position_ids[None]``.
        index: int64, same shape: the row of ``hidden_in.reshape(B * L, D)`` each token was
            copied from (the gather index); -1 at padding.
        cu_seqlens: int32 [R + 1], cumulative sequence lengths with a leading 0.
        max_seqlen: int, the longest sequence (the padded width).
        attention_mask: int64 [R, max_seqlen], 1 at tokens and 0 at padding (``"padded"``);
            ``None`` for ``"varlen"``.
    """
    hidden: torch.Tensor
    position_ids: torch.Tensor
    index: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    attention_mask: torch.Tensor | None

    @property
    def lengths(self) -> torch.Tensor:
        """int64 [R]: tokens kept per sequence."""
        return self.cu_seqlens.diff().long()


# ----------------------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------------------

def compact(hidden: torch.Tensor, keep: torch.Tensor, *, layout: str = "padded",
            positions: str = "original", padding_side: str = "right",
            backend: str = "auto") -> Compacted:
    """Gather the kept tokens of every keep-set into a padded batch or a packed varlen tensor.

    Args:
        hidden: [B, L, D] hidden states (any floating dtype). Gradients flow back to it.
        keep: bool [B, L] (one set per sample) or [B, S, L] (S sets per sample, e.g. an anchor
            and its counterfactuals); True marks a token to keep.
        layout: ``"padded"`` ([B*S, L', D] with ``attention_mask``) or ``"varlen"``
            ([total, D] with ``cu_seqlens`` / ``max_seqlen``, flash-attention's contract).
        positions: ``"original"`` (each token's index along L, as FastV / PruneVid keep
            them) or ``"contiguous"`` (0..n-1).
        padding_side: ``"right"`` or ``"left"``; padded layout only.
        backend: ``"auto"`` (CUDA -> Triton, CPU -> PyTorch), ``"triton"``, ``"torch"`` or
            ``"cuda"`` (the CUDA C++ library; its backward is a PyTorch ``index_add_``).

    Returns:
        :class:`Compacted`.
    """
    keep = _check_args(hidden, keep, layout, positions, padding_side)
    path = resolve_backend(backend, hidden.device, op="compact", cuda_library=True)
    if path == "torch":
        return Compacted(*compact_ref(hidden, keep, layout, positions, padding_side))
    if path == "cuda":
        return _compact_cuda(hidden, keep, layout, positions, padding_side)
    return _compact_triton(hidden, keep, layout, positions, padding_side)


def _check_args(hidden, keep, layout, positions, padding_side):
    _checks.tensor("hidden", hidden, ndim=3, floating=True)
    _checks.tensor("keep", keep, ndim=(2, 3), boolean=True)
    _checks.same_device("keep", keep, "hidden", hidden)
    _checks.choice("layout", layout, LAYOUTS)
    _checks.choice("positions", positions, POSITIONS)
    _checks.choice("padding_side", padding_side, PADDING_SIDES)
    batch, width = hidden.shape[:2]
    if keep.shape[0] != batch or keep.shape[-1] != width:
        want = f"[{batch}, {width}] or [{batch}, S, {width}]"
        raise ValueError(f"keep must have shape {want} to match hidden "
                         f"{list(hidden.shape)}, got {list(keep.shape)}")
    keep = keep[:, None, :] if keep.dim() == 2 else keep
    if keep.shape[1] == 0:
        raise ValueError(f"keep must hold at least one set per sample, got shape "
                         f"{list(keep.shape)}")
    return keep


# ----------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------

if triton is not None:

    @triton.jit
    def _compact_plan_kernel(keep_ptr, lengths_ptr, cu_ptr, index_ptr, positions_ptr, mask_ptr,
                             dest_ptr, width, num_sets, padded_width,
                             ORIGINAL: tl.constexpr, PADDED: tl.constexpr, LEFT: tl.constexpr,
                             BLOCK_L: tl.constexpr, L_CHUNKS: tl.constexpr,
                             PAD_CHUNKS: tl.constexpr):
        """One keep-set: slot of each kept token = its rank among the kept (a prefix sum).
        Loops run over constexpr chunk counts (runtime trip counts trip older interpreters)."""
        seq = tl.program_id(0).to(tl.int64)
        sample = seq // num_sets
        n = tl.load(lengths_ptr + seq)
        if PADDED:
            base = seq * padded_width + (padded_width - n if LEFT else 0)
            # Padding slots, and the attention mask over the whole row.
            for chunk in tl.range(0, PAD_CHUNKS):
                j = chunk * BLOCK_L + tl.arange(0, BLOCK_L)
                in_row = j < padded_width
                is_pad = (j < padded_width - n) if LEFT else (j >= n)
                out = seq * padded_width + j
                tl.store(index_ptr + out, -1, mask=in_row & is_pad)
                tl.store(positions_ptr + out, 0, mask=in_row & is_pad)
                tl.store(mask_ptr + out, (~is_pad).to(tl.int64), mask=in_row)
        else:
            base = tl.load(cu_ptr + seq).to(tl.int64)

        carry = 0
        for chunk in tl.range(0, L_CHUNKS):
            cols = chunk * BLOCK_L + tl.arange(0, BLOCK_L)
            in_row = cols < width
            kept = tl.load(keep_ptr + seq * width + cols, mask=in_row, other=0).to(tl.int32)
            rank = carry + tl.cumsum(kept, axis=0) - kept
            slot = base + rank
            is_kept = kept > 0
            tl.store(index_ptr + slot, sample * width + cols, mask=is_kept)
            tl.store(positions_ptr + slot, cols if ORIGINAL else rank, mask=is_kept)
            tl.store(dest_ptr + seq * width + cols, tl.where(is_kept, slot, -1), mask=in_row)
            carry += tl.sum(kept, axis=0)

    @triton.jit
    def _gather_rows_kernel(src_ptr, index_ptr, out_ptr, n_slots, features,
                            BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                            D_CHUNKS: tl.constexpr):
        """out[slot] = src[index[slot]], zeros where index is -1 (padding)."""
        slots = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        in_out = slots < n_slots
        rows = tl.load(index_ptr + slots, mask=in_out, other=-1)
        has_row = rows >= 0
        for chunk in tl.range(0, D_CHUNKS):
            d = chunk * BLOCK_D + tl.arange(0, BLOCK_D)
            in_d = (d < features)[None, :]
            x = tl.load(src_ptr + rows[:, None] * features + d[None, :],
                        mask=has_row[:, None] & in_d, other=0.0)
            tl.store(out_ptr + slots[:, None] * features + d[None, :], x,
                     mask=in_out[:, None] & in_d)

    @triton.jit
    def _sum_set_grads_kernel(grad_out_ptr, dest_ptr, grad_src_ptr, n_rows, width, features,
                              NUM_SETS: tl.constexpr, ACC_DTYPE: tl.constexpr,
                              BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                              D_CHUNKS: tl.constexpr):
        """grad_src[row] = sum over the sets s that kept row of grad_out[dest[s, row]]."""
        rows = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        in_src = rows < n_rows
        sample = rows // width
        col = rows % width
        for chunk in tl.range(0, D_CHUNKS):
            d = chunk * BLOCK_D + tl.arange(0, BLOCK_D)
            in_d = (d < features)[None, :]
            acc = tl.zeros((BLOCK_T, BLOCK_D), dtype=ACC_DTYPE)
            for s in tl.range(0, NUM_SETS):
                slot = tl.load(dest_ptr + (sample * NUM_SETS + s) * width + col, mask=in_src,
                               other=-1)
                g = tl.load(grad_out_ptr + slot[:, None] * features + d[None, :],
                            mask=(slot >= 0)[:, None] & in_d, other=0.0)
                acc += g.to(ACC_DTYPE)
            tl.store(grad_src_ptr + rows[:, None] * features + d[None, :],
                     acc.to(grad_src_ptr.dtype.element_ty), mask=in_src[:, None] & in_d)


# ----------------------------------------------------------------------------------------------
# Launchers and autograd
# ----------------------------------------------------------------------------------------------

def _copy_tile(features: int) -> dict:
    """Tile of the copy kernels: BLOCK_D features (a power of two) x BLOCK_T tokens, and
    the number of BLOCK_D chunks that cover a row."""
    block_d = min(next_power_of_2(features), COPY_MAX_WIDTH)
    block_t = max(1, COPY_TILE // block_d)
    return {"BLOCK_T": block_t, "BLOCK_D": block_d, "D_CHUNKS": triton.cdiv(features, block_d),
            **row_launch_config(block_t * block_d)}


def _alloc(shape, dtype, device):
    """Output buffers; tests swap in a NaN/sentinel filler to catch unwritten elements."""
    return torch.empty(shape, dtype=dtype, device=device)


def _launch_plan(keep, layout, positions, padding_side):
    """Gather index, positions, attention mask, cu_seqlens, max_seqlen and the inverse map
    dest [B*S*L] (output slot of each (set, token), -1 where not kept)."""
    batch, num_sets, width = keep.shape
    n_seqs, device = batch * num_sets, keep.device
    keep = keep.contiguous()
    lengths = keep.reshape(n_seqs, width).sum(1)
    cu_seqlens = torch.zeros(n_seqs + 1, dtype=torch.int32, device=device)
    cu_seqlens[1:] = lengths.cumsum(0)
    total, max_seqlen = (torch.stack([lengths.sum(), lengths.max()]).tolist() if n_seqs
                         else (0, 0))
    padded = layout == "padded"
    shape = (n_seqs, max_seqlen) if padded else (total,)
    index = _alloc(shape, torch.int64, device)
    position_ids = _alloc(shape, torch.int64, device)
    attention_mask = _alloc(shape, torch.int64, device) if padded else None
    dest = _alloc((n_seqs * width,), torch.int64, device)
    if n_seqs and width:
        block_l = min(next_power_of_2(width), PLAN_CHUNK)
        _compact_plan_kernel[(n_seqs,)](
            keep.view(torch.int8), lengths, cu_seqlens, index, position_ids,
            attention_mask if padded else index,  # unused when not padded
            dest, width, num_sets, max_seqlen,
            ORIGINAL=positions == "original", PADDED=padded, LEFT=padding_side == "left",
            BLOCK_L=block_l, L_CHUNKS=triton.cdiv(width, block_l),
            PAD_CHUNKS=triton.cdiv(max_seqlen, block_l) if padded else 0,
            **row_launch_config(block_l))
    return index, position_ids, attention_mask, cu_seqlens, max_seqlen, dest


def _launch_gather(hidden, index):
    features = hidden.shape[-1]
    out = _alloc((*index.shape, features), hidden.dtype, hidden.device)
    n_slots = index.numel()
    if n_slots and features:
        tile = _copy_tile(features)
        grid = (triton.cdiv(n_slots, tile["BLOCK_T"]),)
        _gather_rows_kernel[grid](hidden, index, out, n_slots, features, **tile)
    return out


def _launch_sum_set_grads(grad_out, dest, hidden_shape, num_sets, dtype):
    batch, width, features = hidden_shape
    grad = _alloc(tuple(hidden_shape), dtype, grad_out.device)
    n_rows = batch * width
    if n_rows and features:
        tile = _copy_tile(features)
        grid = (triton.cdiv(n_rows, tile["BLOCK_T"]),)
        acc = tl.float64 if dtype == torch.float64 else tl.float32
        _sum_set_grads_kernel[grid](grad_out.contiguous(), dest, grad, n_rows, width, features,
                                    NUM_SETS=num_sets, ACC_DTYPE=acc, **tile)
    return grad


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, index, dest, num_sets):
        ctx.save_for_backward(dest)
        ctx.hidden_shape, ctx.num_sets, ctx.dtype = hidden.shape, num_sets, hidden.dtype
        return _launch_gather(hidden.contiguous(), index)

    @staticmethod
    def backward(ctx, grad_out):
        (dest,) = ctx.saved_tensors
        grad = _launch_sum_set_grads(grad_out, dest, ctx.hidden_shape, ctx.num_sets, ctx.dtype)
        return grad, None, None, None


def _compact_triton(hidden, keep, layout, positions, padding_side):
    index, position_ids, attention_mask, cu_seqlens, max_seqlen, dest = _launch_plan(
        keep, layout, positions, padding_side)
    out = _GatherRows.apply(hidden, index, dest, keep.shape[1])
    return Compacted(out, position_ids, index, cu_seqlens, max_seqlen, attention_mask)


class _CudaCompact(torch.autograd.Function):
    """The CUDA library's compaction; backward scatters each output row's gradient home."""

    @staticmethod
    def forward(ctx, hidden, keep, layout, positions, padding_side):
        out, position_ids, index, cu_seqlens, max_seqlen, attention_mask = \
            load_cuda_library().compact(hidden, keep, layout=layout, positions=positions,
                                        padding_side=padding_side)
        ctx.save_for_backward(index)
        ctx.hidden_shape = hidden.shape
        ctx.mark_non_differentiable(
            *(t for t in (position_ids, index, cu_seqlens, attention_mask) if t is not None))
        return out, position_ids, index, cu_seqlens, max_seqlen, attention_mask

    @staticmethod
    def backward(ctx, grad_out, *unused):
        (index,) = ctx.saved_tensors
        batch, width, features = ctx.hidden_shape
        flat_index = index.reshape(-1)
        rows = flat_index >= 0
        grad = grad_out.new_zeros(batch * width, features)
        grad.index_add_(0, flat_index[rows], grad_out.reshape(-1, features)[rows])
        return grad.view(batch, width, features), None, None, None, None


def _compact_cuda(hidden, keep, layout, positions, padding_side):
    return Compacted(*_CudaCompact.apply(hidden, keep, layout, positions, padding_side))
