"""LLaVA-OneVision (``LlavaOnevisionForConditionalGeneration``): images and video, 1-D RoPE.

The model writes its learned ``image_newline`` vector into some image-placeholder slots (the end
of each row of an image's patch grid, the end of a video); those slots are coded TEXT: they
carry layout, not image content, and are never pruned.

Refused before the vision tower runs: placeholders without their pixel values, pixel values
without placeholders, ``pixel_values`` without ``image_sizes``, a number of images or videos
that differs from the placeholder blocks, and video blocks that aren't frames x pooled patches
+ 1 long. An image's own token count depends on its any-resolution tiling; the model checks it
against the features it computes."""
from __future__ import annotations

import math

from avex import _checks
from avex.adapters._capture import (AdaptedInputs, adapted, check_placeholders,
                                    check_processor_outputs, placeholder_runs, refuse_unused,
                                    require, token_id)
from avex.adapters._export import prompt_text, vision_inputs

MODEL_TYPES = ("llava_onevision",)
OWN_POSITIONS = False   # 1-D positions: the default arange
# export (avex.adapters._export): its processor, its video processor's style, what it takes
PROCESSOR = "LlavaOnevisionProcessor"
VIDEO = "llava_onevision"
SEES, HEARS = True, False


def adapt(model, **processor_outputs) -> AdaptedInputs:
    """``processor_outputs``: what ``LlavaOnevisionProcessor`` returns (``input_ids``,
    ``attention_mask``, ``pixel_values``, ``image_sizes``, ``pixel_values_videos``, ...)."""
    inputs = check_processor_outputs(model, processor_outputs)
    config = model.config
    image = token_id(config, "image_token_id", "image_token_index")
    video = token_id(config, "video_token_id", "video_token_index")
    ids = inputs["input_ids"]
    images = [(*run, run[2] - run[1]) for run in placeholder_runs(ids, [image])]
    if not images:
        refuse_unused(inputs, ("pixel_values", "image_sizes"), "image", image)
    else:
        require(inputs, ("pixel_values", "image_sizes"), "image", image,
                sum(block[3] for block in images))
        sizes = _checks.tensor("image_sizes", inputs["image_sizes"], ndim=2, integer=True)
        _checks.tensor("pixel_values", inputs["pixel_values"], ndim=(4, 5), floating=True)
        if len(images) != sizes.shape[0]:
            raise ValueError(f"input_ids hold {len(images)} image block(s) (placeholder id "
                             f"{image}) but image_sizes describes {sizes.shape[0]} image(s)")
    videos = [(*run, run[2] - run[1]) for run in placeholder_runs(ids, [video])]
    if not videos:
        refuse_unused(inputs, ("pixel_values_videos",), "video", video)
    else:
        require(inputs, ("pixel_values_videos",), "video", video,
                sum(block[3] for block in videos))
        pixels = _checks.tensor("pixel_values_videos", inputs["pixel_values_videos"], ndim=5,
                                floating=True)
        side = config.vision_config.image_size // config.vision_config.patch_size
        pooled = math.ceil(side / 2) ** 2  # the model's apply_pooling halves each side
        frames = pixels.shape[1]
        check_placeholders("video", video, videos, [frames * pooled + 1] * pixels.shape[0],
                           f"pixel_values_videos {list(pixels.shape)} ({frames} frames x "
                           f"{pooled} pooled patches + 1 newline each)")
    return adapted(model, inputs, visual_ids=[image, video], audio_ids=(),
                   text_embeddings=[_image_newline(model)])


def _image_newline(model):
    for name, parameter in model.named_parameters():
        if name.endswith("image_newline"):
            return parameter.detach()
    raise ValueError(f"{type(model).__name__} has no image_newline parameter")


def export_inputs(model, processor, media, prompt: str) -> tuple[dict, dict]:
    """One image or video: its placeholder (``<image>``, ``<video>``) then the prompt (or the
    chat template). A video's audio track is not used: the model hears nothing."""
    token = processor.video_token if media.kind == "video" else processor.image_token
    text = prompt_text(processor, media.kind, token, prompt)
    return {"text": [text], "return_tensors": "pt", **vision_inputs(media)}, {}
