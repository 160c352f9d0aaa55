"""Gemma 3n (``Gemma3nForConditionalGeneration``): images and audio, 1-D RoPE, and per-layer
token embeddings (``per_layer_inputs`` [B, L, layers, d], computed from ``input_ids``) that
``inputs_embeds`` alone does not carry: they are gathered with the kept tokens and handed to
the prefill; decode steps compute them from the generated ids, as the model does.

Gemma 3n's local layers use a sliding window: :func:`avex.pruning.generate` refuses a prompt
plus ``max_new_tokens`` longer than the window."""
from __future__ import annotations

import inspect

import transformers

from avex.adapters._capture import AdaptedInputs, adapted, token_id

MODEL_TYPES = ("gemma3n",)


def adapt(model, **processor_outputs) -> AdaptedInputs:
    """``processor_outputs``: what ``Gemma3nProcessor`` returns (``input_ids``,
    ``attention_mask``, ``pixel_values``, ``input_features``, ``input_features_mask``)."""
    if "per_layer_inputs" not in inspect.signature(type(model).forward).parameters:
        raise ValueError(
            f"{type(model).__name__}.forward in transformers {transformers.__version__} takes "
            "no per_layer_inputs: given inputs_embeds it drops the per-layer token embeddings, "
            "so a pruned Gemma 3n would be silently wrong. Use a transformers release whose "
            "Gemma3nForConditionalGeneration.forward takes per_layer_inputs (5.24 does)")
    config = model.config
    visual = [token_id(config, "image_token_id")]
    audio = [token_id(config, "audio_token_id")]
    return adapted(model, processor_outputs, visual_ids=visual, audio_ids=audio,
                   per_token=("per_layer_inputs",))
