"""Qwen2.5-Omni thinker (``Qwen2_5OmniThinkerForConditionalGeneration``): images, video and
audio, with TMRoPE positions ``[3, B, L]`` (audio interleaved with video in 2-second chunks
under ``use_audio_in_video``). Pass ``model.thinker`` of the full Omni model."""
from __future__ import annotations

from avex.adapters._capture import AdaptedInputs, adapted, token_id

MODEL_TYPES = ("qwen2_5_omni_thinker",)


def adapt(model, **processor_outputs) -> AdaptedInputs:
    """``processor_outputs``: what ``Qwen2_5OmniProcessor`` returns (``input_ids``,
    ``attention_mask``, ``pixel_values_videos``, ``video_grid_thw``,
    ``video_second_per_grid``, ``input_features``, ``feature_attention_mask``, ...) plus
    ``use_audio_in_video`` as given to the processor."""
    config = model.config
    visual = [token_id(config, "image_token_id", "image_token_index"),
              token_id(config, "video_token_id", "video_token_index")]
    audio = [token_id(config, "audio_token_id", "audio_token_index")]
    return adapted(model, processor_outputs, visual_ids=visual, audio_ids=audio)
