"""Qwen2-Audio (``Qwen2AudioForConditionalGeneration``): audio, 1-D RoPE.

Refused before the audio tower runs: audio placeholders without ``input_features`` and
``feature_attention_mask``, features without placeholders, and placeholder blocks whose lengths
disagree with the valid frames of ``feature_attention_mask``."""
from __future__ import annotations

from avex.adapters._capture import (AdaptedInputs, adapted, audio_token_counts,
                                    check_placeholders, check_processor_outputs,
                                    placeholder_runs, refuse_unused, require, token_id)
from avex.adapters._export import prompt_text

MODEL_TYPES = ("qwen2_audio",)
OWN_POSITIONS = False   # 1-D positions: the default arange
# export (avex.adapters._export): its processor, no video processor, what it takes
PROCESSOR = "Qwen2AudioProcessor"
VIDEO = None
SEES, HEARS = False, True
AUDIO_INPUTS = ("input_features", "feature_attention_mask")


def audio_tokens(frames: int) -> int:
    """The audio tokens the processor gives (and the audio tower makes of) ``frames`` valid
    mel frames: the tower's stride-2 convolution, then its stride-2 pooling. Fewer than 3
    frames make none: export refuses such audio from its header
    (avex.adapters._export.unusable_header)."""
    convolved = (frames - 1) // 2 + 1
    return max(0, (convolved - 2) // 2 + 1)


def adapt(model, **processor_outputs) -> AdaptedInputs:
    """``processor_outputs``: what ``Qwen2AudioProcessor`` returns (``input_ids``,
    ``attention_mask``, ``input_features``, ``feature_attention_mask``)."""
    inputs = check_processor_outputs(model, processor_outputs)
    audio = token_id(model.config, "audio_token_id", "audio_token_index")
    blocks = [(*run, run[2] - run[1]) for run in placeholder_runs(inputs["input_ids"], [audio])]
    if not blocks:
        refuse_unused(inputs, AUDIO_INPUTS, "audio", audio)
    else:
        require(inputs, AUDIO_INPUTS, "audio", audio, sum(block[3] for block in blocks))
        check_placeholders("audio", audio, blocks, audio_token_counts(model, inputs),
                           "feature_attention_mask (valid frames through the audio tower)")
    return adapted(model, inputs, visual_ids=(), audio_ids=[audio])


def export_inputs(model, processor, media, prompt: str) -> tuple[dict, dict]:
    """An audio file, or a video's audio track (the model sees nothing):
    ``<|audio_bos|><|AUDIO|><|audio_eos|>`` then the prompt (or the chat template), the
    samples at the feature extractor's rate."""
    place = f"{processor.audio_bos_token}{processor.audio_token}{processor.audio_eos_token}"
    text = prompt_text(processor, "audio", place, prompt)
    return {"text": [text], "audio": [media.audio], "return_tensors": "pt",
            "sampling_rate": media.sampling_rate}, {}
