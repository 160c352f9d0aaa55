"""A tiny random Qwen2.5-VL checkpoint that vLLM can load (config, weights, a word-level
tokenizer, the image and video processors), a random saved AVEX policy for it, and prompts
with a square image, a non-square image and a video. Built offline; used by
tests/test_vllm_engine.py and bench/bench_vllm.py (which passes larger sizes).

The video's temporal positions (frame index x tokens per second x seconds per temporal patch)
stay below its height and width in merged patches: there transformers (which starts the text
after a video at start + max(h, w)) and vLLM (largest position + 1) agree."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

SPECIAL = {"<|image_pad|>": 191, "<|video_pad|>": 192, "<|vision_start|>": 195,
           "<|vision_end|>": 196}
VOCAB = 200
WORDS = [f"w{i}" for i in range(3, 191)]
# vLLM's CPU attention takes head sizes of 32 and up
TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=4096, initializer_range=0.3)
VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=2,
              spatial_merge_size=2, temporal_patch_size=2, window_size=8,
              fullatt_block_indexes=[0], tokens_per_second=2)
FPS = 4.0  # seconds per temporal patch = 2 / FPS = 0.5, x 2 tokens per second = 1


def build_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, "<eos>": 2}
    vocab.update({word: i for i, word in enumerate(WORDS, start=3)})
    vocab.update(SPECIAL)
    vocab.update({f"x{i}": i for i in range(VOCAB) if i not in vocab.values()})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    names = {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
             "vision_bos_token": "<|vision_start|>", "vision_eos_token": "<|vision_end|>"}
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>",
                                   eos_token="<eos>", padding_side="left",
                                   extra_special_tokens=names)


def build_checkpoint(folder, *, text=None, vision=None, seed=0) -> Path:
    """A random Qwen2.5-VL (float32) and its processor, saved to ``folder``."""
    from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration,
                              Qwen2_5_VLProcessor, Qwen2VLImageProcessor)
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    folder = Path(folder)
    text = dict(TEXT, **(text or {}))
    vision = dict(VISION, out_hidden_size=text["hidden_size"], **(vision or {}))
    config = Qwen2_5_VLConfig(
        text_config=dict(text, vocab_size=VOCAB, eos_token_id=2, bos_token_id=None,
                         rope_parameters=dict(rope_type="default", mrope_section=_sections(text),
                                              rope_theta=10000.0)),
        vision_config=vision, image_token_id=SPECIAL["<|image_pad|>"],
        video_token_id=SPECIAL["<|video_pad|>"],
        vision_start_token_id=SPECIAL["<|vision_start|>"],
        vision_end_token_id=SPECIAL["<|vision_end|>"], pad_token_id=0, eos_token_id=2)
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    model.save_pretrained(folder)
    pixels = dict(patch_size=2, merge_size=2, temporal_patch_size=2,
                  size={"shortest_edge": 16, "longest_edge": 64 * 64})
    processor = Qwen2_5_VLProcessor(image_processor=Qwen2VLImageProcessor(**pixels),
                                    video_processor=Qwen2VLVideoProcessor(**pixels),
                                    tokenizer=build_tokenizer())
    processor.save_pretrained(folder)
    return folder


def _sections(text) -> list:
    half = text["hidden_size"] // text["num_attention_heads"] // 2
    t = half // 2
    return [t, (half - t) // 2, half - t - (half - t) // 2]


def build_policy(folder, model_folder, *, seed=0, layout="visual",
                 retention_range=(0.1, 1.0), hidden=None, text_gain=3.0,
                 retention_input=False, merge_threshold=None) -> Path:
    """A randomly initialised AVEX policy for the model in ``model_folder``, saved with
    ``save_pretrained`` and a TrainedOn record (``hidden``: record another width instead).
    Its cross-attention to the text is scaled by ``text_gain``: at random initialisation the
    text barely moves the choice (a trained policy's does), and the tests need it to. With
    ``retention_input``, its retention projection is random and large, so that rho moves the
    choice too. ``merge_threshold``: the policy's (its dropped tokens merged when served)."""
    from avex.policy import AVEXPolicy, PolicyConfig, TrainedOn

    config = json.loads((Path(model_folder) / "config.json").read_text())
    hidden = hidden or config.get("text_config", config)["hidden_size"]
    torch.manual_seed(seed)
    policy = AVEXPolicy(PolicyConfig(input_size=hidden, hidden_size=32, num_heads=4,
                                     retention_input=retention_input,
                                     merge_threshold=merge_threshold))
    with torch.no_grad():
        policy.cross_attn.in_proj_weight.mul_(text_gain)
        policy.cross_attn.out_proj.weight.mul_(text_gain)
        if retention_input:
            policy.retention_in.copy_(3 * torch.randn_like(policy.retention_in))
    policy.trained_on = TrainedOn(config["model_type"], hidden, layout, tuple(retention_range))
    return policy.save_pretrained(folder)


def media(seed=0, video_frames=6, video_size=(16, 20)):
    """A square image, a non-square image and a video (frames, with vLLM's metadata)."""
    rng = np.random.default_rng(seed)
    square = rng.integers(0, 255, (16, 16, 3), dtype=np.uint8)
    wide = rng.integers(0, 255, (12, 20, 3), dtype=np.uint8)
    frames = rng.integers(0, 255, (video_frames, *video_size, 3), dtype=np.uint8)
    metadata = {"total_num_frames": video_frames, "fps": FPS, "duration": video_frames / FPS,
                "video_backend": "opencv", "frames_indices": list(range(video_frames)),
                "do_sample_frames": False}
    return {"square": square, "wide": wide, "video": (frames, metadata)}


IMAGE = "<|vision_start|> <|image_pad|> <|vision_end|>"
VIDEO = "<|vision_start|> <|video_pad|> <|vision_end|>"


def prompts(items):
    """Four prompts, (text, {"image": [...], "video": [...]}); the last asks about the first's
    image in other words (a cache keyed by the image alone would hand it the first's choice)."""
    return [
        (f"w3 w4 {IMAGE} w5 w6 w7", {"image": [items["square"]]}),
        (f"w8 {IMAGE} w9 w10 {VIDEO} w11 w12", {"image": [items["wide"]],
                                                 "video": [items["video"]]}),
        (f"w13 w14 w15 {VIDEO} w16", {"video": [items["video"]]}),
        (f"w30 w31 w32 w33 {IMAGE} w34", {"image": [items["square"]]}),
    ]


def hf_inputs(processor, batch):
    """The Hugging Face processor's outputs for prompts of :func:`prompts` (left-padded)."""
    from transformers.video_utils import VideoMetadata

    images = [image for _, data in batch for image in data.get("image", [])]
    videos = [video for _, data in batch for video in data.get("video", [])]
    kwargs = {}
    if images:
        kwargs["images"] = images
    if videos:
        kwargs["videos"] = [frames for frames, _ in videos]
        kwargs["video_metadata"] = [VideoMetadata(**{k: v for k, v in meta.items()
                                                     if k != "do_sample_frames"})
                                    for _, meta in videos]
        kwargs["do_sample_frames"] = False
    return processor(text=[text for text, _ in batch], return_tensors="pt", padding=True,
                     **kwargs)
