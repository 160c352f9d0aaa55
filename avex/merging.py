"""Merging the dropped audio-visual tokens into the kept ones they duplicate.

A keep-set drops tokens; many of them (a static scene's patches across frames, a held tone)
nearly repeat a kept token. :func:`merge_dropped` folds each such dropped token into the kept
token it is most like, so the compacted sequence has the same length but carries what the
near-duplicates held. A policy saved with ``merge_threshold`` (``--merge-threshold``) is
served this way wherever it selects: :func:`avex.pruning.prune_inputs`, the evaluation's
selector, and the vLLM plugin.

The rule, per row and within one group (by default a modality; per item where items are
scored alone):

- every dropped token finds the kept token of its group with the highest cosine similarity of
  the embeddings (ties: the earliest kept token);
- where that similarity is at least ``threshold`` the dropped token joins that kept token;
- a kept token becomes the plain mean of itself and the tokens that joined it (each original
  token counts once); a kept token nothing joined, text and padding are returned unchanged.

The similarities and means are computed in float32 (float64 for a float64 input) and the
result cast back to the input's dtype.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from avex import _checks
from avex.modality import AUDIO, VISUAL, signed_codes

__all__ = ["merge_dropped", "check_merge_threshold", "parse_merge_threshold", "NO_MERGING"]

#: dropped tokens compared with the kept ones at a time (bounds the similarity block's memory)
_CHUNK = 4096


def check_merge_threshold(name: str, value) -> float | None:
    """None (no merging) or a cosine similarity in [-1, 1]."""
    if value is None:
        return None
    return _checks.real(name, value, low=-1.0, high=1.0)


#: what the command line's "none" parses to (a flag's None means "not given" there)
NO_MERGING = "none"


def parse_merge_threshold(text: str) -> float | str:
    """A command line's threshold: a number, or "none" (no merging: :data:`NO_MERGING`, read
    as None by the training's settings)."""
    if text.strip().lower() == "none":
        return NO_MERGING
    return float(text)


parse_merge_threshold.__name__ = "number or 'none'"   # argparse's "invalid ... value"


def merge_dropped(inputs_embeds: torch.Tensor, modality: torch.Tensor, keep: torch.Tensor,
                  threshold: float, *, groups: torch.Tensor | None = None) -> torch.Tensor:
    """[B, L, D]: ``inputs_embeds`` with each kept audio-visual token replaced by the mean of
    itself and the dropped tokens that join it (the module's rule).

    Args:
        inputs_embeds: [B, L, D] floating embeddings.
        modality: int [B, L] codes (:mod:`avex.modality`); only VISUAL and AUDIO tokens merge.
        keep: bool [B, L], True at the kept tokens (read at audio-visual positions only).
        threshold: the cosine similarity from which a dropped token joins, in [-1, 1].
        groups: int [B, L], optional: tokens merge only within one value (e.g.
            :func:`avex.pruning.item_index`); default: the modality.
    """
    _checks.tensor("inputs_embeds", inputs_embeds, ndim=3, floating=True)
    _checks.tensor("modality", modality, ndim=2, integer=True)
    _checks.tensor("keep", keep, ndim=2, boolean=True)
    threshold = _checks.real("threshold", threshold, low=-1.0, high=1.0)
    shape = tuple(inputs_embeds.shape[:2])
    for name, value in (("modality", modality), ("keep", keep), ("groups", groups)):
        if value is not None and tuple(value.shape) != shape:
            raise ValueError(f"{name} has shape {list(value.shape)} but inputs_embeds has "
                             f"[B, L] = {list(shape)}")
    if groups is not None:
        _checks.tensor("groups", groups, ndim=2, integer=True)
    modality = signed_codes(modality)
    is_av = (modality == VISUAL) | (modality == AUDIO)
    groups = modality if groups is None else groups
    work = torch.float64 if inputs_embeds.dtype == torch.float64 else torch.float32
    out = inputs_embeds.clone()
    for row in range(shape[0]):
        kept = torch.nonzero(is_av[row] & keep[row]).flatten()
        dropped = torch.nonzero(is_av[row] & ~keep[row]).flatten()
        if len(kept) == 0 or len(dropped) == 0:
            continue
        x = inputs_embeds[row].to(work)
        joins, into = _joins(F.normalize(x, dim=-1), groups[row], kept, dropped, threshold)
        if len(joins) == 0:
            continue
        total = x[kept].index_add(0, into, x[joins])
        count = torch.ones(len(kept), dtype=work, device=x.device)
        count = count.index_add(0, into, torch.ones(len(joins), dtype=work, device=x.device))
        out[row, kept] = (total / count[:, None]).to(inputs_embeds.dtype)
    return out


def _joins(unit: torch.Tensor, groups: torch.Tensor, kept: torch.Tensor, dropped: torch.Tensor,
           threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions of the dropped tokens that join, the index into ``kept`` each joins)."""
    joins, into = [], []
    kept_unit, kept_group = unit[kept], groups[kept]
    for start in range(0, len(dropped), _CHUNK):
        part = dropped[start:start + _CHUNK]
        sim = unit[part] @ kept_unit.T
        sim = sim.masked_fill(groups[part][:, None] != kept_group[None, :], float("-inf"))
        best = sim.max(dim=1).values
        match = sim.argmax(dim=1)          # the first maximum: the earliest kept token
        ok = best >= threshold
        joins.append(part[ok])
        into.append(match[ok])
    return torch.cat(joins), torch.cat(into)
