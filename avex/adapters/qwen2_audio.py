"""Qwen2-Audio (``Qwen2AudioForConditionalGeneration``): audio, 1-D RoPE."""
from __future__ import annotations

from avex.adapters._capture import AdaptedInputs, adapted, token_id

MODEL_TYPES = ("qwen2_audio",)


def adapt(model, **processor_outputs) -> AdaptedInputs:
    """``processor_outputs``: what ``Qwen2AudioProcessor`` returns (``input_ids``,
    ``attention_mask``, ``input_features``, ``feature_attention_mask``)."""
    audio = [token_id(model.config, "audio_token_id", "audio_token_index")]
    return adapted(model, processor_outputs, visual_ids=(), audio_ids=audio)
