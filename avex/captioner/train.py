"""Training the embedded captioner: a small Qwen2-architecture LM (random init) plus an AV
projector, trained once on full tokens to write the AV caption, then saved with safetensors."""
from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from .. import _checks
from ..data.cache import FeatureCache
from ..data.embedded import ensure_benchmark
from ..files import cpu_state_dict
from ..modality import AUDIO, VISUAL
from ..paths import default_captioner_path
from ..progress import progress_bar, show, transformers_progress
from ..reward import CiderD
from .batch import AVProjector
from .frozen import (CAPTIONER_FILE, CAPTIONER_FORMAT, PROJECTOR_FILE, FrozenCaptioner,
                     default_device)
from .reference import install_reference, reference_name


@dataclass(frozen=True)
class CaptionerConfig:
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 256
    steps: int = 600
    batch_size: int = 64
    lr: float = 2e-3
    weight_decay: float = 0.01
    warmup_frac: float = 0.05
    grad_clip: float = 1.0
    seed: int = 0
    max_new_tokens: int = 32
    eval_clips: int = 200          # val clips captioned at the end (CIDEr recorded)

    def validate(self) -> "CaptionerConfig":
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "intermediate_size", "steps", "batch_size", "max_new_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must divide by num_heads "
                             f"({self.num_heads}), and num_heads by num_kv_heads "
                             f"({self.num_kv_heads})")
        _checks.positive_float("lr", self.lr)
        _checks.positive_float("grad_clip", self.grad_clip)
        _checks.real("weight_decay", self.weight_decay, low=0)
        _checks.real("warmup_frac", self.warmup_frac, low=0, high=1, high_open=True)
        _checks.int_at_least("seed", self.seed, 0)
        _checks.int_at_least("eval_clips", self.eval_clips, 0)
        return self


PRESETS = {
    # 150 steps at 1e-2: fewer (4 once) leave a captioner whose every reward is 0
    "tiny": CaptionerConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                            intermediate_size=64, steps=150, lr=1e-2, batch_size=8,
                            eval_clips=4, max_new_tokens=12),
    "default": CaptionerConfig(),
    "large": CaptionerConfig(hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4,
                             intermediate_size=1024, steps=3000),
}


def _new_model(cfg: CaptionerConfig, tokenizer, max_positions: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=max_positions, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None, use_cache=True)
    return Qwen2ForCausalLM(config)


class _TrainSet:
    """The train split's features held as stacked tensors (the embedded benchmark's train split
    is tens of MB), so a step costs no per-clip reads. Needs equal token counts and prompt
    lengths in every clip, which the generator guarantees."""

    MAX_BYTES = 1 << 30

    def __init__(self, split):
        rows = [split.cache.rows[i] for i in split.indices]
        shapes = {(r["n_visual"], r["n_audio"]) for r in rows}
        if len(shapes) != 1:
            raise ValueError(f"captioner training needs one token layout per split; the train "
                             f"split has {sorted(shapes)} (n_visual, n_audio) layouts")
        n_visual, n_audio = shapes.pop()
        size = len(rows) * (n_visual + n_audio) * split.cache.meta.dim * 4
        if size > self.MAX_BYTES:
            raise ValueError(f"the train split holds {size / 2**30:.1f} GiB of features; "
                             "captioner training stacks them in memory (limit 1 GiB)")
        clips = list(split)
        prefix = {tuple(c.prompt_prefix_ids.tolist()) for c in clips}
        suffix = {tuple(c.prompt_suffix_ids.tolist()) for c in clips}
        if len(prefix) != 1 or len(suffix) != 1:
            raise ValueError("captioner training needs one prompt shared by every train clip")
        self.visual = torch.stack([c.visual.float() for c in clips])
        self.audio = torch.stack([c.audio.float() for c in clips])
        self.prefix_ids = clips[0].prompt_prefix_ids
        self.suffix_ids = clips[0].prompt_suffix_ids
        self.refs = [c.refs_av for c in clips]

    def __len__(self) -> int:
        return len(self.refs)


def _training_batch(captioner: FrozenCaptioner, data: _TrainSet, index, targets: list) -> dict:
    """Teacher-forcing batch [prefix, video, audio, suffix, caption, eos], right-padded after the
    caption; loss on the caption and eos only. Gradients reach the projector and the LM."""
    tok, device = captioner.tokenizer, captioner.device
    embed = captioner.model.get_input_embeddings()
    index = torch.as_tensor(index)
    n = len(index)
    captions = [tok(t, add_special_tokens=False)["input_ids"] + [captioner.eos_token_id]
                for t in targets]
    length = max(len(c) for c in captions)
    caption_ids = torch.full((n, length), tok.pad_token_id, dtype=torch.long)
    caption_mask = torch.zeros(n, length, dtype=torch.long)
    for b, ids in enumerate(captions):
        caption_ids[b, :len(ids)] = torch.tensor(ids)
        caption_mask[b, :len(ids)] = 1
    caption_ids, caption_mask = caption_ids.to(device), caption_mask.to(device)
    prefix = embed(data.prefix_ids.to(device)).expand(n, -1, -1)
    suffix = embed(data.suffix_ids.to(device)).expand(n, -1, -1)
    visual = captioner.projector(data.visual[index].to(device), VISUAL)
    audio = captioner.projector(data.audio[index].to(device), AUDIO)
    inputs = torch.cat([prefix, visual, audio, suffix, embed(caption_ids)], dim=1)
    context = inputs.shape[1] - length
    mask = torch.cat([torch.ones(n, context, dtype=torch.long, device=device), caption_mask], 1)
    labels = torch.cat([torch.full((n, context), -100, dtype=torch.long, device=device),
                        caption_ids.masked_fill(caption_mask == 0, -100)], dim=1)
    return {"inputs_embeds": inputs, "attention_mask": mask, "labels": labels}


def train_captioner(benchmark_path, out_dir, cfg: CaptionerConfig = CaptionerConfig(), *,
                    device=None, progress: bool = True, overwrite: bool = False) -> Path:
    """Train on the benchmark's train split (full tokens, one random AV reference per clip per
    step) and save to ``out_dir``: the HF model and tokenizer (``save_pretrained``), the
    projector and ``avex_captioner.json``. Returns ``out_dir``."""
    from transformers import AutoTokenizer

    cfg.validate()
    out_dir = check_captioner_out(out_dir, overwrite)
    cache = FeatureCache(benchmark_path)
    tokenizer_path = cache.tokenizer_path()
    if tokenizer_path is None:
        raise ValueError(f"{benchmark_path}: meta.json names no tokenizer for the prompt ids; "
                         "a captioner cannot be trained on it")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    data = _TrainSet(cache.split("train"))
    max_caption = max(len(r.split()) for refs in data.refs for r in refs)
    max_positions = 1 << math.ceil(math.log2(
        len(data.prefix_ids) + data.visual.shape[1] + data.audio.shape[1]
        + len(data.suffix_ids) + max(max_caption, cfg.max_new_tokens) + 2))
    device = torch.device(device) if device is not None else default_device()
    torch.manual_seed(cfg.seed)
    model = _new_model(cfg, tokenizer, max_positions).to(device)
    projector = AVProjector(cache.meta.dim, cfg.hidden_size, "mlp").to(device)
    captioner = FrozenCaptioner(model, tokenizer, projector, max_new_tokens=cfg.max_new_tokens)
    losses, train_seconds = _fit(captioner, model, projector, data, cfg, progress)

    captioner = FrozenCaptioner(model, tokenizer, projector, max_new_tokens=cfg.max_new_tokens)
    val = cache.split("val" if "val" in {r["split"] for r in cache.rows} else "train")
    eval_clips = [val[i] for i in range(min(cfg.eval_clips, len(val)))]
    captions = captioner.caption(eval_clips)
    # CIDEr-D x100 with document frequencies from these val references (pycocoevalcap's rule)
    val_cider = float(100 * CiderD().score(captions, [c.refs_av for c in eval_clips]).mean())
    info = {
        "format": CAPTIONER_FORMAT, "version": 1, "feature_dim": cache.meta.dim,
        "projector": "mlp", "max_new_tokens": cfg.max_new_tokens,
        "benchmark": {"path": str(Path(benchmark_path).resolve()),
                      "source": cache.meta.source},
        "training": {**asdict(cfg), "device": str(device), "seconds": round(train_seconds, 1),
                     "initial_loss": round(float(np.mean(losses[:5])), 4),
                     "final_loss": round(float(np.mean(losses[-20:])), 4),
                     "val_clips": len(eval_clips), "val_cider": round(val_cider, 2),
                     "val_examples": [{"clip_id": c.clip_id, "caption": t, "ref": c.refs_av[0]}
                                      for c, t in zip(eval_clips[:3], captions[:3])]},
    }
    _save(out_dir, model, tokenizer, projector, info, progress)
    return out_dir


def _fit(captioner, model, projector, data: _TrainSet, cfg: CaptionerConfig,
         progress: bool) -> tuple[list[float], float]:
    """Teacher-forced AdamW steps with warmup + cosine; returns (losses, seconds)."""
    params = list(model.parameters()) + list(projector.parameters())
    for p in params:
        p.requires_grad_(True)
    model.train()
    projector.train()
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    warmup = max(1, int(cfg.warmup_frac * cfg.steps))

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, cfg.steps - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    rng = np.random.Generator(np.random.PCG64(cfg.seed))
    order, cursor = rng.permutation(len(data)), 0
    started = time.perf_counter()
    losses = []
    bar = progress_bar(range(cfg.steps), desc="training captioner", unit="step",
                       disable=not progress)
    for step in bar:
        if cursor + cfg.batch_size > len(order):
            order, cursor = rng.permutation(len(data)), 0
        index = order[cursor:cursor + cfg.batch_size]
        cursor += cfg.batch_size
        targets = [data.refs[i][int(rng.integers(len(data.refs[i])))] for i in index]
        loss = model(**_training_batch(captioner, data, index, targets)).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        if step % 10 == 0:
            show(bar, loss=f"{np.mean(losses[-20:]):.3f}")
    return losses, time.perf_counter() - started


def check_captioner_out(out_dir, overwrite: bool, name: str = "out") -> Path:
    """``out_dir``, resolved, where a captioner may be written: a new or empty folder, or (with
    ``overwrite``) one holding a captioner, which is then replaced. Anything else is refused,
    naming ``name``: saving replaces the whole folder, and a user's files are never deleted."""
    given = Path(out_dir)
    if given.is_symlink():
        raise ValueError(f"{name}: {str(given)!r} is a symbolic link (to "
                         f"{str(given.resolve())!r}); pass the folder itself")
    out_dir = given.resolve()
    if not out_dir.exists():
        return out_dir
    if not out_dir.is_dir():
        raise ValueError(f"{name}: {str(given)!r} is a file, not a folder")
    if (out_dir / CAPTIONER_FILE).is_file():
        if not overwrite:
            raise FileExistsError(f"{name}: a captioner already exists at {str(given)!r}; "
                                  "pass --overwrite (overwrite=True) to replace it")
        return out_dir
    held = sorted(p.name for p in out_dir.iterdir())
    if held:
        raise ValueError(f"{name}: {str(given)!r} holds files that are not a captioner (e.g. "
                         f"{held[:3]}); saving replaces the whole folder, so give a new or "
                         "empty one")
    return out_dir


def _save(out_dir: Path, model, tokenizer, projector, info: dict, progress: bool = True) -> None:
    """Write the captioner to a staging folder, then rename it into place."""
    staging = out_dir.parent / f".{out_dir.name}.tmp"
    if staging.exists():
        shutil.rmtree(staging)
    with transformers_progress(progress):   # its "Writing model shards" bar
        model.save_pretrained(str(staging))
    tokenizer.save_pretrained(str(staging / "tokenizer"))
    save_file(cpu_state_dict(projector), str(staging / PROJECTOR_FILE))
    (staging / CAPTIONER_FILE).write_text(json.dumps(info, indent=1) + "\n")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    staging.rename(out_dir)


def ensure_captioner(benchmark_preset: str = "default", captioner_preset: str = "default", *,
                     seed: int = 0, cache_dir=None, progress: bool = True) -> Path:
    """The default embedded captioner's directory, building the benchmark first if it is
    missing. The captioner is the shipped reference where the package has one for this
    benchmark and preset (the same weights on every machine: avex.captioner.reference), and
    trained here otherwise."""
    bench = ensure_benchmark(benchmark_preset, cache_dir=cache_dir, seed=seed, progress=progress)
    path = default_captioner_path(bench.name, captioner_preset, cache_dir)
    if not (path / CAPTIONER_FILE).is_file():
        name = reference_name(bench.name, captioner_preset)
        if name is not None:
            install_reference(name, path, benchmark_path=bench)
        else:
            train_captioner(bench, path, PRESETS[captioner_preset], progress=progress)
    return path
