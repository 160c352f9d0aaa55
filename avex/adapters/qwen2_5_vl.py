"""Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``): images and video with M-RoPE positions
``[3, B, L]``."""
from __future__ import annotations

from avex.adapters._capture import AdaptedInputs, adapted, token_id

MODEL_TYPES = ("qwen2_5_vl",)


def adapt(model, **processor_outputs) -> AdaptedInputs:
    """``processor_outputs``: what ``Qwen2_5_VLProcessor`` returns (``input_ids``,
    ``attention_mask``, ``mm_token_type_ids``, ``pixel_values(_videos)``,
    ``image_grid_thw`` / ``video_grid_thw``, ``second_per_grid_ts``)."""
    config = model.config
    visual = [token_id(config, "image_token_id"), token_id(config, "video_token_id")]
    return adapted(model, processor_outputs, visual_ids=visual, audio_ids=())
