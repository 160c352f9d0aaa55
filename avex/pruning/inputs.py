"""``prune_inputs``: each row's text and chosen audio-visual tokens, in their original order,
compacted into a left-padded batch with the positions (and extra per-token inputs) of the
unpruned sequence; and the keep-sets it applies (scores, a policy, or given)."""
from __future__ import annotations

from typing import NamedTuple

import torch

from avex import _checks
from avex.kernels.compact import compact
from avex.kernels.gumbel_topk import gumbel_topk
from avex.modality import (AUDIO, PAD, TEXT, VISUAL, check_code_values, check_codes,
                           signed_codes)
from avex.policy import AVEXPolicy, check_finite_tokens
from avex.selection import AVLayout, num_kept

__all__ = ["PrunedInputs", "prune_inputs", "expand_av_keep", "gather_tokens", "select_keep",
           "item_index", "row_retention", "RESERVED_INPUTS"]

#: keywords a per-token input may not be named: the model's own inputs
RESERVED_INPUTS = ("inputs_embeds", "input_ids", "attention_mask", "position_ids",
                   "past_key_values", "cache")


class PrunedInputs(NamedTuple):
    """Output of :func:`prune_inputs`; R = B * S rows (S keep-sets per sample, row b * S + s).

    Attributes:
        inputs_embeds: [R, L', D] the kept tokens in original order, left-padded with zeros.
        attention_mask: int64 [R, L'], 1 at tokens, 0 at padding.
        position_ids: int64 [R, L'] (or [..., R, L'] for a model's own positions of higher
            rank), original positions (or 0..n-1 with ``positions="contiguous"``); 0 at
            padding.
        next_position: int64 [R] (or [..., R] like ``position_ids``), the position of the
            first generated token: the last original token's position + 1, on each axis (or
            n with ``"contiguous"``), whether that token was kept or not.
        keep: bool [B, S, L], the keep-sets applied, in the input layout (text True,
            padding False).
        index: int64 [R, L'], the row of ``inputs_embeds_in.reshape(B * L, D)`` each token
            came from; -1 at padding.
        per_token: name -> [R, L', ...] extra per-token model inputs gathered like the
            embeddings (zero at padding); empty when none were given.
        original_length: int64 [R], the number of non-padding tokens of the unpruned row.
        av_count: int64 [R], the number of audio-visual tokens of the unpruned row (an M-RoPE
            model places them with positions of rank 3, which :func:`generate` checks).
    """
    inputs_embeds: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    next_position: torch.Tensor
    keep: torch.Tensor
    index: torch.Tensor
    per_token: dict | None = None
    original_length: torch.Tensor | None = None
    av_count: torch.Tensor | None = None

    @property
    def num_sets(self) -> int:
        return self.keep.shape[1]


def prune_inputs(inputs_embeds: torch.Tensor, modality: torch.Tensor, *, scores=None,
                 keep=None, retention=None, positions: str = "original", position_ids=None,
                 per_token: dict | None = None, policy=None,
                 per_item: bool = False) -> PrunedInputs:
    """Keep the text and the chosen audio-visual tokens; compact them for prefill.

    Args:
        inputs_embeds: [B, L, D] the full input embeddings, padded on either side.
        modality: int [B, L], one of ``PAD`` (-1), ``VISUAL`` (0), ``AUDIO`` (1), ``TEXT`` (2)
            per position (unsigned codes, e.g. uint8, are read as their values: no padding).
        scores: float [B, L] keep scores aligned with ``inputs_embeds``; only the values at
            audio-visual positions are read. With ``retention``, each sample keeps its
            K = round(rho * N) highest-scoring AV tokens (N = its AV tokens; ties toward the
            lower position; at least 1 where N >= 1).
        keep: bool [B, L] or [B, S, L] instead of scores: True keeps an AV token. It must keep
            every text token; padding is dropped whatever it says. S > 1 gives S pruned
            variants of each sample (e.g. an anchor and its counterfactuals), read from the one
            copy of ``inputs_embeds``.
        retention: rho in (0, 1], used with ``scores`` or ``policy``; or one rho per row: a
            1-D tensor (or list) [B], each value read as a Python float (a float32 tensor's
            0.3 is 0.30000001...), exactly as a call on that row alone with that number.
        policy: a trained :class:`avex.policy.AVEXPolicy` (``avex.load_policy``) that scores
            the AV tokens instead of ``scores`` (:meth:`~avex.policy.AVEXPolicy.score`); inputs
            of another width or layout than it was trained on are refused. A policy saved
            with a ``merge_threshold`` folds the dropped tokens into the kept ones they
            duplicate (:func:`avex.merging.merge_dropped`; per item with ``per_item``).
        per_item: with ``retention``, keep K = round(rho * N) tokens of each item (a maximal
            run of one modality's tokens, :func:`item_index`: an image, a video) instead of
            of each row; a ``policy`` then scores each item alone with its row's text, as if
            it were the row's only audio-visual tokens. The selection of a server that sees
            one media item at a time (``avex.integrations.vllm``).
        positions: ``"original"`` (each token keeps its position in the unpruned sequence) or
            ``"contiguous"`` (0..n-1).
        position_ids: int [B, L] or [..., B, L] (M-RoPE / TMRoPE: [3, B, L]), the model's own
            positions of the unpruned sequence; default: the count of non-padding tokens.
            Only with ``positions="original"``.
        per_token: name -> [B, L, ...] extra per-token inputs the model takes beside
            ``inputs_embeds`` (Gemma 3n: ``{"per_layer_inputs": ...}``); gathered with the
            same index, and passed to the model at prefill by :func:`generate`.

    Returns:
        :class:`PrunedInputs`. Differentiable w.r.t. ``inputs_embeds``.
    """
    modality = _check_inputs(inputs_embeds, modality, positions)
    _check_native(position_ids, per_token, modality, positions)
    is_av = (modality == VISUAL) | (modality == AUDIO)
    is_text = modality == TEXT
    if keep is not None:
        if policy is not None:
            raise ValueError("pass policy or scores or keep, not several; got policy together "
                             "with keep")
        if scores is not None or retention is not None:
            raise ValueError("pass either keep, or scores with retention; got keep together "
                             f"with {'scores' if scores is not None else 'retention'}")
        if per_item:
            raise ValueError("per_item applies to scores or policy with retention, not keep")
        keep = _check_keep(keep, modality, is_text)
    else:
        keep = select_keep(inputs_embeds, modality, scores=scores, policy=policy,
                           retention=retention, per_item=per_item)[:, None, :]
        if policy is not None:   # a policy saved with a merge threshold serves merged tokens
            inputs_embeds = policy.merge(inputs_embeds, modality, keep[:, 0],
                                         groups=item_index(modality) if per_item else None)
    keep = (keep & is_av[:, None, :]) | is_text[:, None, :]

    out = compact(inputs_embeds, keep, layout="padded", positions="contiguous",
                  padding_side="left")
    present = modality != PAD
    num_sets = keep.shape[1]
    original_length = present.sum(1).repeat_interleave(num_sets)
    position_ids, next_position = _kept_positions(out, present, position_ids, positions,
                                                  num_sets, original_length)
    extras = {name: gather_tokens(value, out.index, batch_first=True)
              for name, value in (per_token or {}).items()}
    av_count = is_av.sum(1).repeat_interleave(num_sets)
    return PrunedInputs(out.hidden, out.attention_mask, position_ids, next_position, keep,
                        out.index, extras, original_length, av_count)


def _kept_positions(out, present, position_ids, positions: str, num_sets: int,
                    original_length) -> tuple[torch.Tensor, torch.Tensor]:
    """(position ids of the kept tokens, the first generated token's position) of the compacted
    ``out``: contiguous, a count of the unpruned row's tokens, or the model's own
    ``position_ids`` (any rank) gathered; ``present``: the unpruned rows' non-padding tokens."""
    if positions == "contiguous":
        return out.position_ids, out.lengths
    if position_ids is None:
        original = (present.long().cumsum(1) - 1).clamp_min(0)
        return gather_tokens(original, out.index), original_length
    native = position_ids.long()
    # decoding continues after the row's last token, axis by axis (as generate does)
    columns = torch.arange(present.shape[1], device=present.device)
    last = torch.where(present, columns, -1).amax(1)
    next_position = native[..., torch.arange(present.shape[0]), last] + 1
    next_position = next_position.repeat_interleave(num_sets, dim=-1)
    return gather_tokens(native, out.index), next_position


def gather_tokens(values: torch.Tensor, index: torch.Tensor, *, batch_first: bool = False):
    """Gather per-token values [..., B, L] (positions), or [B, L, ...] with ``batch_first``,
    with a compaction ``index`` (rows of the flattened [B * L]; -1 at padding, which reads 0),
    in the padded ([R, L']) or varlen ([total]) layout alike."""
    safe = index.clamp_min(0)
    if not batch_first:
        flat = values.reshape(*values.shape[:-2], -1)
        out = flat[..., safe]
        return out.masked_fill(index < 0, 0)
    flat = values.reshape(-1, *values.shape[2:])
    out = flat[safe]
    pad = (index < 0).reshape(*index.shape, *([1] * (values.dim() - 2)))
    return out.masked_fill(pad, 0)


def expand_av_keep(av_keep: torch.Tensor, modality: torch.Tensor) -> torch.Tensor:
    """Map keep-sets over the AV tokens (in order of appearance, e.g. ``Exchanges.sets()``
    [B, S, M]) onto the sequence layout [B, S, L] that ``prune_inputs`` takes.

    Column j of ``av_keep`` is the j-th visual-or-audio position of the row; columns past a
    row's AV count are ignored. Text positions are True (text is never pruned), padding False.
    """
    _checks.tensor("av_keep", av_keep, ndim=(2, 3), boolean=True)
    _checks.tensor("modality", modality, ndim=2, integer=True)
    _checks.same_device("av_keep", av_keep, "modality", modality)
    modality = check_code_values("modality", modality)
    squeeze = av_keep.dim() == 2
    av_keep = av_keep[:, None, :] if squeeze else av_keep
    batch = modality.shape[0]
    is_av = (modality == VISUAL) | (modality == AUDIO)
    if av_keep.shape[0] != batch:
        raise ValueError(f"av_keep has {av_keep.shape[0]} rows but modality has {batch}")
    most = int(is_av.sum(1).max()) if batch else 0
    if av_keep.shape[-1] < most:
        raise ValueError(f"av_keep has {av_keep.shape[-1]} columns but a row of modality has "
                         f"{most} audio-visual tokens")
    # Non-AV positions read an extra all-False column.
    av_keep = torch.cat([av_keep, av_keep.new_zeros(*av_keep.shape[:2], 1)], dim=2)
    column = torch.where(is_av, is_av.long().cumsum(1) - 1, av_keep.shape[-1] - 1)
    full = av_keep.gather(2, column[:, None, :].expand(-1, av_keep.shape[1], -1))
    full = full | (modality == TEXT)[:, None, :]
    return full[:, 0] if squeeze else full


def _check_inputs(inputs_embeds, modality, positions):
    _checks.tensor("inputs_embeds", inputs_embeds, ndim=3, floating=True)
    _checks.tensor("modality", modality, ndim=2, integer=True)
    _checks.same_device("modality", modality, "inputs_embeds", inputs_embeds)
    _checks.choice("positions", positions, ("original", "contiguous"))
    if modality.shape != inputs_embeds.shape[:2]:
        raise ValueError(f"modality must have shape {list(inputs_embeds.shape[:2])} "
                         f"(the [B, L] of inputs_embeds), got {list(modality.shape)}")
    check_codes(modality)
    return signed_codes(modality)


def _check_native(position_ids, per_token, modality, positions):
    batch, width = modality.shape
    if position_ids is not None:
        _checks.tensor("position_ids", position_ids, integer=True)
        _checks.same_device("position_ids", position_ids, "modality", modality)
        if positions != "original":
            raise ValueError("position_ids are the model's own positions of the unpruned "
                             f"sequence and need positions='original', got {positions!r}")
        if position_ids.dim() < 2 or position_ids.shape[-2:] != modality.shape:
            raise ValueError(f"position_ids must have shape [{batch}, {width}] or "
                             f"[..., {batch}, {width}] (the [B, L] of inputs_embeds), got "
                             f"{list(position_ids.shape)}")
    if per_token is None:
        return
    if not isinstance(per_token, dict):
        raise TypeError(f"per_token must be a dict of name -> tensor, got "
                        f"{type(per_token).__name__}")
    for name, value in per_token.items():
        _checks.tensor(f"per_token[{name!r}]", value)
        _checks.same_device(f"per_token[{name!r}]", value, "modality", modality)
        if value.dim() < 2 or value.shape[:2] != modality.shape:
            raise ValueError(f"per_token[{name!r}] must have shape [{batch}, {width}, ...] "
                             f"(the [B, L] of inputs_embeds first), got {list(value.shape)}")
        if name in RESERVED_INPUTS:
            raise ValueError(f"per_token may not hold {name!r}: generate passes it from pruned")


def _check_keep(keep, modality, is_text):
    _checks.tensor("keep", keep, ndim=(2, 3), boolean=True)
    _checks.same_device("keep", keep, "modality", modality)
    keep = keep[:, None, :] if keep.dim() == 2 else keep
    if keep.shape[0] != modality.shape[0] or keep.shape[-1] != modality.shape[1]:
        batch, width = modality.shape
        raise ValueError(f"keep must have shape [{batch}, {width}] or [{batch}, S, {width}], "
                         f"got {list(keep.shape)}")
    if keep.shape[1] == 0:
        raise ValueError(f"keep must hold at least one set per sample, got {list(keep.shape)}")
    dropped_text = is_text[:, None, :] & ~keep
    if bool(dropped_text.any()):
        b, s, pos = torch.nonzero(dropped_text)[0].tolist()
        raise ValueError(f"keep drops text token {pos} of sample {b} (set {s}); text is never "
                         "pruned")
    return keep


def select_keep(inputs_embeds: torch.Tensor, modality: torch.Tensor, *, scores=None,
                policy=None, retention=None, per_item: bool = False) -> torch.Tensor:
    """bool [B, L]: the audio-visual tokens :func:`prune_inputs` keeps with ``scores`` or a
    ``policy`` at ``retention`` (K = round(rho N) per row, or per item with ``per_item``;
    ties toward the lower position). A policy selects by its own rule (its
    ``config.selection``: Top-K, or set-aware selection over its hidden states). The selection
    alone, for a caller that compacts by itself (``avex.integrations.vllm`` keeps the rows of
    one media item)."""
    modality = signed_codes(modality)
    if policy is not None:
        if not isinstance(policy, AVEXPolicy):
            raise TypeError(f"policy must be an avex.policy.AVEXPolicy (avex.load_policy), got "
                            f"{type(policy).__name__}")
        if scores is not None:
            raise ValueError("pass policy or scores or keep, not several; got policy together "
                             "with scores")
        if retention is None:
            raise ValueError("retention is required with policy")
        policy.check_inputs(inputs_embeds, modality)   # before per_item copies the rows
        check_finite_tokens(inputs_embeds, modality)
        retention = row_retention(retention, modality.shape[0])
        if policy.trained_on is not None:
            for rho in sorted(set(retention if isinstance(retention, list) else [retention])):
                policy.trained_on.check_retention(rho)
    elif scores is None or retention is None:
        missing = "scores" if scores is None else "retention"
        raise ValueError(f"{missing} is required: pass scores with retention, or keep")
    retention = row_retention(retention, modality.shape[0])
    _checks.flag("per_item", per_item)
    if scores is not None:
        _check_scores(scores, modality)
    choose = _per_item_keep if per_item else _row_keep
    return choose(inputs_embeds, modality, scores, policy, retention)


def row_retention(retention, rows: int) -> float | list[float]:
    """``retention`` checked: one rho in (0, 1] for every row, or one per row (a 1-D tensor
    or a list of ``rows`` numbers), returned as a float or a list of floats."""
    if _is_array(retention):   # a numpy array: as the tensor it would be
        retention = torch.from_numpy(retention) if retention.ndim else retention.item()
    if isinstance(retention, torch.Tensor) and retention.dim() == 0:
        retention = retention.item()
    if not isinstance(retention, (torch.Tensor, list, tuple)):
        return _checks.ratio("retention", retention)
    if isinstance(retention, torch.Tensor):
        if retention.dim() != 1 or retention.is_complex() or retention.dtype == torch.bool:
            raise ValueError(f"retention must be a number in (0, 1] or a 1-D tensor [B] of "
                             f"them, one per row, got a {retention.dtype} tensor of shape "
                             f"{list(retention.shape)}")
        retention = retention.detach().cpu().tolist()
    if len(retention) != rows:
        raise ValueError(f"retention holds {len(retention)} values but inputs_embeds has "
                         f"{rows} rows; pass one per row, or one number for all")
    return [_checks.ratio(f"retention[{b}]", rho) for b, rho in enumerate(retention)]


def _is_array(value) -> bool:
    """Whether ``value`` is a numpy array (numpy is not imported for the test)."""
    return type(value).__module__ == "numpy" and hasattr(value, "ndim") and hasattr(value,
                                                                                  "dtype")


def _kept_counts(retention, counts: torch.Tensor, rows=None) -> torch.Tensor:
    """K = round(rho N) for each entry of ``counts``, rho the one retention or the retention
    of its row (``rows[i]``: the row of entry i; default: entry i is row i)."""
    if not isinstance(retention, list):
        return num_kept(retention, counts)
    rows = range(len(counts)) if rows is None else rows.tolist()
    if not len(counts):
        return counts.new_zeros(0)
    return torch.stack([num_kept(retention[r], n) for r, n in zip(rows, counts)])


def item_index(modality: torch.Tensor) -> torch.Tensor:
    """int64 [B, L]: each audio-visual token's item within its row (0, 1, ...: maximal runs of
    one modality's tokens, in order), -1 at text and padding. In Qwen-family prompts every
    image, video or audio clip is one run, its markers (vision_start / vision_end) on either
    side; a video with its audio interleaved in chunks (Qwen2.5-Omni's use_audio_in_video) is
    many runs."""
    _checks.tensor("modality", modality, ndim=2, integer=True)
    modality = signed_codes(modality)
    is_av = (modality == VISUAL) | (modality == AUDIO)
    previous = torch.cat([modality.new_full((modality.shape[0], 1), PAD), modality[:, :-1]], 1)
    starts = is_av & (previous != modality)
    return torch.where(is_av, starts.long().cumsum(1) - 1, -1)


def _row_keep(inputs_embeds, modality, scores, policy, retention):
    hidden = None
    if policy is not None and policy.set_aware:
        scores, hidden = policy.score(inputs_embeds, modality, retention=retention,
                                      with_hidden=True)
    elif policy is not None:
        scores = policy.score(inputs_embeds, modality, retention=retention)
    is_av = (modality == VISUAL) | (modality == AUDIO)
    return _top_k_keep(scores, retention, modality, is_av, policy=policy, hidden=hidden)


def _per_item_keep(inputs_embeds, modality, scores, policy, retention):
    """bool [B, L]: each item's K = round(rho N) best tokens; each item is scored (by the
    policy) in a copy of its row where the other items' tokens are padding."""
    items = item_index(modality)
    counts = items.amax(1) + 1                          # [B] items per row
    row_of = torch.repeat_interleave(torch.arange(len(counts), device=modality.device), counts)
    first = torch.cumsum(counts, 0) - counts
    item_of = torch.arange(len(row_of), device=modality.device) - first[row_of]
    own = items[row_of] == item_of[:, None]             # [R, L]: item r's positions
    is_av = (modality == VISUAL) | (modality == AUDIO)
    codes = torch.where(is_av[row_of] & ~own, PAD, modality[row_of])
    hidden = None
    # each item's copy of its row is scored at its row's retention
    rho = [retention[r] for r in row_of.tolist()] if isinstance(retention, list) else retention
    if policy is not None and policy.set_aware:
        scores, hidden = policy.score(inputs_embeds[row_of], codes, retention=rho,
                                      with_hidden=True)
    elif policy is not None:
        scores = policy.score(inputs_embeds[row_of], codes, retention=rho)
    else:
        scores = scores[row_of] if len(row_of) else scores[:0]
    chosen = _top_k_keep(scores, retention, codes, own, rows=row_of, policy=policy,
                         hidden=hidden, items=item_of)
    keep = torch.zeros(modality.shape, dtype=torch.long, device=modality.device)
    return keep.index_add_(0, row_of, chosen.long()) > 0


def _top_k_keep(scores, retention, modality, is_av, rows=None, policy=None, hidden=None,
                items=None):
    """bool [B, L]: each row's K = round(rho N) AV tokens by ``policy``'s selection rule
    (Top-K of ``scores`` without a policy; set-aware selection reads ``hidden`` [B, L, D]).
    With ``rows`` (and ``items``), row i is item ``items[i]`` of sample ``rows[i]``."""
    k = _kept_counts(retention, is_av.sum(1), rows)
    av_scores = torch.where(is_av, scores.detach(), torch.full_like(scores, float("-inf")))
    for bad, what in ((torch.isnan(av_scores), "NaN"), (torch.isposinf(av_scores), "+inf")):
        if bool(bad.any()):
            b, pos = torch.nonzero(bad)[0].tolist()
            where = f"audio-visual position {pos} of {_sample(b, rows, items)}"
            if policy is not None:  # its inputs were checked finite: the policy itself is off
                raise ValueError(f"the policy's scores contain {what} at {where}, though "
                                 "inputs_embeds is finite at every token; check the policy's "
                                 "weights (avex.load_policy)")
            raise ValueError(f"scores contains {what} at {where}; scores must be finite there "
                             "(-inf: never keep)")
    selectable = (av_scores > float("-inf")).sum(1)
    short = selectable < k
    if bool(short.any()):
        b = int(torch.nonzero(short)[0, 0])
        rho = retention if not isinstance(retention, list) else \
            retention[b if rows is None else int(rows[b])]
        raise ValueError(f"scores: {_sample(b, rows, items)} has {int(selectable[b])} "
                         f"audio-visual tokens with a score > -inf, but retention={rho} keeps "
                         f"{int(k[b])} of its {int(is_av[b].sum())}; give its tokens finite "
                         "scores, or pass keep")
    # Top-K over the AV axis [B, M], not the whole sequence [B, L]: a long prompt must not
    # widen the rows the kernel ranks. Order is kept, so ties still go to the lower position.
    layout = AVLayout.of(modality)
    av_scores = layout.gather(av_scores)
    keep = torch.zeros_like(is_av)
    rows = torch.nonzero(k > 0).flatten()
    if not rows.numel():
        return keep
    if hidden is not None:
        indices, _ = policy.select(av_scores[rows], layout.gather_vectors(hidden)[rows], k[rows])
    else:
        indices, _ = gumbel_topk(av_scores[rows], k[rows], sample=False)
    chosen = indices >= 0
    positions = layout.positions[rows].gather(1, indices.clamp_min(0))
    keep[rows[:, None].expand_as(indices)[chosen], positions[chosen]] = True
    return keep


def _check_scores(scores, modality):
    _checks.tensor("scores", scores, ndim=2, floating=True)
    _checks.same_device("scores", scores, "modality", modality)
    if scores.shape != modality.shape:
        raise ValueError(f"scores must have shape {list(modality.shape)} (one per position of "
                         f"inputs_embeds), got {list(scores.shape)}")


def _sample(b: int, rows=None, items=None) -> str:
    """How an error names row ``b`` of :func:`_top_k_keep`: a sample, or an item of one."""
    if rows is None:
        return f"sample {b}"
    item = "" if items is None else f"item {int(items[b])} of "
    return f"{item}sample {int(rows[b])}"
