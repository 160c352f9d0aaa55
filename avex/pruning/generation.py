"""``generate`` and ``forward`` on pruned inputs: ``model.generate`` (or one forward) given
the positions of the unpruned sequence, decode steps continuing from the last original
position + 1, a padded or varlen (packed) prefill, and the refusals that keep it exact
(sliding windows that could bind, 1-D positions on an M-RoPE model and M-RoPE positions on
a 1-D one, missing per-token inputs)."""
from __future__ import annotations

import contextlib
import importlib.util
import inspect

import torch

from avex import _checks
from avex.kernels.compact import compact
from avex.pruning.inputs import RESERVED_INPUTS, PrunedInputs, gather_tokens

__all__ = ["generate", "forward", "uses_mrope", "sliding_window", "packed_attention",
           "cache_keyword", "ATTENTION_PATHS"]

ATTENTION_PATHS = ("auto", "padded", "varlen")
VARLEN_REFERENCE_ATTENTION = "avex_varlen_sdpa"
VARLEN_TORCH_ATTENTION = "avex_varlen_torch"


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
            ``"auto"`` picks ``"varlen"`` only where flash-attn serves the inputs' device and
            the model's dtype (and ``use_cache`` is not off); else ``"padded"``. On an H100
            with PyTorch's ``varlen_attn`` the packed prefill took 1.5x the padded one at
            batch 16 (``bench/results/kernels-h100.md``, P7), and it always costs one more
            forward (the prompt's last column), so that kernel is used only when asked for.
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
        flash = packed_attention(pruned.inputs_embeds.device,
                                 model.dtype) == "flash_attention_2"
        path = ("varlen" if flash and window is None
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
    for key in RESERVED_INPUTS + tuple(pruned.per_token or ()):
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
    on M-RoPE's three axes: every position after the first media item would be off. And the
    reverse: positions of higher rank for a model that takes [B, L] (it would fail deep
    inside its rotary embedding)."""
    mrope = uses_mrope(model)
    if pruned.position_ids.dim() > 2 and not mrope:
        raise ValueError(
            f"pruned.position_ids has shape {list(pruned.position_ids.shape)} (positions of "
            f"rank {pruned.position_ids.dim()}, M-RoPE's), but {type(model).__name__} takes "
            "position_ids of shape [B, L]; prune_inputs' position_ids are the model's own: "
            "leave them out for a model with 1-D rotary positions")
    if pruned.position_ids.dim() != 2 or pruned.av_count is None or not mrope:
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
