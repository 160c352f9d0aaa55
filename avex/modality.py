"""Modality codes: one per position of an LLM's ``inputs_embeds``.

====================  =====  ==========================================
``PAD``               -1     padding (left or right, or anywhere); dropped
``VISUAL``             0     a visual token; prunable
``AUDIO``              1     an audio token; prunable
``TEXT``               2     a text token (markers included); never pruned
====================  =====  ==========================================

Only the placeholder tokens a processor expands into visual or audio features are ``VISUAL`` or
``AUDIO``. Everything else the model reads is ``TEXT``: the chat template, the start/end markers
around a block (``<|vision_start|>``, ``<start_of_audio>``, ...), and LLaVA-OneVision's
newline token between image rows. :func:`codes_from_ids` builds the codes that way; Hugging
Face's own ``mm_token_type_ids`` (0 text, 1 image, 2 video) are a different code and are
refused by :func:`check_codes` when they would prune the text.
"""
from __future__ import annotations

from typing import Iterable

import torch

from avex import _checks

__all__ = ["PAD", "VISUAL", "AUDIO", "TEXT", "CODES", "check_code_values", "codes_from_ids",
           "check_codes", "check_attention_mask", "signed_codes"]

PAD, VISUAL, AUDIO, TEXT = -1, 0, 1, 2
CODES = (PAD, VISUAL, AUDIO, TEXT)


def _id_tensor(name: str, ids, like: torch.Tensor) -> torch.Tensor:
    ids = [ids] if isinstance(ids, int) and not isinstance(ids, bool) else list(ids)
    top = torch.iinfo(like.dtype).max
    for value in ids:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be token ids (int), got {value!r}")
        if value < 0:  # no input_ids position holds it: nothing would be coded
            raise ValueError(f"{name} must be token ids >= 0, got {value}")
        if value > top:
            raise ValueError(f"{name} must be token ids that fit input_ids' dtype {like.dtype} "
                             f"(at most {top}), got {value}")
    return torch.tensor(ids, dtype=like.dtype, device=like.device)


def check_attention_mask(attention_mask: torch.Tensor, input_ids: torch.Tensor | None = None, *,
                         name: str = "attention_mask") -> torch.Tensor:
    """A 2-D 0/1 mask (of the shape of ``input_ids`` where given); any other value (2, -1,
    0.5, NaN) is refused, naming where it is, rather than read as a token."""
    _checks.tensor(name, attention_mask, ndim=2)
    if input_ids is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(f"{name} must have the shape of input_ids "
                         f"{list(input_ids.shape)}, got {list(attention_mask.shape)}")
    bad = (attention_mask != 0) & (attention_mask != 1)
    if bool(bad.any()):
        b, pos = torch.nonzero(bad)[0].tolist()
        raise ValueError(f"{name} must hold 0 (padding) or 1 (token), got "
                         f"{attention_mask[b, pos].item()} at sample {b}, position {pos}")
    return attention_mask


def signed_codes(modality: torch.Tensor) -> torch.Tensor:
    """``modality`` as int64 where its dtype is unsigned (uint8 codes, e.g. from numpy, hold
    no PAD, so such rows simply have no padding; compared as they are, -1 would wrap to 255);
    any other tensor as it is."""
    if modality.is_floating_point() or modality.is_complex() or modality.dtype.is_signed \
            or modality.dtype == torch.bool:
        return modality
    return modality.long()


def check_code_values(name: str, value: torch.Tensor) -> torch.Tensor:
    """Every entry one of :data:`CODES` (unsigned codes read as their values, not wrapped);
    the error names ``name``, the value and where it is. Returns the codes as
    :func:`signed_codes`, so that comparisons with ``PAD`` hold."""
    value = signed_codes(value)
    bad = (value < PAD) | (value > TEXT)
    if bool(bad.any()):
        where = torch.nonzero(bad)[0].tolist()
        at = (f"sample {where[0]}, position {where[1]}" if len(where) == 2
              else f"index {tuple(where)}")
        raise ValueError(f"{name} must hold {PAD} (padding), {VISUAL} (visual), {AUDIO} (audio) "
                         f"or {TEXT} (text), got {int(value[tuple(where)])} at {at}")
    return value


def codes_from_ids(input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                   visual_ids: int | Iterable[int] = (),
                   audio_ids: int | Iterable[int] = ()) -> torch.Tensor:
    """int64 [B, L] modality codes from a processor's ``input_ids``.

    Positions holding one of ``visual_ids`` (image / video placeholder ids) are ``VISUAL``, one
    of ``audio_ids`` ``AUDIO``, positions where ``attention_mask`` is 0 ``PAD``, everything else
    ``TEXT`` (markers and newline tokens included)."""
    _checks.tensor("input_ids", input_ids, ndim=2, integer=True)
    visual = _id_tensor("visual_ids", visual_ids, input_ids)
    audio = _id_tensor("audio_ids", audio_ids, input_ids)
    both = set(visual.tolist()) & set(audio.tolist())
    if both:
        raise ValueError(f"token id(s) {sorted(both)} are in both visual_ids and audio_ids")
    codes = torch.full_like(input_ids, TEXT, dtype=torch.long)
    codes[torch.isin(input_ids, visual)] = VISUAL
    codes[torch.isin(input_ids, audio)] = AUDIO
    if attention_mask is not None:
        check_attention_mask(attention_mask, input_ids)
        codes[attention_mask == 0] = PAD
    return codes


def check_codes(modality: torch.Tensor, *, input_ids: torch.Tensor | None = None,
                placeholder_ids: Iterable[int] = ()) -> None:
    """Refuse modality codes that can't be right, naming the row and the reason: codes that
    aren't integers, a value outside {-1, 0, 1, 2}; a row with no text at all (e.g.
    ``torch.zeros_like(input_ids)`` with only the audio marked, or ``mm_token_type_ids`` of an
    image prompt); a row that begins and ends with audio-visual tokens and holds its text only
    in between (``mm_token_type_ids`` of a video prompt: the real text, 0 there, reads as
    VISUAL, the video, 2 there, as TEXT; a prompt's template and question sit at its ends);
    and, given ``input_ids`` and the placeholder ids, a row whose only "text" sits where the
    placeholders are."""
    _checks.tensor("modality", modality, ndim=2, integer=True)
    check_code_values("modality", modality)
    is_text = modality == TEXT
    no_text = ~is_text.any(1)
    if bool(no_text.any()):
        row = int(torch.nonzero(no_text)[0, 0])
        raise ValueError(f"modality row {row} has no text token (code 2); every prompt has "
                         "text, and text is what is never pruned. Build the codes from the "
                         "placeholder ids with avex.modality.codes_from_ids (Hugging Face's "
                         "mm_token_type_ids are a different code)")
    present = modality != PAD
    columns = torch.arange(modality.shape[1], device=modality.device)
    first = torch.where(present, columns, modality.shape[1]).amin(1)
    last = torch.where(present, columns, -1).amax(1)
    rows = torch.arange(modality.shape[0], device=modality.device)
    is_av = (modality == VISUAL) | (modality == AUDIO)
    av_ends = is_av[rows, first] & is_av[rows, last]
    if bool(av_ends.any()):
        row = int(torch.nonzero(av_ends)[0, 0])
        raise ValueError(
            f"modality row {row} begins and ends with audio-visual tokens (codes "
            f"{int(modality[row, first[row]])} and {int(modality[row, last[row]])}) and holds "
            "its text only in between: that is Hugging Face's mm_token_type_ids of a video "
            "prompt (0 text, 2 video), where the real text would be pruned, not modality "
            "codes. A prompt's template and question sit at its ends; build the codes with "
            "avex.modality.codes_from_ids")
    if input_ids is None:
        return
    _checks.tensor("input_ids", input_ids, ndim=2, integer=True)
    if input_ids.shape != modality.shape:
        raise ValueError(f"input_ids must have the shape of modality {list(modality.shape)}, "
                         f"got {list(input_ids.shape)}")
    placeholder = torch.isin(input_ids, _id_tensor("placeholder_ids", placeholder_ids,
                                                   input_ids))
    text_outside = (is_text & ~placeholder).any(1)
    if bool((~text_outside).any()):
        row = int(torch.nonzero(~text_outside)[0, 0])
        raise ValueError(f"modality row {row} codes as text only placeholder tokens (the "
                         "audio-visual features), so the real text would be pruned; build "
                         "the codes with avex.modality.codes_from_ids")


def packed_positions(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions [B, W], valid [B, W]): each row's True positions in order, packed to the
    left (W = the most any row has, at least 1); past a row's count the position is 0."""
    counts = mask.sum(1)
    width = max(int(counts.max()), 1) if mask.shape[0] else 1
    order = torch.sort((~mask).to(torch.int8), dim=1, stable=True).indices[:, :width]
    valid = torch.arange(width, device=mask.device) < counts[:, None]
    return order.masked_fill(~valid, 0), valid
