"""Train once, prune anywhere: from media files to a trained policy to a pruned ``generate``.

    python examples/train_once_prune_anywhere.py --family qwen2_5_omni --workdir /tmp/avex-example

The whole user path on a tiny random model, in about a minute on a laptop CPU:

1. a few short media files (MP4 with an AAC track, WAV, PNG) and their reference captions;
2. a tiny random Qwen2.5-Omni thinker (video + audio, interleaved with use_audio_in_video),
   Qwen2.5-VL (video and images), Qwen2-Audio (audio files and videos' audio tracks) or
   LLaVA-OneVision (video and images), saved with ``save_pretrained`` with its processor;
3. export: ``python -m avex.data export`` (``avex.data.export.export_cache``) through the
   model's processor and ``avex.adapters.adapt`` into a feature cache;
4. train: ``python -m avex.train --data CACHE --captioner MODEL`` (a few steps);
5. serve: ``avex.load_policy(run, model=model)``, then
   ``adapt(model, **processor(...)).prune(policy=policy, retention=0.4)`` and ``generate``.

With a real model, step 2 is the model's own folder. Here the processor is assembled offline
from its parts (a word-level tokenizer that knows the model's placeholder tokens, the model
family's Pillow image processor, Whisper's feature extractor, and the library's own video
processor, ``avex.data.video``, which needs no torchvision) and saved beside the model, where
``python -m avex.data export --model DIR`` and ``avex.data.processor.load_processor`` read it.
Nothing is downloaded.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

WORDS = ["a", "dog", "cat", "barks", "meows", "runs", "sits", "on", "the", "grass", "sofa",
         "loudly", "while", "music", "plays", "man", "speaks", "bird", "sings", "car", "passes"]
TEXT_VOCAB = 200
SPECIAL = {"qwen2_5_omni": {"<|AUDIO|>": 190, "<|IMAGE|>": 191, "<|VIDEO|>": 192,
                            "<|audio_bos|>": 193, "<|audio_eos|>": 194, "<|vision_bos|>": 195,
                            "<|vision_eos|>": 196},
           "qwen2_5_vl": {"<|image_pad|>": 191, "<|video_pad|>": 192,
                          "<|vision_start|>": 195, "<|vision_end|>": 196},
           "qwen2_audio": {"<|AUDIO|>": 190, "<|audio_bos|>": 193, "<|audio_eos|>": 194},
           "llava_onevision": {"<image>": 191, "<video>": 192}}
#: what each family takes: video and images, audio files
SEES = {"qwen2_5_omni": True, "qwen2_5_vl": True, "qwen2_audio": False, "llava_onevision": True}
HEARS = {"qwen2_5_omni": True, "qwen2_5_vl": False, "qwen2_audio": True,
         "llava_onevision": False}
TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=2048, vocab_size=TEXT_VOCAB,
            rope_parameters=dict(rope_type="default", mrope_section=[2, 1, 1],
                                 rope_theta=10000.0))
VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
              fullatt_block_indexes=[0], patch_size=2, spatial_merge_size=2,
              temporal_patch_size=2)


# ----------------------------------------------------------------------------------------------
# 1. media files and captions
# ----------------------------------------------------------------------------------------------

def write_video(path: Path, seed: int, seconds: float = 4.0, fps: int = 8, size: int = 16,
                rate: int = 16000, audio: bool = True, faststart: bool = False) -> None:
    """An MP4 (MPEG-4 video, AAC audio) of moving noise and a tone, written with PyAV
    (``faststart``: its index before the data, as streaming sites write them)."""
    import av

    rng = np.random.default_rng(seed)
    with av.open(str(path), "w", options={"movflags": "faststart"} if faststart else {}) as out:
        video = out.add_stream("mpeg4", rate=fps)
        video.width = video.height = size
        video.pix_fmt = "yuv420p"
        sound = out.add_stream("aac", rate=rate) if audio else None
        if sound is not None:
            sound.layout = "mono"
        for _ in range(int(seconds * fps)):
            frame = rng.integers(0, 255, (size, size, 3), dtype=np.uint8)
            for packet in video.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                out.mux(packet)
        for packet in video.encode():
            out.mux(packet)
        if sound is None:
            return
        t = np.arange(int(seconds * rate)) / rate
        wave = (0.3 * np.sin(2 * np.pi * (220 + 110 * seed) * t)).astype(np.float32)
        step = sound.codec_context.frame_size or 1024
        for start in range(0, len(wave), step):
            frame = av.AudioFrame.from_ndarray(wave[None, start:start + step], format="flt",
                                               layout="mono")
            frame.sample_rate, frame.pts = rate, start
            for packet in sound.encode(frame):
                out.mux(packet)
        for packet in sound.encode():
            out.mux(packet)


def write_media(folder: Path, family: str, seed: int = 0) -> Path:
    """Up to six clips and ``captions.jsonl``: videos (with their audio track), a WAV (for a
    model that hears) and a PNG (for one that sees); the second and the last are test clips,
    the others train clips."""
    import soundfile
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    files = []
    for i in range(4):
        write_video(folder / f"clip{i}.mp4", seed + i)
        files.append(f"clip{i}.mp4")
    if HEARS[family]:
        soundfile.write(str(folder / "sound.wav"),
                        (0.2 * rng.standard_normal(24000)).astype(np.float32), 22050)
        files.append("sound.wav")
    if SEES[family]:
        Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)).save(
            folder / "still.png")
        files.append("still.png")
    rows = []
    for i, name in enumerate(files):
        captions = [" ".join(rng.choice(WORDS, 5)) for _ in range(3)]
        rows.append({"file": name, "captions": captions,
                     "split": "test" if i in (1, len(files) - 1) else "train"})
    (folder / "captions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder / "captions.jsonl"


# ----------------------------------------------------------------------------------------------
# 2. a tiny random model and its processor, built offline
# ----------------------------------------------------------------------------------------------

def build_model(family: str):
    """A tiny random model whose LM head can write only the captions' words (the other rows
    are zeroed): random weights would rarely write a reference word, every reward would be 0,
    and avex.train refuses to train on that."""
    model = _random_model(family)
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        words = torch.zeros(head.shape[0], dtype=torch.bool)
        words[3:3 + len(WORDS)] = True   # build_tokenizer's ids of WORDS
        head[~words] = 0.0
    return model


def _random_model(family: str):
    torch.manual_seed(0)
    ids = SPECIAL[family]
    if family == "qwen2_5_omni":
        from transformers import (Qwen2_5OmniThinkerConfig,
                                  Qwen2_5OmniThinkerForConditionalGeneration)
        config = Qwen2_5OmniThinkerConfig(
            text_config=TEXT, vision_config=VISION,
            audio_config=dict(num_mel_bins=8, encoder_layers=1, encoder_attention_heads=2,
                              encoder_ffn_dim=32, d_model=16, output_dim=32, n_window=4,
                              max_source_positions=64),
            audio_token_id=ids["<|AUDIO|>"], image_token_id=ids["<|IMAGE|>"],
            video_token_id=ids["<|VIDEO|>"], audio_start_token_id=ids["<|audio_bos|>"],
            audio_end_token_id=ids["<|audio_eos|>"],
            vision_start_token_id=ids["<|vision_bos|>"],
            vision_end_token_id=ids["<|vision_eos|>"], position_id_per_seconds=2,
            seconds_per_chunk=2, pad_token_id=0)
        return Qwen2_5OmniThinkerForConditionalGeneration(config).eval()
    if family == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
        config = Qwen2_5_VLConfig(text_config=TEXT, vision_config=dict(VISION, window_size=8),
                                  image_token_id=ids["<|image_pad|>"],
                                  video_token_id=ids["<|video_pad|>"],
                                  vision_start_token_id=ids["<|vision_start|>"],
                                  vision_end_token_id=ids["<|vision_end|>"], pad_token_id=0)
        return Qwen2_5_VLForConditionalGeneration(config).eval()
    text = {k: v for k, v in TEXT.items() if k != "rope_parameters"}
    if family == "qwen2_audio":
        from transformers import Qwen2AudioConfig, Qwen2AudioForConditionalGeneration
        # 300 source positions: the encoder takes exactly 600 mel frames, 6 s at a 160 hop
        config = Qwen2AudioConfig(
            audio_config=dict(d_model=16, encoder_layers=1, encoder_attention_heads=2,
                              encoder_ffn_dim=32, num_mel_bins=8, max_source_positions=300),
            text_config=dict(text, model_type="qwen2", pad_token_id=0),
            audio_token_index=ids["<|AUDIO|>"])
        return Qwen2AudioForConditionalGeneration(config).eval()
    from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration
    config = LlavaOnevisionConfig(
        text_config=dict(text, model_type="qwen2", pad_token_id=0),
        vision_config=dict(model_type="siglip_vision_model", hidden_size=16,
                           intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           image_size=8, patch_size=2),
        image_token_index=ids["<image>"], video_token_index=ids["<video>"],
        vision_feature_layer=-1, vision_feature_select_strategy="full",
        image_grid_pinpoints=[[8, 8], [8, 16], [16, 8], [16, 16]])
    return LlavaOnevisionForConditionalGeneration(config).eval()


def build_tokenizer(family: str):
    """A word-level tokenizer over WORDS (then filler words up to the model's vocabulary), with
    the family's placeholder and marker tokens at the model's ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<unk>": 1, "<eos>": 2}
    for word in WORDS + [f"w{i}" for i in range(TEXT_VOCAB)]:
        if len(vocab) >= min(SPECIAL[family].values()):
            break
        vocab.setdefault(word, len(vocab))
    vocab.update(SPECIAL[family])
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    names = {"qwen2_5_omni": {"audio_token": "<|AUDIO|>", "image_token": "<|IMAGE|>",
                              "video_token": "<|VIDEO|>", "audio_bos_token": "<|audio_bos|>",
                              "audio_eos_token": "<|audio_eos|>",
                              "vision_bos_token": "<|vision_bos|>",
                              "vision_eos_token": "<|vision_eos|>"},
             "qwen2_5_vl": {"image_token": "<|image_pad|>", "video_token": "<|video_pad|>",
                            "vision_bos_token": "<|vision_start|>",
                            "vision_eos_token": "<|vision_end|>"},
             "qwen2_audio": {"audio_token": "<|AUDIO|>", "audio_bos_token": "<|audio_bos|>",
                             "audio_eos_token": "<|audio_eos|>"},
             "llava_onevision": {"image_token": "<image>", "video_token": "<video>"}}[family]
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>",
                                   unk_token="<unk>", eos_token="<eos>",
                                   extra_special_tokens=names)


def build_processor(family: str, tokenizer=None):
    """The family's processor, assembled from its parts without the hub or torchvision; its
    video processor is the library's (avex.data.video), configured as transformers' own."""
    import transformers
    from transformers import WhisperFeatureExtractor

    from avex.data.processor import assemble_processor
    from avex.data.video import LlavaOnevisionFramesProcessor, QwenVLFramesProcessor

    tokenizer = tokenizer or build_tokenizer(family)
    audio = WhisperFeatureExtractor(feature_size=8, sampling_rate=16000, hop_length=160,
                                    chunk_length=6, n_fft=400)
    if family == "qwen2_audio":
        return transformers.Qwen2AudioProcessor(feature_extractor=audio, tokenizer=tokenizer,
                                                chat_template=None)
    if family == "llava_onevision":
        images = _pil_image_processor("llava_onevision", "LlavaOnevisionImageProcessor")(
            size={"height": 8, "width": 8}, crop_size={"height": 8, "width": 8},
            image_grid_pinpoints=[[8, 8], [8, 16], [16, 8], [16, 16]])
        video = LlavaOnevisionFramesProcessor(size={"height": 8, "width": 8})
        return assemble_processor(transformers.LlavaOnevisionProcessor,
                                  {"image_processor": images, "tokenizer": tokenizer,
                                   "video_processor": video}, num_image_tokens=16,
                                  vision_feature_select_strategy="full", chat_template=None)
    images = _pil_image_processor("qwen2_vl", "Qwen2VLImageProcessor")(
        patch_size=2, temporal_patch_size=2, merge_size=2,
        size={"shortest_edge": 64, "longest_edge": 256})
    video = QwenVLFramesProcessor(patch_size=2, temporal_patch_size=2, merge_size=2,
                                  size={"shortest_edge": 64, "longest_edge": 256})
    parts = {"image_processor": images, "video_processor": video, "tokenizer": tokenizer}
    if family == "qwen2_5_omni":
        return assemble_processor(transformers.Qwen2_5OmniProcessor,
                                  {**parts, "feature_extractor": audio}, chat_template=None)
    return assemble_processor(transformers.Qwen2_5_VLProcessor, parts, chat_template=None)


def _pil_image_processor(module: str, name: str):
    """The Pillow image processor class of a family (transformers 5.2x names it ``...Pil``;
    before, the plain class is the Pillow one)."""
    import importlib

    try:
        found = importlib.import_module(f"transformers.models.{module}."
                                        f"image_processing_pil_{module}")
        return getattr(found, name + "Pil")
    except (ImportError, AttributeError):
        import transformers
        return getattr(transformers, name)


def save_model(model, processor, directory: Path) -> Path:
    """The model with its processor (``python -m avex.data export --model`` reads both), and
    its tokenizer again in ``tokenizer/``: beside a Qwen config.json, the captioner's
    AutoTokenizer would load Qwen2's byte-level tokenizer instead of this word-level one
    (FrozenCaptioner reads ``tokenizer/`` first)."""
    model.save_pretrained(str(directory))
    processor.save_pretrained(str(directory))
    processor.tokenizer.save_pretrained(str(directory / "tokenizer"))
    return directory


# ----------------------------------------------------------------------------------------------
# 3-5. export, train, serve
# ----------------------------------------------------------------------------------------------

TRAIN_FLAGS = ["--device", "cpu", "--batch-size", "2", "--micro-batch-size", "2",
               "--epochs", "1", "--warmup-epochs", "0.5", "--max-new-tokens", "4",
               "--eval-retentions", "0.4", "--eval-methods", "random", "--no-progress"]
RETENTION = 0.4


def serve(model, processor, policy, media_file: Path, retention: float = RETENTION):
    """One request: the file through the processor (as export put it), the adapter, the
    policy's Top-K and compaction, then generate. Returns (adapted inputs, pruned inputs,
    generated ids)."""
    from avex.adapters import adapt, processor_inputs
    from avex.data.media import MediaSettings, read_media
    from avex.pruning import generate

    settings = MediaSettings()    # how python -m avex.data export read the media: its defaults
    rate = processor.feature_extractor.sampling_rate if hasattr(processor,
                                                                "feature_extractor") else None
    media = read_media(media_file, fps=settings.fps, max_frames=settings.max_frames,
                       sampling_rate=rate)
    inputs, model_kwargs = processor_inputs(model, processor, media, settings.prompt,
                                            use_audio_in_video=settings.use_audio_in_video)
    with torch.no_grad():
        adapted = adapt(model, **{k: v for k, v in processor(**inputs).items()
                                  if isinstance(v, torch.Tensor)}, **model_kwargs)
        pruned = adapted.prune(policy=policy, retention=retention)
        tokens = generate(model, pruned, max_new_tokens=4, do_sample=False)
    return adapted, pruned, tokens


def command(*argv) -> None:
    """One documented command, as a user runs it."""
    done = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"python -m {' '.join(argv[:2])} failed:\n{done.stderr[-3000:]}")


def run(family: str, workdir: Path) -> dict:
    import avex
    from avex.data.processor import load_processor

    workdir = Path(workdir)
    captions = write_media(workdir / "media", family)
    model = build_model(family)
    model_dir = save_model(model, build_processor(family), workdir / "model")

    cache, run_dir = workdir / "cache", workdir / "run"
    command("avex.data", "export", "--media", str(workdir / "media"), "--captions",
            str(captions), "--model", str(model_dir), "--out", str(cache), "--no-progress")
    command("avex.train", "--data", str(cache), "--captioner", str(model_dir), "--run-dir",
            str(run_dir), *TRAIN_FLAGS)

    policy = avex.load_policy(run_dir, model=model)
    processor = load_processor(model_dir, model)     # as export loaded it
    test_file = workdir / "media" / "clip1.mp4"
    adapted, pruned, tokens = serve(model, processor, policy, test_file)
    print(f"{family}: exported {cache}, trained {run_dir}; served {test_file.name}: "
          f"{int(pruned.original_length[0])} tokens -> {pruned.inputs_embeds.shape[1]} "
          f"at {RETENTION:.0%} retention, generated {tokens.tolist()}")
    return {"model": model, "processor": processor, "model_dir": model_dir, "cache": cache,
            "run_dir": run_dir, "policy": policy, "pruned": pruned, "tokens": tokens,
            "served_modality": adapted.modality[0],
            "clip_id": "clip1.mp4", "media_file": test_file}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=sorted(SPECIAL), default="qwen2_5_omni")
    parser.add_argument("--workdir", required=True, help="a new folder for everything made")
    args = parser.parse_args(argv)
    run(args.family, Path(args.workdir))


if __name__ == "__main__":
    main()
