"""``python -m avex.train``: warm up the AVEX policy, then train it with RL + exchange preferences.

With no arguments it runs the whole pipeline on the embedded benchmark: build the data and the
frozen captioner if missing, warm up on cached text-to-AV attention, train, evaluate at 40% and
20% retention on the test split against full tokens, random selection and the warmup-only
policy, and print the table. ``--config run.yaml`` and flags override any setting; ``--resume``
continues a killed run from its latest checkpoint. Under ``torchrun`` it trains with
DistributedDataParallel: each rank captions and scores its share of every batch.

One RL step, per micro-batch (Sections 3.3 and 3.4):
    scores      = policy(inputs_embeds, modality)                 on the AV axis [B, M]
    S, log pi   = gumbel_topk(scores, K)                          the anchor
    exchanges   = build_exchanges(scores, S, modality, g)         V>V, A>A, V>A, A>V
    captions    = one generation over anchor + counterfactuals    compacted, original positions
    R           = 100 * CIDEr-D(captions, AV references)
    L           = L_RL + lambda_ex * L_ex
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import sys
import time
import zlib
from contextlib import nullcontext
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as torch_dist
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from avex import _checks, metrics
from avex.assets import resolve_asset_paths
from avex.captioner import FrozenCaptioner
from avex.checkpoint import (POLICY_FILE, check_weights, latest_checkpoint, load_checkpoint,
                             read_run_config, read_state, rng_state, save_checkpoint,
                             set_rng_state)
from avex.config import TrainConfig, build_parser, explicit_settings, resolve_config
from avex.data import FeatureCache
from avex.exchange_diagnostics import exchange_statistics, grad_norm
from avex.exchange_diagnostics import write_report as write_exchange_report
from avex.judge import judge_line, judge_record
from avex.kernels import build_exchanges, gumbel_topk
from avex.losses import (SATURATION_POINTS, anchored_policy_gradient_loss, exchange_terms,
                         group_normalized_loss, leave_one_out_loss, saturation_for,
                         set_level_loss)
from avex.methods import METHODS, label, load_policy, make_selector, policy_selector
from avex.modality import AUDIO, VISUAL
from avex.policy import AVEXPolicy
from avex.progress import progress_bar
from avex.reward import CiderD
from avex.scoring import caption_split, keep_all, score_captions
from avex.selection import AVLayout, balanced_attention_keep, indices_to_keep
from avex.tables import markdown_table


# ----------------------------------------------------------------------------------------------
# Processes and devices
# ----------------------------------------------------------------------------------------------

class Processes:
    """This process's place in a torchrun job (a single process outside torchrun)."""

    def __init__(self, device_kind: str):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if self.world > 1 and not torch_dist.is_initialized():
            torch_dist.init_process_group("nccl" if device_kind == "cuda" else "gloo")

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self):
        if self.world > 1:
            torch_dist.barrier()

    def close(self):
        if self.world > 1 and torch_dist.is_initialized():
            torch_dist.destroy_process_group()


def pick_device(cfg: TrainConfig, procs: Processes) -> torch.device:
    kind = cfg.device
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device={cfg.device!r} but CUDA is not available; pass "
                             "--device cpu")
        if procs.world > 1:
            return torch.device("cuda", procs.local_rank)
        index = torch.device(kind).index or 0
        if index >= torch.cuda.device_count():
            raise ValueError(f"device={cfg.device!r} but this machine has "
                             f"{torch.cuda.device_count()} CUDA device(s)")
        return torch.device("cuda", index)
    return torch.device("cpu")


# ----------------------------------------------------------------------------------------------
# Data, captioner, policy
# ----------------------------------------------------------------------------------------------

def prepare_assets(cfg: TrainConfig, procs: Processes):
    """Feature cache + frozen captioner paths; the embedded ones are built if missing (by rank 0
    while the others wait)."""
    settings = dict(benchmark_preset=cfg.benchmark_preset, captioner_preset=cfg.captioner_preset,
                    cache_dir=cfg.cache_dir)
    if procs.main:
        resolve_asset_paths(cfg.data, cfg.captioner, progress=cfg.progress, **settings)
    procs.barrier()
    return resolve_asset_paths(cfg.data, cfg.captioner, progress=False, **settings)


def load_assets(cfg: TrainConfig, data_path, captioner_path, device):
    cache = FeatureCache(data_path)
    captioner = FrozenCaptioner.load(captioner_path, device=device)
    torch.manual_seed(cfg.seed)  # the policy's random init is part of the run's identity
    policy = AVEXPolicy.from_llm(captioner.model, hidden_size=cfg.policy_hidden,
                                 positional=cfg.policy_positional).to(device)
    return cache, captioner, policy


# ----------------------------------------------------------------------------------------------
# Batches: a pure function of (seed, phase, step), so a resumed run reads what it would have
# ----------------------------------------------------------------------------------------------

def batch_indices(step: int, batch_size: int, n: int, seed: int, phase: str) -> list[int]:
    """Clip indices of global batch ``step``: consecutive slices of per-epoch permutations."""
    out = []
    position = step * batch_size
    while len(out) < batch_size:
        epoch, offset = divmod(position, n)
        gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{phase}:{epoch}".encode()))
        perm = torch.randperm(n, generator=gen).tolist()
        take = perm[offset:offset + batch_size - len(out)]
        out.extend(take)
        position += len(take)
    return out


def micro_batches(indices: list[int], micro: int, procs: Processes) -> list[list[int]]:
    """This rank's micro-batches of a global batch (rank r takes chunks r, r + W, ...)."""
    chunks = [indices[i:i + micro] for i in range(0, len(indices), micro)]
    return chunks[procs.rank::procs.world]


def sample_seed(seed: int, step: int, chunk: int) -> int:
    return zlib.crc32(f"gumbel:{seed}:{step}:{chunk}".encode())


# ----------------------------------------------------------------------------------------------
# Warmup: fit the policy to a balanced attention-based selection
# ----------------------------------------------------------------------------------------------

def warmup_targets(attention: dict, clips, retentions) -> list[torch.Tensor]:
    """Per clip, float [M]: the share of ``retentions`` at which each AV token is in the
    balanced attention keep-set (:func:`avex.selection.balanced_attention_keep`). One retention
    gives the 0/1 set; several give a graded target whose order serves every one of them.
    ``attention`` maps clip_id -> float [M] (``FrozenCaptioner.cached_text_to_av_attention``)."""
    return [torch.stack([balanced_attention_keep(attention[clip.clip_id], clip.n_visual,
                                                 clip.n_audio, r, av_modality=_av_order(clip)
                                                 ).float()
                         for r in retentions]).mean(0) for clip in clips]


def _av_order(clip):
    """The modality of each AV token in sequence order for a clip exported from a model (its AV
    tokens may interleave, as Qwen2.5-Omni's audio and video do); None: video then audio."""
    if clip.merged is None:
        return None
    codes = clip.merged["modality"]
    return codes[(codes == VISUAL) | (codes == AUDIO)]


def warmup_loss(policy, batch, layout: AVLayout, targets: list[torch.Tensor]) -> torch.Tensor:
    """Binary cross-entropy of the scores against the (graded) target, over AV tokens."""
    return target_loss(layout.gather(policy(batch.inputs_embeds, batch.modality)), layout,
                       targets)


def target_loss(scores: torch.Tensor, layout: AVLayout, targets: list[torch.Tensor]):
    """BCE of AV-axis scores [B, M] against the warmup targets (padding ignored)."""
    scores = scores.masked_fill(layout.modality < 0, 0.0)
    labels = torch.zeros_like(scores)
    for row, target in enumerate(targets):
        labels[row, :len(target)] = target.to(labels)
    present = layout.modality >= 0
    return F.binary_cross_entropy_with_logits(scores[present], labels[present])


def training_retentions(cfg: TrainConfig) -> list[float]:
    return list(cfg.train_retentions) or [cfg.retention]


def draw_retention(cfg: TrainConfig, seed: int) -> float:
    """The retention of one RL micro-batch, drawn from ``train_retentions`` by its seed."""
    choices = training_retentions(cfg)
    return choices[zlib.crc32(f"retention:{seed}".encode()) % len(choices)]


def group_size(cfg: TrainConfig, budget: torch.Tensor) -> int:
    """g: fixed, or ``g_fraction`` of the micro-batch's largest K (at least 2)."""
    if cfg.g_fraction <= 0:
        return cfg.g
    return max(2, round(cfg.g_fraction * int(budget.max())))


# ----------------------------------------------------------------------------------------------
# RL + AVEX step
# ----------------------------------------------------------------------------------------------

class ExchangeSlots(NamedTuple):
    """The exchanges of a micro-batch as E slots per sample: [B, E] tensors (``keep`` [B, E, M]),
    ``owner`` (the anchor each slot was built around) and ``types`` (each slot's type)."""
    delta_f: torch.Tensor
    valid: torch.Tensor
    group_size: torch.Tensor
    keep: torch.Tensor
    owner: list
    types: list


def anchor_exchanges(cfg: TrainConfig, scores, indices, modality, seed: int,
                     g: int) -> ExchangeSlots:
    """The exchanges of ``cfg.exchange_types`` around the anchors ``indices`` [B, A, K]:
    around the first anchor (``exchange_anchors="first"``), one per anchor with the types taken
    in turn (``"each"``), or every type around every anchor (``"all"``)."""
    rows, count = indices.shape[:2]
    types = tuple(cfg.exchange_types)
    around = [0] if cfg.exchange_anchors == "first" else list(range(count))
    n = len(around)
    flat_scores = scores.repeat_interleave(n, 0) if n > 1 else scores
    flat_indices = indices[:, around].reshape(rows * n, -1)
    flat_modality = modality.repeat_interleave(n, 0) if n > 1 else modality
    if cfg.exchange_selection == "random":
        built = random_exchanges(flat_scores, flat_indices, flat_modality, cfg, seed, g)
    else:
        built = build_exchanges(flat_scores, flat_indices, flat_modality, g=g, types=types)
    shape = (rows, n, len(types))
    delta_f, size = built.delta_f.view(shape), built.group_size.view(shape)
    keep = built.keep.view(*shape, -1)
    if cfg.exchange_anchors == "each":
        pick = torch.tensor([a % len(types) for a in range(n)], device=scores.device)
        slot = torch.arange(n, device=scores.device)
        delta_f, size, keep = delta_f[:, slot, pick], size[:, slot, pick], keep[:, slot, pick]
        owner, slot_types = list(range(n)), [types[a % len(types)] for a in range(n)]
    else:
        delta_f, size = delta_f.reshape(rows, -1), size.reshape(rows, -1)
        keep = keep.reshape(rows, n * len(types), -1)
        owner, slot_types = [a for a in around for _ in types], list(types) * n
    return ExchangeSlots(delta_f, size > 0, size, keep, owner, slot_types)


def rl_loss(cfg: TrainConfig, policy, captioner, cider, batch, clips, seed: int,
            retention: float | None = None, targets: list | None = None, *,
            saturation: float = SATURATION_POINTS, grad_ratios: bool = False) -> dict:
    """The losses of one micro-batch. ``cfg.anchors`` Gumbel-Top-K sets per clip; with
    ``cfg.exchanges``, the exchange sets around them (:func:`anchor_exchanges`); every keep-set
    is captioned in one generation. ``saturation``: w(dR)'s; ``grad_ratios``: measure each
    exchange type's gradient norm against L_RL's (``terms["diagnostics"]``).
    With ``cfg.lambda_target`` > 0, the warmup's BCE on ``targets`` keeps the scores anchored
    (their scale and the attention ranking) while the reward terms move them."""
    layout = AVLayout.of(batch.modality)
    scores = layout.gather(policy(batch.inputs_embeds, batch.modality))
    retention = cfg.retention if retention is None else retention
    budget = layout.budget(retention)
    rows, width, count = scores.shape[0], scores.shape[1], cfg.anchors
    indices, log_prob = gumbel_topk(scores.repeat_interleave(count, 0),
                                    budget.repeat_interleave(count), tau=cfg.tau, seed=seed)
    indices, log_prob = indices.view(rows, count, -1), log_prob.view(rows, count)
    sets = indices_to_keep(indices, width)                                    # [B, A, M]
    exchanges = None
    if cfg.exchanges:
        exchanges = anchor_exchanges(cfg, scores, indices, layout.modality, seed,
                                     group_size(cfg, budget))
        sets = torch.cat([sets, exchanges.keep], dim=1)
    captions = captioner.caption_keep_sets(batch.inputs_embeds, batch.modality, sets,
                                           num_beams=cfg.num_beams,
                                           max_new_tokens=cfg.max_new_tokens,
                                           position_ids=batch.native_position_ids)
    num_sets = sets.shape[1]
    flat = [c for row in captions for c in row]
    refs = [clip.refs_av for clip in clips for _ in range(num_sets)]
    rewards = torch.as_tensor(100.0 * cider.score(flat, refs), dtype=torch.float32,
                              device=scores.device).view(-1, num_sets)
    anchor_rewards, counterfactual = rewards[:, :count], rewards[:, count:]
    rl = None
    if cfg.rl_estimator == "rloo" and (cfg.rl or not cfg.exchanges):
        rl = leave_one_out_loss(log_prob, anchor_rewards, budget).mean()
    elif cfg.rl_estimator == "group" and (cfg.rl or not cfg.exchanges):
        rl = group_normalized_loss(log_prob, anchor_rewards, budget).mean()
    elif cfg.rl_estimator == "paper" and exchanges is not None:
        rl = anchored_policy_gradient_loss(log_prob, anchor_rewards, counterfactual,
                                           exchanges.valid, exchanges.owner,
                                           normalize=cfg.normalize_rl, set_size=budget).mean()
    elif cfg.rl_estimator == "paper":  # the set-level reward is the only signal: always on
        rl = set_level_loss(log_prob[:, 0], anchor_rewards[:, 0]).mean()
    # --no-rl drops L_RL beside the exchange term (logged all the same); alone it always counts
    in_loss = rl is not None and (cfg.rl or exchanges is None)
    terms = {"loss": rl if in_loss else torch.zeros((), device=scores.device)}
    if rl is not None:
        terms["rl"] = rl.detach()
    if exchanges is not None:
        delta_reward = anchor_rewards[:, exchanges.owner] - counterfactual
        parts = exchange_terms(exchanges.delta_f, delta_reward, exchanges.valid,
                               saturation=saturation)                          # [B, E]
        ex = parts.sum(dim=1).mean()
        weight = cfg.lambda_ex
        diagnostics = {"retention": float(retention), "k": int(budget.max()),
                       "types": exchange_statistics(delta_reward, exchanges.delta_f,
                                                    exchanges.valid, exchanges.group_size,
                                                    budget, exchanges.types)}
        if cfg.normalize_exchange or grad_ratios:
            params = [p for p in policy.parameters() if p.requires_grad]
            rl_norm = grad_norm(rl, params) if rl is not None else None
            ex_norm = grad_norm(ex, params)
            if cfg.normalize_exchange:
                weight = cfg.lambda_ex * float(rl_norm / ex_norm) if ex_norm > 0 else 0.0
            diagnostics["exchange_scale"] = weight
            ratios = {"total": None, "unscaled": None}   # undefined where L_RL has none
            if rl_norm is not None and rl_norm > 0:
                ratios = {"total": weight * float(ex_norm / rl_norm),
                          "unscaled": float(ex_norm / rl_norm)}
                if grad_ratios:
                    for name in dict.fromkeys(exchanges.types):
                        cols = [t == name for t in exchanges.types]
                        part = parts[:, torch.tensor(cols, device=parts.device)].sum(1).mean()
                        ratios[name] = weight * float(grad_norm(part, params) / rl_norm)
            diagnostics["grad_ratio"] = ratios
        terms["loss"] = terms["loss"] + weight * ex
        terms["exchange"] = ex.detach()
        terms["valid_exchanges"] = exchanges.valid.float().mean(0)
        terms["diagnostics"] = diagnostics
    if cfg.lambda_best > 0:  # self-imitation: the clip's best anchor, where it beat the rest
        best = anchor_rewards.argmax(dim=1)
        keep = sets[torch.arange(rows, device=sets.device), best].float()     # [B, M]
        ahead = anchor_rewards.max(dim=1).values > anchor_rewards.mean(dim=1)
        if bool(ahead.any()):
            imitation = target_loss(scores[ahead], AVLayout(layout.positions[ahead],
                                                            layout.modality[ahead]),
                                    [k for k, a in zip(keep, ahead.tolist()) if a])
            terms["loss"] = terms["loss"] + cfg.lambda_best * imitation
            terms["imitation"] = imitation.detach()
    if cfg.lambda_target > 0:
        if targets is None:
            raise ValueError("lambda_target > 0 needs the warmup targets of the batch")
        anchor = target_loss(scores, layout, targets)
        terms["loss"] = terms["loss"] + cfg.lambda_target * anchor
        terms["target"] = anchor.detach()
    terms["reward"] = anchor_rewards[:, 0].mean()
    terms["reward_spread"] = anchor_rewards.std(dim=1).mean() if count > 1 else \
        torch.zeros(())
    terms["retention"] = torch.tensor(float(retention))
    return terms


def random_exchanges(scores, anchor_idx, modality, cfg: TrainConfig, seed: int,
                     g: int | None = None):
    """The "random exchange" ablation: the same number and size of exchanges, but G and G' are
    drawn uniformly at random (from seeded noise) instead of by lowest / highest score; delta F
    is still sum s_G - sum s_G' of the policy's scores, so L_ex trains the same parameters.
    ``g``: the group size (default ``cfg.g``)."""
    # drawn on the scores' device (a CPU run draws exactly what it always did; a GPU run copies
    # nothing from the host)
    gen = torch.Generator(device=scores.device).manual_seed(
        zlib.crc32(f"random-exchange:{seed}".encode()))
    noise = torch.rand(scores.shape, generator=gen, dtype=torch.float32, device=scores.device)
    noise = noise.masked_fill(~torch.isfinite(scores.detach()), float("-inf"))
    drawn = build_exchanges(noise, anchor_idx, modality, g=cfg.g if g is None else g,
                            types=tuple(cfg.exchange_types))
    finite = scores.masked_fill(~torch.isfinite(scores), 0.0)

    def group_sum(index):
        values = finite.gather(1, index.clamp_min(0).flatten(1)).view(index.shape)
        return values.masked_fill(index < 0, 0.0).sum(-1)
    delta_f = (group_sum(drawn.removed) - group_sum(drawn.inserted)).to(drawn.delta_f.dtype)
    return drawn._replace(delta_f=torch.where(drawn.valid, delta_f, torch.zeros_like(delta_f)))


def cosine_with_warmup(total_steps: int, warmup_fraction: float):
    warm = max(1, round(total_steps * warmup_fraction)) if warmup_fraction > 0 else 0

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        progress = (step - warm) / max(1, total_steps - warm)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return factor


# ----------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------

class Run:
    def __init__(self, cfg: TrainConfig, resume: bool):
        self.cfg = cfg
        self.procs = Processes("cuda" if cfg.device.startswith("cuda") or (
            cfg.device == "auto" and torch.cuda.is_available()) else "cpu")
        if cfg.batch_size % (cfg.micro_batch_size * self.procs.world):
            raise ValueError(f"batch_size ({cfg.batch_size}) must be a multiple of "
                             f"micro_batch_size * processes ({cfg.micro_batch_size} * "
                             f"{self.procs.world})")
        if cfg.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        self.device = pick_device(cfg, self.procs)
        self.run_dir = Path(cfg.run_dir)
        self.cfg.run_dir = str(self.run_dir)
        self.checkpoint = latest_checkpoint(self.run_dir) if resume else None
        if resume and self.checkpoint is None:
            raise FileNotFoundError(f"--resume: no checkpoint under {self.run_dir}/checkpoints; "
                                    "start the run without --resume")
        if resume:
            check_owner(self.checkpoint, cfg)
        if not resume and latest_checkpoint(self.run_dir) is not None:
            raise FileExistsError(f"{self.run_dir} already holds a run; pass --resume to "
                                  "continue it or --run-dir for a new one")
        if self.procs.main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
        self.log_file = self.run_dir / "metrics.jsonl"

    # -- bookkeeping ------------------------------------------------------------------------
    def log(self, record: dict):
        if not self.procs.main:
            return
        record = {k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in record.items()}
        with open(self.log_file, "a") as f:
            f.write(json.dumps(record) + "\n")

    def save(self, policy, phase, step, optimizer, scheduler):
        if self.procs.main:
            state = {"phase": phase, "step": step, "optimizer": optimizer.state_dict(),
                     "scheduler": scheduler.state_dict() if scheduler else None,
                     "rng": rng_state(), "config": self.cfg.to_dict()}
            save_checkpoint(self.run_dir, self._global_step(phase, step), _unwrap(policy), state)
        self.procs.barrier()

    def steps_bar(self, desc: str, start: int, total: int):
        return progress_bar(range(start, total), desc=desc, unit="step", initial=start, total=total,
                    disable=not (self.cfg.progress and self.procs.main))

    def my_chunks(self, step: int, n: int, phase: str) -> list[list[int]]:
        """This rank's micro-batches of global batch ``step`` of ``phase``."""
        cfg = self.cfg
        return micro_batches(batch_indices(step, cfg.batch_size, n, cfg.seed, phase),
                             cfg.micro_batch_size, self.procs)

    def _global_step(self, phase, step):
        return step if phase == "warmup" else self.warmup_steps + step

    # -- phases -----------------------------------------------------------------------------
    def execute(self) -> dict:
        cfg = self.cfg
        data_path, captioner_path = prepare_assets(cfg, self.procs)
        cache, captioner, policy = load_assets(cfg, data_path, captioner_path, self.device)
        self.cache = cache
        if cfg.evaluate:  # a missing evaluation split fails now, not after training
            cache.split(cfg.eval_split)
        train = cache.split("train")
        clips_train = [train[i] for i in range(len(train))]
        n = len(clips_train)
        if n == 0:
            raise ValueError(f"{data_path}: the train split is empty")
        self.warmup_steps = 0 if cfg.warmup_from else \
            math.ceil(cfg.warmup_epochs * n / cfg.batch_size)
        self.rl_steps = 0 if cfg.warmup_only else math.ceil(cfg.epochs * n / cfg.batch_size)

        start_phase, start_step, saved = "warmup", 0, None
        if self.checkpoint is not None:
            saved = load_checkpoint(self.checkpoint, policy)
            start_phase, start_step = saved["phase"], saved["step"]
            if self.procs.main:
                print(f"resuming {self.run_dir} at {start_phase} step {start_step}")

        model = policy
        if self.procs.world > 1:
            model = torch.nn.parallel.DistributedDataParallel(
                policy, device_ids=[self.device.index] if self.device.type == "cuda" else None)

        if start_phase == "warmup":
            self.run_warmup(model, captioner, clips_train, start_step, saved)
            saved, start_step = None, 0
        warmup_policy_path = self.run_dir / "warmup_policy.safetensors"
        if start_phase != "done":
            self.run_rl(model, captioner, clips_train, cache, start_step, saved)
        results = {}
        if self.procs.main and cfg.evaluate:
            results = self.evaluate(policy, captioner, cache, warmup_policy_path)
        self.procs.barrier()
        self.procs.close()
        return results

    def run_warmup(self, model, captioner, clips, start_step, saved):
        cfg = self.cfg
        optimizer = torch.optim.AdamW(_unwrap(model).parameters(), lr=cfg.warmup_lr,
                                      weight_decay=cfg.weight_decay)
        # cosine decay: the late steps refine the ranking instead of jumping around it
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, cosine_with_warmup(max(1, self.warmup_steps), 0.0))
        if saved is not None:
            optimizer.load_state_dict(saved["optimizer"])
            if saved.get("scheduler") is not None:
                scheduler.load_state_dict(saved["scheduler"])
            set_rng_state(saved["rng"])
        if cfg.warmup_from:  # another run's warmup policy; no warmup steps here
            _unwrap(model).load_state_dict(load_file(str(warmup_file(cfg.warmup_from))))
        targets = self.targets(captioner, clips) if self.warmup_steps else []
        bar = self.steps_bar("warmup", start_step, self.warmup_steps)
        for step in bar:
            chunks = self.my_chunks(step, len(clips), "warmup")
            optimizer.zero_grad(set_to_none=True)
            total = 0.0  # summed on the device, read once a step (a sync per chunk otherwise)
            for i, chunk in enumerate(chunks):
                batch = captioner.embed([clips[j] for j in chunk])
                with _no_sync(model, last=i == len(chunks) - 1):
                    loss = warmup_loss(model, batch, AVLayout.of(batch.modality),
                                       [targets[j] for j in chunk])
                    (loss * len(chunk) * self.procs.world / cfg.batch_size).backward()
                total = total + loss.detach().double() * (
                    len(chunk) / (cfg.batch_size / self.procs.world))
            total = float(total)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            scheduler.step()
            bar.set_postfix(bce=f"{total:.3f}")
            self.log({"phase": "warmup", "step": step, "bce": total, "time": time.time()})
            if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < self.warmup_steps:
                self.save(model, "warmup", step + 1, optimizer, scheduler)
        if self.procs.main:
            weights = {k: v.detach().cpu().contiguous()
                       for k, v in _unwrap(model).state_dict().items()}
            tmp = self.run_dir / ".warmup_policy.tmp"
            save_file(weights, str(tmp))
            os.replace(tmp, self.run_dir / "warmup_policy.safetensors")
        # the RL phase starts from here on resume
        rl_optimizer, rl_scheduler = self.rl_optimizer(model)
        self.save(model, "rl", 0, rl_optimizer, rl_scheduler)

    def targets(self, captioner, clips) -> list[torch.Tensor]:
        """The warmup targets of the train clips (:func:`warmup_targets`)."""
        cfg = self.cfg
        # full-token attention is computed once per (captioner, cache) and kept in the cache dir
        if self.procs.main:
            captioner.cached_text_to_av_attention(self.cache, "train", cache_dir=cfg.cache_dir,
                                                  progress=cfg.progress)
        self.procs.barrier()
        attention = captioner.cached_text_to_av_attention(self.cache, "train",
                                                          cache_dir=cfg.cache_dir)
        return warmup_targets(attention, clips, training_retentions(cfg))

    def rl_optimizer(self, model):
        cfg = self.cfg
        optimizer = torch.optim.AdamW(_unwrap(model).parameters(), lr=cfg.lr,
                                      weight_decay=cfg.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, cosine_with_warmup(max(1, self.rl_steps), cfg.lr_warmup))
        return optimizer, scheduler

    def run_rl(self, model, captioner, clips, cache, start_step, saved):
        cfg = self.cfg
        optimizer, scheduler = self.rl_optimizer(model)
        if saved is not None:
            optimizer.load_state_dict(saved["optimizer"])
            scheduler.load_state_dict(saved["scheduler"])
            set_rng_state(saved["rng"])
        cider = CiderD(corpus_references=[c.refs_av for c in clips], tokenize=True)
        targets = self.targets(captioner, clips) if cfg.lambda_target > 0 else None
        saturation = self.exchange_saturation(captioner, cider, clips)
        bar = self.steps_bar("RL + AVEX", start_step, self.rl_steps)
        for step in bar:
            chunks = self.my_chunks(step, len(clips), "rl")
            optimizer.zero_grad(set_to_none=True)
            sums: dict[str, float] = {}
            diagnostics = []
            every = cfg.diagnostics_every
            for i, chunk in enumerate(chunks):
                batch_clips = [clips[j] for j in chunk]
                batch = captioner.embed(batch_clips)
                chunk_id = step * (cfg.batch_size // cfg.micro_batch_size) + \
                    self.procs.rank + i * self.procs.world
                seed = sample_seed(cfg.seed, step, chunk_id)
                with _no_sync(model, last=i == len(chunks) - 1):
                    terms = rl_loss(cfg, model, captioner, cider, batch, batch_clips, seed,
                                    draw_retention(cfg, seed),
                                    None if targets is None else [targets[j] for j in chunk],
                                    saturation=saturation,
                                    grad_ratios=every > 0 and step % every == 0)
                    (terms["loss"] * len(chunk) * self.procs.world / cfg.batch_size).backward()
                if "diagnostics" in terms:
                    diagnostics.append(terms.pop("diagnostics"))
                weight = len(chunk) / (cfg.batch_size / self.procs.world)
                for name, value in terms.items():
                    value = value.detach().float()
                    sums[name] = sums.get(name, 0.0) + value * weight
            sums = {name: value.cpu() for name, value in sums.items()}  # one copy a step
            total_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            scheduler.step()
            record = {"phase": "rl", "step": step, "lr": scheduler.get_last_lr()[0],
                      "grad_norm": float(total_norm), "time": time.time(),
                      **{k: v for k, v in sums.items()}}
            if diagnostics:  # this rank's micro-batches
                record["exchange_diagnostics"] = diagnostics
            self.log(record)
            bar.set_postfix(reward=f"{float(sums['reward']):.1f}",
                            loss=f"{float(sums['loss']):.3f}")
            if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < self.rl_steps:
                self.save(model, "rl", step + 1, optimizer, scheduler)
        self.save(model, "done", self.rl_steps, optimizer, scheduler)
        if cfg.exchanges and self.procs.main:
            write_exchange_report(self.run_dir)

    def exchange_saturation(self, captioner, cider, clips) -> float:
        """w(dR)'s saturation: ``cfg.exchange_saturation``, or the paper's scaled by the mean
        full-token reward of the first 256 train clips (measured once, kept in the run's
        ``exchange_calibration.json``)."""
        cfg = self.cfg
        if not cfg.exchanges or cfg.exchange_saturation is not None:
            return cfg.exchange_saturation or SATURATION_POINTS
        path = self.run_dir / "exchange_calibration.json"
        if path.is_file():
            return float(json.loads(path.read_text())["saturation"])
        sample = clips[:256]
        captions = caption_split(captioner, sample, keep_all, 1.0, num_beams=cfg.num_beams,
                                 max_new_tokens=cfg.max_new_tokens)
        reward = float(100.0 * cider.score(captions, [c.refs_av for c in sample]).mean())
        record = {"full_token_reward": reward, "clips": len(sample),
                  "saturation": saturation_for(reward)}
        if self.procs.main:
            path.write_text(json.dumps(record, indent=1) + "\n")
        return record["saturation"]

    def train_cacovid(self) -> Path:
        """CaCoVID-AV for the final table: the registry's settings, this run's seed and warmup
        policy (so only the training signal differs), in ``<run_dir>/cacovid``."""
        run_dir = self.run_dir / "cacovid"
        cfg = dataclasses.replace(self.cfg, run_dir=str(run_dir), warmup_from=str(self.run_dir),
                                  evaluate=False, eval_methods=[], **METHODS["cacovid"].train)
        with torch.enable_grad():  # called from evaluate(), which runs without gradients
            return ensure_trained(cfg)

    @torch.no_grad()
    def evaluate(self, policy, captioner, cache, warmup_policy_path) -> dict:
        cfg = self.cfg
        split = cache.split(cfg.eval_split)
        count = len(split) if cfg.max_eval_clips is None else min(len(split), cfg.max_eval_clips)
        clips = [split[i] for i in range(count)]
        policy.eval()
        warmup_policy = None
        if warmup_policy_path.exists() and not cfg.warmup_only:
            warmup_policy = copy.deepcopy(policy)
            warmup_policy.load_state_dict(load_file(str(warmup_policy_path)))
        methods = []
        for name in cfg.eval_methods:
            if name == "cacovid":
                if cfg.warmup_only:
                    continue
                selector = policy_selector(load_policy(self.train_cacovid(), captioner))
            else:
                selector = make_selector(name, captioner=captioner, seed=cfg.seed)
            methods.append((label(name), selector))
        if warmup_policy is not None:
            methods.append(("warmup only", policy_selector(warmup_policy)))
        methods.append((run_label(cfg), policy_selector(policy)))
        decode = dict(num_beams=cfg.num_beams, max_new_tokens=cfg.max_new_tokens,
                      progress=cfg.progress)
        rows = [{"method": label("full"), "retention": 1.0,
                 **score_captions(caption_split(captioner, clips, keep_all, 1.0, **decode,
                                                desc="full tokens"), clips)}]
        for retention in cfg.eval_retentions:
            for name, selector in methods:
                captions = caption_split(captioner, clips, selector, retention, **decode,
                                         desc=f"{name} @ {retention:.0%}")
                rows.append({"method": name, "retention": retention,
                             **score_captions(captions, clips)})
        table = results_table(rows, f"{cfg.eval_split} split, {len(clips)} clips")
        judge = judge_record(cache.root, captioner.path) if captioner.path is not None else None
        if judge is not None:
            table += "\n\n" + judge_line(judge)
        (self.run_dir / "results.json").write_text(json.dumps({"rows": rows, "judge": judge},
                                                              indent=2))
        (self.run_dir / "results.md").write_text(table + "\n")
        print(table)
        return {"rows": rows, "table": table}


def warmup_file(run_dir) -> Path:
    """The warmup policy of a finished run directory (``--warmup-from``)."""
    path = Path(run_dir) / "warmup_policy.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"warmup_from: no warmup policy at {str(path)!r}")
    return path


def run_label(cfg: TrainConfig) -> str:
    if cfg.warmup_only:
        return "warmup only (this run)"
    if not cfg.exchanges:
        if cfg.rl_estimator == "rloo":
            return "AVEX, L_RL (RLOO) (this run)"
        return "set-level reward, no exchanges (this run)"
    if cfg.exchange_selection == "random":
        return "random exchanges (this run)"
    terms = []
    if cfg.rl:
        terms.append("L_RL (RLOO)" if cfg.rl_estimator == "rloo" else "L_RL")
    if cfg.lambda_ex > 0:
        terms.append("L_ex")
    return f"AVEX, {' + '.join(terms) or 'no loss'} (this run)"


def results_table(rows: list[dict], caption: str) -> str:
    table = markdown_table(
        ["method", "retention", "C_av", "C_v", "C_a", "BLEU-4", "METEOR"],
        [[r["method"], f"{r['retention']:.0%}"] + [f"{r[k]:.1f}" for k in
                                                   ("C_av", "C_v", "C_a", "BLEU-4", "METEOR")]
         for r in rows])
    return f"Results on the {caption} (CIDEr points; {metrics.cider_source()}):\n\n{table}"


def _unwrap(model):
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def _no_sync(model, last: bool):
    """Skip DDP's gradient all-reduce on all but the last micro-batch of an accumulation."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel) and not last:
        return model.no_sync()
    return nullcontext()


RUNS_ROOT = Path("runs")


def choose_run_dir(cfg: TrainConfig, resume: bool) -> str:
    if cfg.run_dir is not None:
        return cfg.run_dir
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("under torchrun, pass --run-dir (every rank must write to the same one)")
    if resume:
        runs = sorted(p for p in RUNS_ROOT.glob("*") if (p / "checkpoints").is_dir())
        if not runs:
            raise FileNotFoundError(f"--resume: no run under {RUNS_ROOT}/; pass --run-dir")
        return str(runs[-1])
    return str(RUNS_ROOT / time.strftime("%Y%m%d-%H%M%S"))


# Settings a resumed run may take from the command line: where it lives and how it reports.
# Every other setting is the run's own; a flag that contradicts it is refused.
RESUME_OVERRIDES = ("run_dir", "cache_dir", "device", "progress")


def resumed_config(cfg: TrainConfig, explicit: dict | None = None) -> TrainConfig:
    """The settings a resumed run continues with: its own ``config.json``, in the directory it
    was given (a copied or moved run writes where it now is, never where it was made).
    ``explicit`` (settings asked for on the command line) must agree with them."""
    run_dir = Path(cfg.run_dir)
    if not (run_dir / "config.json").exists():
        return cfg
    saved = read_run_config(run_dir)
    unknown = set(saved) - {f.name for f in dataclasses.fields(TrainConfig)}
    if unknown:
        raise ValueError(f"{run_dir / 'config.json'}: unknown settings {sorted(unknown)} (a "
                         "run of another version, or a corrupt file)")
    overrides = {name: getattr(cfg, name) for name in RESUME_OVERRIDES
                 if name == "run_dir" or name in (explicit or {})}
    conflicts = {name: (value, saved[name]) for name, value in (explicit or {}).items()
                 if name not in RESUME_OVERRIDES and name in saved and value != saved[name]}
    if conflicts:
        listed = ", ".join(f"{name}={asked!r} (the run has {had!r})"
                           for name, (asked, had) in sorted(conflicts.items()))
        raise ValueError(f"--resume continues {run_dir} with its own settings, but the command "
                         f"line asks for {listed}; drop those flags, or start a new run")
    return TrainConfig(**{**saved, **overrides}).validate()


def check_owner(checkpoint: Path, cfg: TrainConfig) -> None:
    """Refuse a checkpoint written by a run with other settings (checkpoints copied in from
    elsewhere): resuming it would mix two runs."""
    check_weights(checkpoint / POLICY_FILE)
    saved = read_state(checkpoint)["config"]
    differ = sorted(name for name, value in cfg.to_dict().items()
                    if name not in RESUME_OVERRIDES and name in saved and saved[name] != value)
    if differ:
        raise ValueError(f"{checkpoint} belongs to a run with other settings than "
                         f"{Path(cfg.run_dir) / 'config.json'} (they differ in {differ}); "
                         "resume the run it came from, or start a new one")


def prepare_run(cfg: TrainConfig, *, resume: bool = False, explicit: dict | None = None) -> "Run":
    """Every check of a training run (settings, run directory, checkpoint), before any model
    is loaded; the only files written are the run directory and its config.json."""
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"cfg must be a TrainConfig, got {type(cfg).__name__}")
    _checks.flag("resume", resume)
    cfg = dataclasses.replace(cfg).validate()
    cfg.run_dir = choose_run_dir(cfg, resume)
    if resume:
        cfg = resumed_config(cfg, explicit)
    if cfg.data != "embedded":  # a user's cache: manifest, shard headers and splits, read now
        cache = FeatureCache(cfg.data)
        cache.split("train")
        if cfg.evaluate:
            cache.split(cfg.eval_split)
    return Run(cfg, resume=resume)


def train(cfg: TrainConfig, *, resume: bool = False) -> dict:
    """Train a policy with ``cfg`` (warmup, then RL + exchanges) and, unless
    ``cfg.evaluate`` is off, score it. ``resume=True`` continues the run in ``cfg.run_dir``
    (or the newest under ``runs/``) from its latest checkpoint, with its saved settings.

    Returns ``{"run_dir": str, "rows": [...], "table": str}`` (no rows without evaluation).
    """
    run = prepare_run(cfg, resume=resume)
    return {"run_dir": run.cfg.run_dir, **run.execute()}


def ensure_trained(cfg: TrainConfig) -> Path:
    """Train ``cfg`` unless ``cfg.run_dir`` already holds a finished run (then it is reused; an
    unfinished one is resumed)."""
    run_dir = Path(cfg.run_dir)
    latest = latest_checkpoint(run_dir) if run_dir.exists() else None
    if latest is not None:
        state = read_state(latest)
        if state.get("phase") != "done":
            train(cfg, resume=True)
    else:
        train(cfg)
    return run_dir


def main(argv=None) -> dict:
    parser = build_parser("python -m avex.train", __doc__.split("\n\n")[0])
    args = parser.parse_args(argv)
    try:  # every setting is checked before any work starts; a bad one is a usage error
        run = prepare_run(resolve_config(args), resume=args.resume,
                          explicit=explicit_settings(args) if args.resume else None)
    except (ValueError, TypeError, OSError) as err:
        parser.error(str(err))
    return {"run_dir": run.cfg.run_dir, **run.execute()}


if __name__ == "__main__":
    main(sys.argv[1:])
