"""LLaVA-OneVision (``LlavaOnevisionForConditionalGeneration``): images and video, 1-D RoPE.

The model writes its learned ``image_newline`` vector into some image-placeholder slots (the end
of each row of an image's patch grid, the end of a video); those slots are coded TEXT: they
carry layout, not image content, and are never pruned."""
from __future__ import annotations

from avex.adapters._capture import AdaptedInputs, adapted, token_id

MODEL_TYPES = ("llava_onevision",)


def adapt(model, **processor_outputs) -> AdaptedInputs:
    """``processor_outputs``: what ``LlavaOnevisionProcessor`` returns (``input_ids``,
    ``attention_mask``, ``pixel_values``, ``image_sizes``, ``pixel_values_videos``, ...)."""
    config = model.config
    visual = [token_id(config, "image_token_id", "image_token_index"),
              token_id(config, "video_token_id", "video_token_index")]
    newline = _image_newline(model)
    return adapted(model, processor_outputs, visual_ids=visual, audio_ids=(),
                   text_embeddings=[newline])


def _image_newline(model):
    for name, parameter in model.named_parameters():
        if name.endswith("image_newline"):
            return parameter.detach()
    raise ValueError(f"{type(model).__name__} has no image_newline parameter")
