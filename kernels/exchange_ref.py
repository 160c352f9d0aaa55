"""PyTorch reference for exchange-set construction (paper Section 3.3).

This is the oracle in tests and the production CPU path. For a sample with anchor set S (the
retained tokens) and an exchange type "xy" (remove modality x, insert modality y):

* G  = the g lowest-scoring tokens of S with modality x (lowest first);
* G' = the g highest-scoring tokens outside S with modality y and a score > -inf (highest first);
* ties go to the lower index on both sides, as in ``gumbel_topk``; -0.0 ties with +0.0;
* the group size is n = min(g, |candidates of G|, |candidates of G'|); the exchange is skipped
  (n = 0) when n < min(g, 2): a shortage that leaves fewer than 2 tokens skips, and g = 1 means
  single-token exchanges;
* delta_f = sum_{i in G} s_i - sum_{j in G'} s_j (0 when skipped), in float32 (float64 for
  float64 scores);
* the counterfactual keep-set is S' = S \\ G u G' (equal to S when skipped).

Arguments are assumed checked (see ``exchange.py``): ``type_codes`` is a list of
(removed, inserted) modality codes, 0 visual and 1 audio.
"""
from __future__ import annotations

import torch

from .gumbel_topk_ref import compute_dtype

EXCHANGE_TYPES = ("vv", "aa", "va", "av")
MODALITY_CODE = {"v": 0, "a": 1}


def type_codes(types) -> list[tuple[int, int]]:
    return [(MODALITY_CODE[t[0]], MODALITY_CODE[t[1]]) for t in types]


def group_width(g: int, width: int) -> int:
    """Columns of the removed / inserted outputs: no group can exceed g or the row width."""
    return min(g, width)


def position_mask(indices: torch.Tensor, width: int) -> torch.Tensor:
    """Bool [..., width], True at the non-negative entries of ``indices`` [..., K]."""
    mask = torch.zeros(*indices.shape[:-1], width + 1, dtype=torch.bool, device=indices.device)
    # -1 entries land in a spill column, so they can't mark position 0.
    mask.scatter_(-1, torch.where(indices >= 0, indices, width), True)
    return mask[..., :width]


def build_exchanges_ref(scores, indices, modality, g, codes):
    """(removed, inserted, group_size, delta_f, keep, anchor), as in ``exchange.Exchanges``."""
    batch, width = scores.shape
    s = scores.to(compute_dtype(scores.dtype))
    anchor = position_mask(indices, width)                                    # [B, M]
    removed_code = torch.tensor([c[0] for c in codes], device=scores.device)[:, None]
    inserted_code = torch.tensor([c[1] for c in codes], device=scores.device)[:, None]
    mod = modality[:, None, :]                                                # [B, 1, M]
    can_remove = anchor[:, None, :] & (mod == removed_code)                   # [B, T, M]
    can_insert = ~anchor[:, None, :] & (mod == inserted_code) & (s > float("-inf"))[:, None, :]

    n = torch.minimum(can_remove.sum(-1), can_insert.sum(-1)).clamp(max=g)
    n = torch.where(n >= min(g, 2), n, torch.zeros_like(n))
    cols = group_width(g, width)
    in_group = torch.arange(cols, device=scores.device) < n[..., None]       # [B, T, W]

    key = (s.detach() + 0.0)[:, None, :].expand(-1, len(codes), -1)         # + 0.0: -0.0 -> +0.0
    lowest = torch.sort(key.masked_fill(~can_remove, float("inf")), dim=-1,
                        stable=True).indices[..., :cols]
    highest = torch.sort(key.masked_fill(~can_insert, float("-inf")), dim=-1, descending=True,
                         stable=True).indices[..., :cols]
    removed = torch.where(in_group, lowest, -1)
    inserted = torch.where(in_group, highest, -1)

    s_t = s[:, None, :].expand(-1, len(codes), -1)
    zero = torch.zeros((), dtype=s.dtype, device=s.device)
    delta_f = (torch.where(in_group, s_t.gather(-1, lowest), zero).sum(-1)
               - torch.where(in_group, s_t.gather(-1, highest), zero).sum(-1))
    keep = (anchor[:, None, :] & ~position_mask(removed, width)) | position_mask(inserted, width)
    return removed, inserted, n, delta_f, keep, anchor


def build_exchanges_loop(scores, indices, modality, g, codes):
    """The obvious per-sample, per-type Python loop: the naive baseline in the benchmarks and an
    independent check on the reference. Same outputs as ``build_exchanges_ref``."""
    batch, width = scores.shape
    s = scores.to(compute_dtype(scores.dtype))
    cols = group_width(g, width)
    removed = torch.full((batch, len(codes), cols), -1, dtype=torch.int64, device=scores.device)
    inserted = removed.clone()
    size = torch.zeros(batch, len(codes), dtype=torch.int64, device=scores.device)
    keep = torch.zeros(batch, len(codes), width, dtype=torch.bool, device=scores.device)
    anchor = torch.zeros(batch, width, dtype=torch.bool, device=scores.device)
    deltas = []
    for b in range(batch):
        chosen = indices[b][indices[b] >= 0]
        anchor[b, chosen] = True
        row = []
        for t, (out_code, in_code) in enumerate(codes):
            out_pos = torch.nonzero(anchor[b] & (modality[b] == out_code)).flatten()
            in_pos = torch.nonzero(~anchor[b] & (modality[b] == in_code)
                                   & (s[b] > float("-inf"))).flatten()
            n = min(g, out_pos.numel(), in_pos.numel())
            n = n if n >= min(g, 2) else 0
            # stable sorts over positions in increasing order: ties keep the lower index first
            group = out_pos[torch.sort(s[b, out_pos].detach() + 0.0, stable=True).indices[:n]]
            cand = in_pos[torch.sort(s[b, in_pos].detach() + 0.0, descending=True,
                                     stable=True).indices[:n]]
            removed[b, t, :n], inserted[b, t, :n], size[b, t] = group, cand, n
            keep[b, t] = anchor[b]
            keep[b, t, group] = False
            keep[b, t, cand] = True
            row.append(s[b, group].sum() - s[b, cand].sum())
        deltas.append(torch.stack(row))
    delta_f = torch.stack(deltas) if batch else s.new_zeros(0, len(codes))
    return removed, inserted, size, delta_f, keep, anchor
