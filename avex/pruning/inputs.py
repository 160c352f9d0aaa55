"""Drop-in audio-visual token pruning for any Hugging Face ``*ForCausalLM`` that takes
``inputs_embeds``.

``prune_inputs`` keeps the text and the chosen audio-visual tokens of each sample, in their
original order, and compacts them into a left-padded batch with the positions RoPE would have
seen on the full sequence. ``generate`` runs ``model.generate`` on that batch and makes the decode
steps continue from the last original position + 1, so the pruned model sees exactly the full
sequence with the dropped tokens masked out of attention.

Modality codes (one per position of ``inputs_embeds``) are those of :mod:`avex.modality`.

Original positions count the non-padding tokens of the input row: the token at the i-th
non-padding slot has position i, whether or not the tokens before it were kept (the position
ids a Hugging Face model computes from the attention mask of the unpruned batch). A model with
its own position ids (Qwen2.5-VL's M-RoPE, Qwen2.5-Omni's TMRoPE: ``[3, B, L]``) passes them as
``position_ids``; they are gathered with the same index as the embeddings, and decoding
continues where the model's own generation would: after the last original token's position,
on each axis, even when that token was pruned. Extra per-token inputs (Gemma 3n's
``per_layer_inputs``) are gathered the same way and reach the prefill. :mod:`avex.adapters`
builds all of these from a processor's output.
"""
from __future__ import annotations

import contextlib
import importlib.util
import inspect
from typing import NamedTuple

import torch

from avex import _checks
from avex.kernels.compact import compact
from avex.kernels.gumbel_topk import gumbel_topk
from avex.modality import AUDIO, PAD, TEXT, VISUAL, check_code_values, check_codes
from avex.policy import AVEXPolicy
from avex.selection import AVLayout, num_kept

__all__ = ["PAD", "VISUAL", "AUDIO", "TEXT", "PrunedInputs", "prune_inputs", "generate",
           "forward", "expand_av_keep", "gather_tokens", "num_kept", "select_keep",
           "item_index"]

ATTENTION_PATHS = ("auto", "padded", "varlen")
VARLEN_REFERENCE_ATTENTION = "avex_varlen_sdpa"
_RESERVED_INPUTS = ("inputs_embeds", "input_ids", "attention_mask", "position_ids",
                    "past_key_values", "cache")
VARLEN_TORCH_ATTENTION = "avex_varlen_torch"


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


# ----------------------------------------------------------------------------------------------
# Pruning
# ----------------------------------------------------------------------------------------------

def prune_inputs(inputs_embeds: torch.Tensor, modality: torch.Tensor, *, scores=None,
                 keep=None, retention=None, positions: str = "original", position_ids=None,
                 per_token: dict | None = None, policy=None,
                 per_item: bool = False) -> PrunedInputs:
    """Keep the text and the chosen audio-visual tokens; compact them for prefill.

    Args:
        inputs_embeds: [B, L, D] the full input embeddings, padded on either side.
        modality: int [B, L], one of ``PAD`` (-1), ``VISUAL`` (0), ``AUDIO`` (1), ``TEXT`` (2)
            per position.
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
            of another width or layout than it was trained on are refused.
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
    _check_inputs(inputs_embeds, modality, positions)
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
    keep = (keep & is_av[:, None, :]) | is_text[:, None, :]

    out = compact(inputs_embeds, keep, layout="padded", positions="contiguous",
                  padding_side="left")
    present = modality != PAD
    num_sets = keep.shape[1]
    original_length = present.sum(1).repeat_interleave(num_sets)
    if positions == "contiguous":
        position_ids, next_position = out.position_ids, out.lengths
    elif position_ids is None:
        original = (present.long().cumsum(1) - 1).clamp_min(0)
        position_ids, next_position = gather_tokens(original, out.index), original_length
    else:
        native = position_ids.long()
        # decoding continues after the row's last token, axis by axis (as generate does)
        columns = torch.arange(present.shape[1], device=present.device)
        last = torch.where(present, columns, -1).amax(1)
        next_position = native[..., torch.arange(present.shape[0]), last] + 1
        next_position = next_position.repeat_interleave(num_sets, dim=-1)
        position_ids = gather_tokens(native, out.index)
    extras = {name: gather_tokens(value, out.index, batch_first=True)
              for name, value in (per_token or {}).items()}
    av_count = is_av.sum(1).repeat_interleave(num_sets)
    return PrunedInputs(out.hidden, out.attention_mask, position_ids, next_position, keep,
                        out.index, extras, original_length, av_count)


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
    check_code_values("modality", modality)
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
        if name in _RESERVED_INPUTS:
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
    ``config.selection``: Top-K, or set-aware selection over its hidden states). The selection alone, for a caller that compacts by
    itself (``avex.integrations.vllm`` keeps the rows of one media item)."""
    if policy is not None:
        if not isinstance(policy, AVEXPolicy):
            raise TypeError(f"policy must be an avex.policy.AVEXPolicy (avex.load_policy), got "
                            f"{type(policy).__name__}")
        if scores is not None:
            raise ValueError("pass policy or scores or keep, not several; got policy together "
                             "with scores")
        if retention is None:
            raise ValueError("retention is required with policy")
        retention = row_retention(retention, modality.shape[0])
        if policy.trained_on is not None:
            for rho in sorted(set(retention if isinstance(retention, list) else [retention])):
                policy.trained_on.check_retention(rho)
    elif scores is None or retention is None:
        missing = "scores" if scores is None else "retention"
        raise ValueError(f"{missing} is required: pass scores with retention, or keep")
    retention = row_retention(retention, modality.shape[0])
    _checks.flag("per_item", per_item)
    choose = _per_item_keep if per_item else _row_keep
    return choose(inputs_embeds, modality, scores, policy, retention)


def row_retention(retention, rows: int) -> float | list[float]:
    """``retention`` checked: one rho in (0, 1] for every row, or one per row (a 1-D tensor
    or a list of ``rows`` numbers), returned as a float or a list of floats."""
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
    is_av = (modality == VISUAL) | (modality == AUDIO)
    previous = torch.cat([modality.new_full((modality.shape[0], 1), PAD), modality[:, :-1]], 1)
    starts = is_av & (previous != modality)
    return torch.where(is_av, starts.long().cumsum(1) - 1, -1)


def _row_keep(inputs_embeds, modality, scores, policy, retention):
    hidden = None
    if policy is not None and policy.set_aware:
        scores, hidden = policy.score(inputs_embeds, modality, with_hidden=True)
    elif policy is not None:
        scores = policy.score(inputs_embeds, modality)
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
    if policy is not None and policy.set_aware:
        scores, hidden = policy.score(inputs_embeds[row_of], codes, with_hidden=True)
    elif policy is not None:
        scores = policy.score(inputs_embeds[row_of], codes)
    else:
        scores = scores[row_of] if len(row_of) else scores[:0]
    chosen = _top_k_keep(scores, retention, codes, own, rows=row_of, policy=policy,
                         hidden=hidden)
    keep = torch.zeros(modality.shape, dtype=torch.long, device=modality.device)
    return keep.index_add_(0, row_of, chosen.long()) > 0


def _top_k_keep(scores, retention, modality, is_av, rows=None, policy=None, hidden=None):
    """bool [B, L]: each row's K = round(rho N) AV tokens by ``policy``'s selection rule
    (Top-K of ``scores`` without a policy; set-aware selection reads ``hidden`` [B, L, D])."""
    _checks.tensor("scores", scores, ndim=2, floating=True)
    _checks.same_device("scores", scores, "modality", modality)
    if scores.shape != modality.shape:
        raise ValueError(f"scores must have shape {list(modality.shape)} (one per position of "
                         f"inputs_embeds), got {list(scores.shape)}")
    k = _kept_counts(retention, is_av.sum(1), rows)
    av_scores = torch.where(is_av, scores.detach(), torch.full_like(scores, float("-inf")))
    for bad, what in ((torch.isnan(av_scores), "NaN"), (torch.isposinf(av_scores), "+inf")):
        if bool(bad.any()):
            b, pos = torch.nonzero(bad)[0].tolist()
            raise ValueError(f"scores contains {what} at audio-visual position {pos} of sample "
                             f"{b}; scores must be finite there (-inf: never keep)")
    selectable = (av_scores > float("-inf")).sum(1)
    short = selectable < k
    if bool(short.any()):
        b = int(torch.nonzero(short)[0, 0])
        rho = retention if not isinstance(retention, list) else \
            retention[b if rows is None else int(rows[b])]
        raise ValueError(f"scores: sample {b} has {int(selectable[b])} audio-visual tokens with a "
                         f"score > -inf, but retention={rho} keeps {int(k[b])} of its "
                         f"{int(is_av[b].sum())}; give its tokens finite scores, or pass keep")
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


# ----------------------------------------------------------------------------------------------
# Generation
# ----------------------------------------------------------------------------------------------

def generate(model, pruned: PrunedInputs, *, attention: str = "auto", **generate_kwargs):
    """``model.generate`` on pruned inputs, with the positions of the unpruned sequence.

    Every decoding strategy of ``model.generate`` works (greedy, beam search with
    ``num_beams``, sampling, ``num_return_sequences``, logits processors, stopping criteria):
    the prompt is prefilled with ``pruned.position_ids`` (and ``pruned.per_token``) and each
    decode step t takes position ``pruned.next_position + t`` (on each axis).

    Sliding-window attention counts cache slots, not original positions, so a pruned prompt
    would see further back than the full one. ``generate`` runs a model with sliding-window
    layers only where the window can't bind (every row's original length + ``max_new_tokens``
    - 1 within the window: then it is exact) and refuses it otherwise.

    Args:
        model: a Hugging Face ``*ForCausalLM`` that takes ``inputs_embeds``.
        pruned: the output of :func:`prune_inputs`.
        attention: ``"padded"`` prefills the left-padded batch with the model's own attention
            (SDPA, eager, ...). ``"varlen"`` prefills the packed tokens with no padding, then
            hands the cache to ``model.generate``; on CUDA in fp16/bf16 through a packed
            kernel (flash-attention's ``flash_attention_2`` when ``flash_attn`` is installed,
            else PyTorch's own ``torch.nn.attention.varlen.varlen_attn``, same ``cu_seqlens``
            contract), otherwise through a per-sequence SDPA reference, correct but not faster.
            ``"auto"`` picks ``"varlen"`` when one of those packed kernels serves the inputs'
            device and the model's dtype (and ``use_cache`` is not off); else ``"padded"``.
        **generate_kwargs: passed to ``model.generate`` (``max_new_tokens``, ``num_beams``,
            ``do_sample``, ...). ``inputs_embeds``, ``attention_mask``, ``position_ids`` and
            the KV cache (``past_key_values``, or ``cache`` in newer transformers) come from
            ``pruned``.

    Returns:
        Whatever ``model.generate`` returns: by default the generated token ids
        [R * num_return_sequences, new_tokens] (the prompt is not repeated for
        ``inputs_embeds`` inputs).
    """
    _checks.choice("attention", attention, ATTENTION_PATHS)
    _check_call("generate", model, pruned, generate_kwargs)
    window = sliding_window(model)
    if window is not None:
        _check_window_cannot_bind(model, pruned, window, generate_kwargs)
    path = attention
    if path == "auto":
        packed_kernel = packed_attention(pruned.inputs_embeds.device,
                                         model.dtype) != VARLEN_REFERENCE_ATTENTION
        path = ("varlen" if packed_kernel and window is None
                and generate_kwargs.get("use_cache", True) else "padded")
    if path == "varlen" and generate_kwargs.get("use_cache", True) is False:
        raise ValueError("generate(attention='varlen') hands a prefilled cache to model.generate "
                         "and needs use_cache=True")
    if path == "varlen" and window is not None:
        raise ValueError(f"generate(attention='varlen') does not support sliding-window "
                         f"attention layers (sliding_window={window}); use attention='padded'")
    extra = {}
    if path == "varlen" and pruned.inputs_embeds.shape[1] > 1:
        extra[cache_keyword(model)] = _varlen_prefill(model, pruned,
                                                        _expand_size(model, generate_kwargs))
    with _continue_positions(model, pruned):
        return model.generate(inputs_embeds=pruned.inputs_embeds,
                              attention_mask=pruned.attention_mask,
                              position_ids=pruned.position_ids, **extra, **generate_kwargs)


def forward(model, pruned: PrunedInputs, **forward_kwargs):
    """``model(...)`` on pruned inputs: one checked forward (a prefill, a scoring pass) with
    what :func:`generate` hands the model and under the same rules.

    The model gets ``pruned.inputs_embeds``, ``attention_mask``, ``position_ids`` (the
    unpruned sequence's, any rank) and ``per_token`` (Gemma 3n's ``per_layer_inputs``, which
    it needs beside the embeddings). Refused, as by :func:`generate`: a model that isn't a
    Hugging Face ``*ForCausalLM`` taking these embeddings, a row that keeps no token, a model
    that needs per-token inputs ``pruned`` lacks, and a sliding window that could bind (a row
    whose original length exceeds the window: the pruned forward would attend further back
    than the full one).

    A raw ``model(inputs_embeds=pruned.inputs_embeds, ...)`` is the caller's to keep right:
    leave out ``position_ids`` or ``per_token``, or run it under a binding window, and it is
    silently off. Decoding on from here (``use_cache=True``) is also the caller's: the decode
    steps' positions continue at ``pruned.next_position``; :func:`generate` does this.

    Args:
        model: a Hugging Face ``*ForCausalLM`` that takes ``inputs_embeds``.
        pruned: the output of :func:`prune_inputs`.
        **forward_kwargs: passed to the model (``logits_to_keep``, ``output_attentions``,
            ``use_cache``, ...); the inputs above and the KV cache come from ``pruned``.

    Returns:
        What ``model(...)`` returns (``.logits`` [R, L', vocab] at the kept positions).
    """
    _check_call("forward", model, pruned, forward_kwargs)
    window = sliding_window(model)
    longest = int(pruned.original_length.max()) if pruned.original_length is not None \
        else int(pruned.next_position.max())
    if window is not None and longest > window:
        raise ValueError(
            f"the model's sliding_window={window} counts cache slots, which after pruning are "
            f"not original positions: a prompt of {longest} tokens outgrows it, so the pruned "
            "forward would attend further back than the full one. Keep prompts within the "
            "window, or prune for a model without sliding-window layers")
    return model(inputs_embeds=pruned.inputs_embeds, attention_mask=pruned.attention_mask,
                 position_ids=pruned.position_ids, **(pruned.per_token or {}),
                 **forward_kwargs)


def _check_call(name, model, pruned, kwargs):
    """What :func:`generate` and :func:`forward` both refuse, before the model runs."""
    if not isinstance(pruned, PrunedInputs):
        raise TypeError(f"pruned must be the PrunedInputs returned by prune_inputs, got "
                        f"{type(pruned).__name__}")
    for key in _RESERVED_INPUTS + tuple(pruned.per_token or ()):
        if key in kwargs:
            raise ValueError(f"{name} takes {key} from pruned; don't pass {key}=")
    _check_model(model, pruned, kwargs)
    _check_mrope_positions(model, pruned)
    if bool((pruned.attention_mask.sum(1) == 0).any()):
        row = int(torch.nonzero(pruned.attention_mask.sum(1) == 0)[0, 0])
        raise ValueError(f"pruned row {row} keeps no tokens; there is nothing to prefill")
    _check_per_token_inputs(model, pruned)


def uses_mrope(model) -> bool:
    """Whether ``model`` places tokens with multimodal rotary positions of rank 3 (Qwen2-VL,
    Qwen2.5-VL, Qwen2.5-Omni's thinker: the model computes them in ``get_rope_index``)."""
    return any(hasattr(part, "get_rope_index")
               for part in (model, getattr(model, "model", None)) if part is not None)


def _check_mrope_positions(model, pruned):
    """Audio-visual tokens pruned with the default 1-D positions, for a model that places them
    on M-RoPE's three axes: every position after the first media item would be off."""
    if pruned.position_ids.dim() != 2 or pruned.av_count is None or not uses_mrope(model):
        return
    if bool((pruned.av_count > 0).any()):
        row = int(torch.nonzero(pruned.av_count > 0)[0, 0])
        raise ValueError(
            f"{type(model).__name__} places audio-visual tokens with M-RoPE positions "
            f"([3, B, L]), but pruned row {row} holds {int(pruned.av_count[row])} of them with "
            "1-D positions (prune_inputs got no position_ids). Pass the model's own positions: "
            "avex.adapters.adapt(model, **inputs).prune(...) does, or "
            "prune_inputs(..., position_ids=adapted.position_ids)")


def _check_model(model, pruned, generate_kwargs):
    """The model can take these embeddings, and the decoding sizes make sense, before
    ``model.generate`` would fail deep inside transformers."""
    if not callable(getattr(model, "generate", None)) or getattr(model, "config", None) is None:
        raise TypeError("model must be a Hugging Face *ForCausalLM (with .generate and "
                        f".config), got {type(model).__name__}")
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    width = getattr(embeddings, "embedding_dim", None) or getattr(model.config, "hidden_size",
                                                                  None)
    embeds = pruned.inputs_embeds
    if width is not None and embeds.shape[-1] != width:
        raise ValueError(f"pruned.inputs_embeds has width {embeds.shape[-1]} but the model's "
                         f"embeddings have width {width}; prune the model's own inputs_embeds")
    if embeds.is_floating_point() and embeds.dtype != model.dtype:
        raise TypeError(f"pruned.inputs_embeds has dtype {embeds.dtype} but the model runs in "
                        f"{model.dtype}; cast the embeddings (or the model)")
    if embeds.device != model.device:
        raise ValueError(f"pruned.inputs_embeds is on {embeds.device} but the model is on "
                         f"{model.device}; put them on the same device")
    for name in ("num_beams", "num_return_sequences", "max_new_tokens", "num_beam_groups"):
        if generate_kwargs.get(name) is not None:
            _checks.int_at_least(name, generate_kwargs[name], 1)


def _flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def _torch_varlen_attn():
    """PyTorch's packed attention, ``torch.nn.attention.varlen.varlen_attn``, or None where
    this torch lacks it."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def packed_attention(device: torch.device, dtype: torch.dtype) -> str:
    """The attention implementation that prefills packed (``cu_seqlens``) sequences on
    ``device`` in ``dtype``: ``"flash_attention_2"`` (flash-attn installed), else PyTorch's
    ``varlen_attn`` (both CUDA with fp16/bf16 only), else the per-sequence SDPA reference."""
    if torch.device(device).type == "cuda" and dtype in (torch.float16, torch.bfloat16):
        if _flash_attn_installed():
            return "flash_attention_2"
        if _torch_varlen_attn() is not None:
            return _register_attention(VARLEN_TORCH_ATTENTION, _torch_varlen_attention)
    return _register_attention(VARLEN_REFERENCE_ATTENTION, _varlen_reference_attention)


@contextlib.contextmanager
def _continue_positions(model, pruned):
    """``model.generate`` gives decode step t the position (last prompt position) + 1 + t on
    each axis. Where that isn't ``next_position + t`` (the row's last original token was
    pruned, or an M-RoPE prompt's axes end apart), shift the decode steps with a forward
    pre-hook, removed on exit. The same hook hands ``pruned.per_token`` to the prefill."""
    last = pruned.position_ids[..., -1]                      # [..., R]
    shift = pruned.next_position - last - 1                  # [..., R]
    per_token = pruned.per_token or {}
    if not bool((shift != 0).any()) and not per_token:
        yield
        return
    rows = last.shape[-1]

    def hook(module, args, kwargs):
        position_ids = kwargs.get("position_ids")
        if position_ids is not None and position_ids.dim() == pruned.position_ids.dim():
            expand = position_ids.shape[-2] // rows  # beams / return sequences, interleaved
            row_last = last.repeat_interleave(expand, dim=-1)[..., None]
            row_shift = shift.repeat_interleave(expand, dim=-1)[..., None]
            decoding = position_ids[..., :1] > row_last  # past the prompt: a generated token
            kwargs["position_ids"] = position_ids + torch.where(decoding, row_shift, 0)
        embeds = kwargs.get("inputs_embeds")
        if embeds is not None and per_token:  # the prefill (decode steps take input_ids)
            expand = embeds.shape[0] // rows
            for name, value in per_token.items():
                value = value.repeat_interleave(expand, dim=0) if expand > 1 else value
                kwargs[name] = value[:, value.shape[1] - embeds.shape[1]:]
        return args, kwargs

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def _check_per_token_inputs(model, pruned):
    """Gemma 3n adds per-layer token embeddings computed from input_ids; inputs_embeds alone
    drops them, so its prefill needs them gathered (avex.adapters.gemma3n)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") \
        else model.config
    if getattr(config, "vocab_size_per_layer_input", None) is None:
        return
    if "per_layer_inputs" not in inspect.signature(type(model).forward).parameters:
        raise ValueError(f"{type(model).__name__} computes per-layer token inputs from "
                         "input_ids and takes none beside inputs_embeds, so a pruned prompt "
                         "would lose them; prune Gemma3nForConditionalGeneration with "
                         "avex.adapters.gemma3n instead")
    if "per_layer_inputs" not in (pruned.per_token or {}):
        raise ValueError(f"{type(model).__name__} needs per_layer_inputs beside inputs_embeds; "
                         "pass per_token={'per_layer_inputs': ...} to prune_inputs (the "
                         "avex.adapters.gemma3n adapter gives them)")


def sliding_window(model) -> int | None:
    """The sliding window of a model's attention layers, or None when no layer slides."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") \
        else model.config
    window = getattr(config, "sliding_window", None)
    if window is None:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return window if any("sliding" in str(kind) for kind in layer_types) else None
    return window if getattr(config, "use_sliding_window", True) else None


def _check_window_cannot_bind(model, pruned, window, generate_kwargs):
    config = generate_kwargs.get("generation_config") or model.generation_config
    new_tokens = generate_kwargs.get("max_new_tokens", getattr(config, "max_new_tokens", None))
    if new_tokens is None:
        new_tokens = generate_kwargs.get("max_length", getattr(config, "max_length", 0))
    longest = int(pruned.original_length.max()) if pruned.original_length is not None \
        else int(pruned.next_position.max())
    # the last token fed in (the next-to-last generated) sits longest + new - 2 tokens after
    # the first; the window reaches window - 1 back
    if longest + int(new_tokens) - 1 > window:
        raise ValueError(
            f"the model's sliding_window={window} counts cache slots, which after pruning are "
            f"not original positions: a prompt of {longest} tokens + max_new_tokens="
            f"{new_tokens} outgrows it, so the pruned model would attend further back than the "
            "full one. Keep prompt + max_new_tokens - 1 within the window, or prune for a "
            "model without sliding-window layers")


def _expand_size(model, generate_kwargs) -> int:
    config = generate_kwargs.get("generation_config") or model.generation_config
    beams = generate_kwargs.get("num_beams", getattr(config, "num_beams", 1)) or 1
    returned = generate_kwargs.get("num_return_sequences",
                                   getattr(config, "num_return_sequences", 1)) or 1
    return max(beams, returned)


@torch.no_grad()
def _varlen_prefill(model, pruned, expand):
    """Prefill every prompt token but the last column in one packed pass (no padding), then
    lay the keys/values out as the left-padded cache ``model.generate`` continues from."""
    from transformers import DynamicCache

    rows, width = pruned.attention_mask.shape
    head = pruned.attention_mask[:, :-1].bool()
    packed = compact(pruned.inputs_embeds[:, :-1], head, layout="varlen", positions="contiguous")
    position_ids = gather_tokens(pruned.position_ids[..., :-1], packed.index)[..., None, :]
    per_token = {name: gather_tokens(value[:, :-1], packed.index, batch_first=True)[None]
                 for name, value in (pruned.per_token or {}).items()}
    cu_seqlens = packed.cu_seqlens
    implementation = packed_attention(packed.hidden.device, model.dtype)
    kwargs = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(
        model.forward).parameters else {}
    prefill_cache = DynamicCache()
    with _attention_implementation(model, implementation):
        model(inputs_embeds=packed.hidden[None], position_ids=position_ids, **per_token,
              **{cache_keyword(model): prefill_cache}, use_cache=True,
              cu_seq_lens_q=cu_seqlens, cu_seq_lens_k=cu_seqlens,
              max_length_q=packed.max_seqlen, max_length_k=packed.max_seqlen, **kwargs)

    cache = DynamicCache(config=model.config)
    row_of = packed.index // (width - 1)
    col_of = packed.index % (width - 1)
    for layer_idx, layer in enumerate(prefill_cache.layers):
        padded = []
        for states in (layer.keys, layer.values):  # [1, heads, total, head_dim]
            out = states.new_zeros(rows, states.shape[1], width - 1, states.shape[3])
            out[row_of, :, col_of] = states[0].transpose(0, 1)
            padded.append(out.repeat_interleave(expand, dim=0) if expand > 1 else out)
        cache.update(padded[0], padded[1], layer_idx)
    return cache


def cache_keyword(model) -> str:
    """The KV cache's keyword in this transformers: ``cache`` where the model's ``forward``
    takes it (5.24 deprecates ``past_key_values``), else ``past_key_values``; ``generate``
    follows the same rename."""
    return ("cache" if "cache" in inspect.signature(model.forward).parameters
            else "past_key_values")


@contextlib.contextmanager
def _attention_implementation(model, name):
    previous = model.config._attn_implementation
    if previous == name:
        yield
        return
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


def _register_attention(name: str, function) -> str:
    """Register (once) a packed-prefill attention for Hugging Face models under ``name``; it
    builds no mask (the sequences come from ``cu_seq_lens_q``)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if name not in AttentionInterface._global_mapping:
        AttentionInterface.register(name, function)
        AttentionMaskInterface.register(name, lambda *a, **k: None)
    return name


def _packed_heads(name, query, key, value, kwargs):
    """Check a packed call and repeat grouped key/value heads up to the query's heads."""
    if kwargs.get("cu_seq_lens_q") is None:
        raise ValueError(f"{name} serves packed prefill only and needs cu_seq_lens_q")
    if kwargs.get("sliding_window") is not None:
        raise ValueError(f"{name} does not support sliding windows")
    groups = query.shape[1] // key.shape[1]
    return key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)


def _torch_varlen_attention(module, query, key, value, attention_mask, scaling=None,
                            dropout=0.0, **kwargs):
    """query [1, H, total, d], key/value [1, H_kv, total, d] -> [1, total, H, d], through
    ``torch.nn.attention.varlen.varlen_attn`` (causal within each sequence)."""
    key, value = _packed_heads(VARLEN_TORCH_ATTENTION, query, key, value, kwargs)
    varlen_attn = _torch_varlen_attn()
    params = inspect.signature(varlen_attn).parameters
    options = {}
    # Causality: torch 2.10+ takes a window, (-1, 0); earlier releases an is_causal flag.
    if "window_size" in params:
        options["window_size"] = (-1, 0)
    elif "is_causal" in params:
        options["is_causal"] = True
    else:
        raise RuntimeError(f"torch {torch.__version__}'s varlen_attn takes neither window_size "
                           "nor is_causal; use attention='padded'")
    head_dim = query.shape[-1]
    if scaling is not None and "scale" in params:
        options["scale"] = scaling
    elif scaling is not None:  # varlen_attn scales by 1/sqrt(d): fold the model's into q
        query = query * (scaling * head_dim ** 0.5)
    cu_seqlens = kwargs["cu_seq_lens_q"].to(torch.int32)
    max_length = int(kwargs.get("max_length_q") or int(cu_seqlens.diff().max()))
    out = varlen_attn(query[0].transpose(0, 1), key[0].transpose(0, 1),
                      value[0].transpose(0, 1), cu_seqlens, cu_seqlens, max_length, max_length,
                      **options)
    return out[None], None


def _varlen_reference_attention(module, query, key, value, attention_mask, scaling=None,
                                dropout=0.0, **kwargs):
    """query [1, H, total, d], key/value [1, H_kv, total, d] -> [1, total, H, d]."""
    key, value = _packed_heads(VARLEN_REFERENCE_ATTENTION, query, key, value, kwargs)
    cu_seqlens = kwargs["cu_seq_lens_q"]
    out = torch.empty_like(query)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end > start:
            out[:, :, start:end] = torch.nn.functional.scaled_dot_product_attention(
                query[:, :, start:end], key[:, :, start:end], value[:, :, start:end],
                is_causal=True, scale=scaling)
    return out.transpose(1, 2).contiguous(), None
