"""Gemma 3n (``Gemma3nForConditionalGeneration``): images and audio, 1-D RoPE, and per-layer
token embeddings (``per_layer_inputs`` [B, L, layers, d], computed from ``input_ids``) that
``inputs_embeds`` alone does not carry: they are gathered with the kept tokens and handed to
the prefill; decode steps compute them from the generated ids, as the model does.

Gemma 3n's local layers use a sliding window: :func:`avex.pruning.generate` refuses a prompt
plus ``max_new_tokens`` longer than the window.

Refused before the towers run: placeholders without their features, features without
placeholders, ``input_features`` without ``input_features_mask`` (the model would skip the
audio and leave its placeholders as token embeddings), and placeholder blocks that aren't
``vision_soft_tokens_per_image`` / ``audio_soft_tokens_per_image`` long, one per image / audio."""
from __future__ import annotations

import inspect

import transformers

from avex import _checks
from avex.adapters._capture import (AdaptedInputs, adapted, check_placeholders,
                                    check_processor_outputs, placeholder_runs, refuse_unused,
                                    require, token_id)

MODEL_TYPES = ("gemma3n",)
OWN_POSITIONS = False   # 1-D positions: the default arange
# export (avex.adapters._export): refused, and why
PROCESSOR = "Gemma3nProcessor"
VIDEO = None
SEES, HEARS = True, True
EXPORT_REFUSED = (
    "Gemma 3n's decoder reads per-layer token embeddings (per_layer_inputs) besides "
    "inputs_embeds; the feature cache stores the merged embeddings only, and the frozen "
    "captioner captions from those, so training on an exported cache would caption a "
    "different model than the one served. Gemma 3n is served pruned (adapt(...).prune), not "
    "trained from a cache")


def adapt(model, **processor_outputs) -> AdaptedInputs:
    """``processor_outputs``: what ``Gemma3nProcessor`` returns (``input_ids``,
    ``attention_mask``, ``pixel_values``, ``input_features``, ``input_features_mask``)."""
    if "per_layer_inputs" not in inspect.signature(type(model).forward).parameters:
        raise ValueError(
            f"{type(model).__name__}.forward in transformers {transformers.__version__} takes "
            "no per_layer_inputs: given inputs_embeds it drops the per-layer token embeddings, "
            "so a pruned Gemma 3n would be silently wrong. Use a transformers release whose "
            "Gemma3nForConditionalGeneration.forward takes per_layer_inputs (5.24 does)")
    inputs = check_processor_outputs(model, processor_outputs)
    config = model.config
    visual = token_id(config, "image_token_id")
    audio = token_id(config, "audio_token_id")
    for what, token, keys, per_item, items_key, ndim in (
            ("image", visual, ("pixel_values",), config.vision_soft_tokens_per_image,
             "pixel_values", 4),
            ("audio", audio, ("input_features", "input_features_mask"),
             config.audio_soft_tokens_per_image, "input_features", 3)):
        blocks = [(*run, run[2] - run[1])
                  for run in placeholder_runs(inputs["input_ids"], [token])]
        if not blocks:
            refuse_unused(inputs, keys, what, token)
            continue
        require(inputs, keys, what, token, sum(block[3] for block in blocks))
        features = _checks.tensor(items_key, inputs[items_key], ndim=ndim, floating=True)
        if what == "audio":
            mask = _checks.tensor("input_features_mask", inputs["input_features_mask"], ndim=2)
            if mask.shape != features.shape[:2]:
                raise ValueError(f"input_features_mask must have shape "
                                 f"{list(features.shape[:2])} (the [audios, frames] of "
                                 f"input_features), got {list(mask.shape)}")
        check_placeholders(what, token, blocks, [per_item] * features.shape[0],
                           f"{items_key} {list(features.shape)} ({per_item} tokens each)")
    return adapted(model, inputs, visual_ids=[visual], audio_ids=[audio],
                   per_token=("per_layer_inputs",))
