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
ids a Hugging Face model computes from the attention mask of the unpruned batch).
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
from avex.modality import AUDIO, PAD, TEXT, VISUAL
from avex.selection import num_kept

__all__ = ["PAD", "VISUAL", "AUDIO", "TEXT", "PrunedInputs", "prune_inputs", "generate",
           "expand_av_keep", "num_kept"]

ATTENTION_PATHS = ("auto", "padded", "varlen")
VARLEN_REFERENCE_ATTENTION = "avex_varlen_sdpa"


class PrunedInputs(NamedTuple):
    """Output of :func:`prune_inputs`; R = B * S rows (S keep-sets per sample, row b * S + s).

    Attributes:
        inputs_embeds: [R, L', D] the kept tokens in original order, left-padded with zeros.
        attention_mask: int64 [R, L'], 1 at tokens, 0 at padding.
        position_ids: int64 [R, L'], original positions (or 0..n-1 with
            ``positions="contiguous"``); 0 at padding.
        next_position: int64 [R], the position of the first generated token: last original
            position + 1 (or n with ``"contiguous"``).
        keep: bool [B, S, L], the keep-sets applied, in the input layout (text True,
            padding False).
        index: int64 [R, L'], the row of ``inputs_embeds_in.reshape(B * L, D)`` each token
            came from; -1 at padding.
    """
    inputs_embeds: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    next_position: torch.Tensor
    keep: torch.Tensor
    index: torch.Tensor

    @property
    def num_sets(self) -> int:
        return self.keep.shape[1]


# ----------------------------------------------------------------------------------------------
# Pruning
# ----------------------------------------------------------------------------------------------

def prune_inputs(inputs_embeds: torch.Tensor, modality: torch.Tensor, *, scores=None,
                 keep=None, retention=None, positions: str = "original") -> PrunedInputs:
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
        retention: rho in (0, 1], used with ``scores``.
        positions: ``"original"`` (each token keeps its position in the unpruned sequence) or
            ``"contiguous"`` (0..n-1).

    Returns:
        :class:`PrunedInputs`. Differentiable w.r.t. ``inputs_embeds``.
    """
    _check_inputs(inputs_embeds, modality, positions)
    is_av = (modality == VISUAL) | (modality == AUDIO)
    is_text = modality == TEXT
    if keep is not None:
        if scores is not None or retention is not None:
            raise ValueError("pass either keep, or scores with retention; got keep together "
                             f"with {'scores' if scores is not None else 'retention'}")
        keep = _check_keep(keep, modality, is_text)
    else:
        if scores is None or retention is None:
            missing = "scores" if scores is None else "retention"
            raise ValueError(f"{missing} is required: pass scores with retention, or keep")
        keep = _top_k_keep(scores, retention, modality, is_av)[:, None, :]
    keep = (keep & is_av[:, None, :]) | is_text[:, None, :]

    out = compact(inputs_embeds, keep, layout="padded", positions="contiguous",
                  padding_side="left")
    present = modality != PAD
    num_sets = keep.shape[1]
    if positions == "original":
        original = (present.long().cumsum(1) - 1).clamp_min(0)
        position_ids = torch.where(out.index >= 0, original.reshape(-1)[out.index.clamp_min(0)],
                                   torch.zeros_like(out.index))
        next_position = present.sum(1).repeat_interleave(num_sets)
    else:
        position_ids = out.position_ids
        next_position = out.lengths
    return PrunedInputs(out.hidden, out.attention_mask, position_ids, next_position, keep,
                        out.index)


def expand_av_keep(av_keep: torch.Tensor, modality: torch.Tensor) -> torch.Tensor:
    """Map keep-sets over the AV tokens (in order of appearance, e.g. ``Exchanges.sets()``
    [B, S, M]) onto the sequence layout [B, S, L] that ``prune_inputs`` takes.

    Column j of ``av_keep`` is the j-th visual-or-audio position of the row; columns past a
    row's AV count are ignored. Text positions are True (text is never pruned), padding False.
    """
    _checks.tensor("av_keep", av_keep, ndim=(2, 3), boolean=True)
    _checks.tensor("modality", modality, ndim=2, integer=True)
    _checks.same_device("av_keep", av_keep, "modality", modality)
    _checks.modality_codes("modality", modality)
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
    _checks.modality_codes("modality", modality)


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


def _top_k_keep(scores, retention, modality, is_av):
    _checks.tensor("scores", scores, ndim=2, floating=True)
    _checks.same_device("scores", scores, "modality", modality)
    if scores.shape != modality.shape:
        raise ValueError(f"scores must have shape {list(modality.shape)} (one per position of "
                         f"inputs_embeds), got {list(scores.shape)}")
    k = num_kept(retention, is_av.sum(1))
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
        raise ValueError(f"scores: sample {b} has {int(selectable[b])} audio-visual tokens with a "
                         f"score > -inf, but retention={retention} keeps {int(k[b])} of its "
                         f"{int(is_av[b].sum())}; give its tokens finite scores, or pass keep")
    keep = torch.zeros_like(is_av)
    rows = torch.nonzero(k > 0).flatten()
    if rows.numel():
        indices, _ = gumbel_topk(av_scores[rows], k[rows], sample=False)
        chosen = indices >= 0
        keep[rows[:, None].expand_as(indices)[chosen], indices[chosen]] = True
    return keep


# ----------------------------------------------------------------------------------------------
# Generation
# ----------------------------------------------------------------------------------------------

def generate(model, pruned: PrunedInputs, *, attention: str = "auto", **generate_kwargs):
    """``model.generate`` on pruned inputs, with the positions of the unpruned sequence.

    Every decoding strategy of ``model.generate`` works (greedy, beam search with
    ``num_beams``, sampling, ``num_return_sequences``, logits processors, stopping criteria):
    the prompt is prefilled with ``pruned.position_ids`` and each decode step t takes
    position ``pruned.next_position + t``.

    Args:
        model: a Hugging Face ``*ForCausalLM`` that takes ``inputs_embeds``.
        pruned: the output of :func:`prune_inputs`.
        attention: ``"padded"`` prefills the left-padded batch with the model's own attention
            (SDPA, eager, ...). ``"varlen"`` prefills the packed tokens with no padding
            (flash-attention's ``cu_seqlens`` through ``flash_attention_2`` when ``flash_attn``
            is installed and the model is on CUDA in fp16/bf16; otherwise a per-sequence SDPA
            reference, correct but not faster), then hands the cache to ``model.generate``. ``"auto"``
            picks ``"varlen"`` when ``flash_attn`` is installed, the inputs are on CUDA and the
            model runs in fp16/bf16 (and ``use_cache`` is not off); else ``"padded"``.
        **generate_kwargs: passed to ``model.generate`` (``max_new_tokens``, ``num_beams``,
            ``do_sample``, ...). ``inputs_embeds``, ``attention_mask``, ``position_ids`` and
            ``past_key_values`` come from ``pruned``.

    Returns:
        Whatever ``model.generate`` returns: by default the generated token ids
        [R * num_return_sequences, new_tokens] (the prompt is not repeated for
        ``inputs_embeds`` inputs).
    """
    if not isinstance(pruned, PrunedInputs):
        raise TypeError(f"pruned must be the PrunedInputs returned by prune_inputs, got "
                        f"{type(pruned).__name__}")
    _checks.choice("attention", attention, ATTENTION_PATHS)
    for key in ("inputs_embeds", "input_ids", "attention_mask", "position_ids",
                "past_key_values"):
        if key in generate_kwargs:
            raise ValueError(f"generate takes {key} from pruned; don't pass {key}=")
    _check_model(model, pruned, generate_kwargs)
    if bool((pruned.attention_mask.sum(1) == 0).any()):
        row = int(torch.nonzero(pruned.attention_mask.sum(1) == 0)[0, 0])
        raise ValueError(f"pruned row {row} keeps no tokens; there is nothing to prefill")
    path = attention
    if path == "auto":
        flash_ready = (_flash_attn_installed() and pruned.inputs_embeds.is_cuda
                       and model.dtype in (torch.float16, torch.bfloat16))
        path = "varlen" if flash_ready and generate_kwargs.get("use_cache", True) else "padded"
    if path == "varlen" and generate_kwargs.get("use_cache", True) is False:
        raise ValueError("generate(attention='varlen') hands a prefilled cache to model.generate "
                         "and needs use_cache=True")
    extra = {}
    if path == "varlen" and pruned.inputs_embeds.shape[1] > 1:
        extra["past_key_values"] = _varlen_prefill(model, pruned,
                                                   _expand_size(model, generate_kwargs))
    with _continue_positions(model, pruned):
        return model.generate(inputs_embeds=pruned.inputs_embeds,
                              attention_mask=pruned.attention_mask,
                              position_ids=pruned.position_ids, **extra, **generate_kwargs)


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


@contextlib.contextmanager
def _continue_positions(model, pruned):
    """``model.generate`` gives decode step t the position (last prompt position) + 1 + t.
    When a row's last original token was pruned, shift its decode steps up to
    next_position + t with a forward pre-hook, removed on exit."""
    last = pruned.position_ids[:, -1]
    shift = pruned.next_position - last - 1
    if not bool((shift != 0).any()):
        yield
        return
    rows = last.shape[0]

    def hook(module, args, kwargs):
        position_ids = kwargs.get("position_ids")
        if position_ids is None or position_ids.dim() != 2:
            return None
        expand = position_ids.shape[0] // rows  # beams / return sequences, repeat-interleaved
        row_last = last.repeat_interleave(expand)[:, None]
        row_shift = shift.repeat_interleave(expand)[:, None]
        decoding = position_ids[:, :1] > row_last  # past the prompt: a generated token
        kwargs["position_ids"] = position_ids + torch.where(decoding, row_shift, 0)
        return args, kwargs

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


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
    position_ids = pruned.position_ids[:, :-1].reshape(-1)[packed.index]
    cu_seqlens = packed.cu_seqlens
    use_flash = (_flash_attn_installed() and packed.hidden.is_cuda
                 and model.dtype in (torch.float16, torch.bfloat16))
    implementation = "flash_attention_2" if use_flash else _register_varlen_reference()
    kwargs = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(
        model.forward).parameters else {}
    prefill_cache = DynamicCache()
    with _attention_implementation(model, implementation):
        model(inputs_embeds=packed.hidden[None], position_ids=position_ids[None],
              past_key_values=prefill_cache, use_cache=True,
              cu_seq_lens_q=cu_seqlens, cu_seq_lens_k=cu_seqlens,
              max_length_q=packed.max_seqlen, max_length_k=packed.max_seqlen, **kwargs)

    cache = DynamicCache(config=model.config)
    if any(getattr(layer, "is_sliding", False) for layer in cache.layers):
        raise ValueError("generate(attention='varlen') does not support sliding-window "
                         "attention layers; use attention='padded'")
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


def _register_varlen_reference() -> str:
    """Register (once) a packed-prefill attention for Hugging Face models: each sequence of
    ``cu_seq_lens_q`` attends causally to itself through SDPA."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if VARLEN_REFERENCE_ATTENTION not in AttentionInterface._global_mapping:
        AttentionInterface.register(VARLEN_REFERENCE_ATTENTION, _varlen_reference_attention)
        AttentionMaskInterface.register(VARLEN_REFERENCE_ATTENTION, lambda *a, **k: None)
    return VARLEN_REFERENCE_ATTENTION


def _varlen_reference_attention(module, query, key, value, attention_mask, scaling=None,
                                dropout=0.0, **kwargs):
    """query [1, H, total, d], key/value [1, H_kv, total, d] -> [1, total, H, d]."""
    cu_seqlens = kwargs.get("cu_seq_lens_q")
    if cu_seqlens is None:
        raise ValueError(f"{VARLEN_REFERENCE_ATTENTION} serves packed prefill only and needs "
                         "cu_seq_lens_q")
    if kwargs.get("sliding_window") is not None:
        raise ValueError(f"{VARLEN_REFERENCE_ATTENTION} does not support sliding windows")
    groups = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(groups, dim=1)
    value = value.repeat_interleave(groups, dim=1)
    out = torch.empty_like(query)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end > start:
            out[:, :, start:end] = torch.nn.functional.scaled_dot_product_attention(
                query[:, :, start:end], key[:, :, start:end], value[:, :, start:end],
                is_causal=True, scale=scaling)
    return out.transpose(1, 2).contiguous(), None
