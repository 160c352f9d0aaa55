"""PyTorch reference for token compaction, and the obvious baseline it is benchmarked against.

This is the oracle in tests and the production CPU path. ``keep`` is bool [B, S, L] (S keep-sets
per sample); output sequence r = b * S + s holds the tokens of set s of sample b in their
original order:

* varlen: rows concatenated, ``cu_seqlens`` int32 [B*S + 1] with a leading 0;
* padded: [B*S, max_seqlen, D], padding rows zero, on the right (``padding_side="right"``)
  or on the left;
* ``index``: the row of ``hidden.reshape(B * L, D)`` each output token was copied from (-1 at
  padding); ``position_ids``: the token's original index l, or its rank 0..n-1 (0 at padding).

The gather is ``index_select``, so autograd's backward is a scatter-add into ``hidden``.
"""
from __future__ import annotations

import torch
from torch.nn.utils.rnn import pad_sequence


def compact_ref(hidden, keep, layout, positions, padding_side):
    """Returns (hidden, position_ids, index, cu_seqlens, max_seqlen, attention_mask)."""
    batch, num_sets, width = keep.shape
    sets = keep.reshape(batch * num_sets, width)
    lengths = sets.sum(1)
    cu_seqlens = torch.zeros(batch * num_sets + 1, dtype=torch.int32, device=keep.device)
    cu_seqlens[1:] = lengths.cumsum(0)
    max_seqlen = int(lengths.max()) if lengths.numel() else 0
    set_id, col = sets.nonzero(as_tuple=True)  # row-major: set by set, original order within
    rank = torch.arange(col.numel(), device=keep.device) - cu_seqlens[set_id].long()
    index = (set_id // num_sets) * width + col
    position_ids = col if positions == "original" else rank
    flat = hidden.reshape(batch * width, hidden.shape[-1])
    if layout == "varlen":
        return flat.index_select(0, index), position_ids, index, cu_seqlens, max_seqlen, None

    slot = rank if padding_side == "right" else rank + (max_seqlen - lengths[set_id])
    where = (set_id, slot)
    shape = (batch * num_sets, max_seqlen)
    index_out = index.new_full(shape, -1).index_put_(where, index)
    positions_out = index.new_zeros(shape).index_put_(where, position_ids)
    attention_mask = index.new_zeros(shape).index_put_(where, torch.ones_like(index))
    # One gather straight into the padded layout; padding slots read row 0, then get zeroed.
    padded = flat.index_select(0, index_out.clamp_min(0).flatten())
    padded.index_fill_(0, torch.nonzero(index_out.flatten() < 0).flatten(), 0)
    padded = padded.view(*shape, flat.shape[1])
    return padded, positions_out, index_out, cu_seqlens, max_seqlen, attention_mask


def compact_naive(hidden, keep):
    """The obvious way: boolean indexing per set, then ``pad_sequence`` (right padding).
    Returns (padded hidden [B*S, max_seqlen, D], attention_mask [B*S, max_seqlen])."""
    batch, num_sets, _ = keep.shape
    rows = [hidden[b][keep[b, s]] for b in range(batch) for s in range(num_sets)]
    padded = pad_sequence(rows, batch_first=True)
    mask = pad_sequence([torch.ones(len(r), dtype=torch.long, device=hidden.device)
                         for r in rows], batch_first=True)
    return padded, mask
