"""Qwen2.5-VL (``Qwen2_5_VLForConditionalGeneration``): images and video with M-RoPE positions
``[3, B, L]``.

Refused before the vision tower runs: placeholders without their pixel values or grid, pixel
values without placeholders, a grid or pixel values that disagree with the placeholders, and
prompts with images or video but no ``mm_token_type_ids`` (or ones that disagree with the
placeholders): the model would give them 1-D positions."""
from __future__ import annotations

import inspect

import torch

from avex.adapters._capture import (AdaptedInputs, adapted, check_placeholders,
                                    check_processor_outputs, grid_token_counts, placeholder_runs,
                                    refuse_unused, require, token_id)
from avex.adapters._export import marker, prompt_text, vision_inputs

MODEL_TYPES = ("qwen2_5_vl",)
# the model computes position ids of its own ([3, B, L] M-RoPE), which an export must
# record and every forward of a compacted sequence must pass
OWN_POSITIONS = True
# export (avex.adapters._export): its processor, its video processor's style, what it takes
PROCESSOR = "Qwen2_5_VLProcessor"
VIDEO = "qwen2_vl"
SEES, HEARS = True, False
# the most elongated image or video frame (its longer side over its shorter) the Qwen2-VL
# resize takes (transformers' smart_resize, and avex.data.video's frames processor): export
# refuses a longer one from its header (avex.adapters._export.unusable_header)
MAX_ASPECT_RATIO = 200
# vLLM (avex.integrations.vllm): the architecture the plugin serves pruned
VLLM_ARCHITECTURE = "Qwen2_5_VLForConditionalGeneration"


def adapt(model, **processor_outputs) -> AdaptedInputs:
    """``processor_outputs``: what ``Qwen2_5_VLProcessor`` returns (``input_ids``,
    ``attention_mask``, ``mm_token_type_ids``, ``pixel_values(_videos)``,
    ``image_grid_thw`` / ``video_grid_thw``, ``second_per_grid_ts``)."""
    inputs = check_processor_outputs(model, processor_outputs)
    config = model.config
    image, video = token_id(config, "image_token_id"), token_id(config, "video_token_id")
    merge = config.vision_config.spatial_merge_size
    ids = inputs["input_ids"]
    for what, token, pixels, grid in (("image", image, "pixel_values", "image_grid_thw"),
                                      ("video", video, "pixel_values_videos",
                                       "video_grid_thw")):
        check_vision_blocks(inputs, what, token, pixels, grid, merge,
                            [(*run, run[2] - run[1]) for run in placeholder_runs(ids, [token])])
    if "second_per_grid_ts" in inputs and "video_grid_thw" in inputs:
        check_per_video("second_per_grid_ts", inputs["second_per_grid_ts"],
                        inputs["video_grid_thw"].shape[0])
    if "mm_token_type_ids" in inspect.signature(type(model).forward).parameters:
        check_token_types(inputs, image, video)
    return adapted(model, inputs, visual_ids=[image, video], audio_ids=(),
                   native_positions=True)


def check_vision_blocks(inputs: dict, what: str, token: int, pixels: str, grid: str,
                        merge: int, blocks: list[tuple]) -> None:
    """The ``what`` placeholder blocks (row, start, end, tokens) against ``pixels`` and
    ``grid`` (shared with Qwen2.5-Omni)."""
    if not blocks:
        refuse_unused(inputs, (pixels, grid), what, token)
        return
    require(inputs, (pixels, grid), what, token, sum(block[3] for block in blocks))
    check_placeholders(what, token, blocks, grid_token_counts(inputs, pixels, grid, merge),
                       f"{grid} (t * h * w / {merge}**2)")


def check_per_video(name: str, value, videos: int) -> None:
    if not isinstance(value, torch.Tensor) or value.dim() != 1 or value.shape[0] != videos:
        shape = list(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"{name} must hold one value per video ([{videos}], as video_grid_thw "
                         f"has {videos} rows), got {shape}")


def check_token_types(inputs: dict, image: int, video: int) -> None:
    """``mm_token_type_ids``, which this model's M-RoPE reads, present wherever the prompt has
    images or video, and 1 at the image placeholders, 2 at the video ones, 0 elsewhere."""
    ids = inputs["input_ids"]
    expected = torch.where(ids == image, 1, torch.where(ids == video, 2, 0))
    types = inputs.get("mm_token_type_ids")
    if types is None:
        if bool(expected.any()):
            raise ValueError(
                "mm_token_type_ids is missing: this model computes M-RoPE positions only with "
                "it, so the image and video tokens would silently get 1-D positions. Pass what "
                "the processor returns (older processors don't: 0 text, 1 image placeholder, "
                "2 video placeholder, per position of input_ids)")
        return
    if not isinstance(types, torch.Tensor) or types.shape != ids.shape:
        shape = list(types.shape) if isinstance(types, torch.Tensor) else type(types).__name__
        raise ValueError(f"mm_token_type_ids must have the shape of input_ids "
                         f"{list(ids.shape)}, got {shape}")
    wrong = types.to(expected.device) != expected
    if bool(wrong.any()):
        b, pos = torch.nonzero(wrong)[0].tolist()
        raise ValueError(f"mm_token_type_ids must be 1 at image placeholders (id {image}), 2 at "
                         f"video placeholders (id {video}) and 0 elsewhere, got "
                         f"{int(types[b, pos])} at sample {b}, position {pos} (token id "
                         f"{int(ids[b, pos])})")


def export_inputs(model, processor, media, prompt: str) -> tuple[dict, dict]:
    """One image or video: ``<|vision_start|><|image_pad|> or <|video_pad|><|vision_end|>``
    then the prompt (or the chat template), the frames with their sampling rate (its M-RoPE
    times them by it). A video's audio track is not used: the model hears nothing."""
    start = marker(processor, model.config, "vision_start_token_id")
    end = marker(processor, model.config, "vision_end_token_id")
    token = processor.video_token if media.kind == "video" else processor.image_token
    text = prompt_text(processor, media.kind, f"{start}{token}{end}", prompt)
    return {"text": [text], "return_tensors": "pt", **vision_inputs(media)}, {}
