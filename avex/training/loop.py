"""``python -m avex.train``: warm up the AVEX policy, then train it with RL + exchange preferences.

With no arguments it runs the whole pipeline on the embedded benchmark: build the data and the
frozen captioner if missing, warm up on cached text-to-AV attention, train, evaluate at 40% and
20% retention on the test split against full tokens, random selection and the warmup-only
policy, and print the table. ``--config run.yaml`` and flags override any setting; ``--resume``
continues a killed run from its latest checkpoint. Under ``torchrun`` it trains with
DistributedDataParallel: each rank captions and scores its share of every batch.

This module runs the phases (warmup, RL, the final table); the run's records (settings,
metrics, checkpoints, the policy) are :mod:`avex.training.run_records`', one micro-batch's
losses :mod:`avex.training.steps`'. ``python -m avex.train`` (:mod:`avex.train`) runs
:func:`main`.
"""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from avex import _checks
from avex.cache_and_captioner import (asset_names, check_captioner_benchmark,
                                     embedded_captioner_path, load_cache_and_captioner,
                                     resolve_asset_paths)
from avex.data import FeatureCache
from avex.fidelity import full_captions
from avex.policy import AVEXPolicy, TrainedOn, layout_of, row_layouts
from avex.progress import progress_bar, show
from avex.registry import METHODS
from avex.reward import CiderD
from avex.run_files import (CACOVID_DIR, CONFIG_FILE, EXCHANGE_CALIBRATION_FILE,
                            SAVED_POLICY_DIR, latest_checkpoint, read_run_config, read_state,
                            warmup_policy_file)
from avex.selection import AVLayout
from avex.stop_signals import StopSignals
from avex.training.averaging import ADVANTAGE_SCALE_DECAY, RunningScale, WeightAverage
from avex.training.checkpoint import load_checkpoint, set_rng_state
from avex.training.config import (DEFAULT_EVAL_METHODS, POLICY_LAYERS, TrainConfig,
                                  build_parser, explicit_settings, resolve_config)
from avex.training.distributed import Processes, no_sync, pick_device, unwrap
from avex.training.exchange_diagnostics import write_report as write_exchange_report
from avex.training.results_table import score_run
from avex.training.run_records import (RunRecords, check_recorded_captioner, check_reusable,
                                      choose_run_dir, resumed_config, truncate_metrics)
from avex.training.steps import (batch_indices, cosine_with_warmup, draw_retention,
                                 exchange_saturation, micro_batches, rl_loss, sample_seed,
                                 training_retentions, warmup_loss, warmup_targets)
from avex.training.stopping import ZERO_REWARD_STEPS, TrainingInterrupted, zero_reward_error
from avex.training.warmup_teachers import teacher_scores


# ----------------------------------------------------------------------------------------------
# Data, captioner, policy
# ----------------------------------------------------------------------------------------------

def rl_state(average: WeightAverage | None, scale: RunningScale | None) -> dict:
    """The RL checkpoint's extra state: the weight average and the running advantage scale,
    where the run keeps them."""
    return {**({} if average is None else {"ema": average.state_dict()}),
            **({} if scale is None else {"advantage_scale": scale.value})}


def resolve_run_inputs(cfg: TrainConfig, procs: Processes):
    """Feature cache + frozen captioner paths; the embedded ones are built if missing (by rank 0
    while the others wait)."""
    settings = dict(benchmark_preset=cfg.benchmark_preset, captioner_preset=cfg.captioner_preset,
                    cache_dir=cfg.cache_dir)
    if procs.main:
        resolve_asset_paths(cfg.data, cfg.captioner, progress=cfg.progress, **settings)
    procs.barrier()
    return resolve_asset_paths(cfg.data, cfg.captioner, progress=False, **settings)


def load_run_inputs(cfg: TrainConfig, data_path, captioner_path, device):
    cache, captioner = load_cache_and_captioner(data_path, captioner_path, device=device,
                                                progress=cfg.progress)
    torch.manual_seed(cfg.seed)  # the policy's random init is part of the run's identity
    policy = AVEXPolicy.from_llm(captioner.model, hidden_size=cfg.policy_hidden,
                                 num_layers=POLICY_LAYERS, init_layers=cfg.policy_init_layers,
                                 positional=cfg.policy_positional, selection=cfg.selection,
                                 redundancy=cfg.redundancy,
                                 retention_input=cfg.retention_input,
                                 merge_threshold=cfg.merge_threshold).to(device)
    return cache, captioner, policy


def load_warmup(policy, weights: dict) -> None:
    """Another run's warmup weights (``--warmup-from``) into ``policy``. The retention input
    is not trained in a warmup, so its projection is zero there: a warmup without it serves a
    policy with it (at zero), and one with it serves a policy without it."""
    if policy.config.retention_input and "retention_in" not in weights:
        weights = {**weights, "retention_in": torch.zeros_like(policy.retention_in)}
    elif not policy.config.retention_input and "retention_in" in weights:
        if bool(weights["retention_in"].any()):
            raise ValueError("warmup_from: its warmup policy reads the retention (non-zero "
                             "retention_in); train this run with --retention-input too")
        weights = {k: v for k, v in weights.items() if k != "retention_in"}
    policy.load_state_dict(weights)


def training_layout(clips) -> str:
    """The layout (:data:`avex.policy.LAYOUTS`) of the training clips as the captioner lays
    them out: a clip exported from a model as its codes say, a plain clip as prefix text,
    video, audio, suffix text."""
    names = []
    for clip in clips:
        if clip.merged is not None:
            names += row_layouts(clip.merged["modality"][None])
        elif clip.n_visual and clip.n_audio:
            names.append("visual-then-audio")
        elif clip.n_visual or clip.n_audio:
            names.append("visual" if clip.n_visual else "audio")
    return layout_of(names)


# ----------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------

class Run:
    """One training run: its processes and device, its books (:class:`RunRecords`) and its
    phases: warmup, RL, then the comparison policies and the final table."""

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
        self.cfg.run_dir = str(Path(cfg.run_dir))
        self.books = RunRecords(cfg, self.procs, self.device, resume)
        self.run_dir = self.books.run_dir

    def record_policy(self, policy, captioner, clips) -> None:
        """What the policy is trained on (avex.policy.TrainedOn), on the policy and in
        ``<run>/policy.json``: ``avex.load_policy`` reads it to rebuild and check the policy."""
        policy.trained_on = TrainedOn.of_model(captioner.model, training_layout(clips),
                                               training_retentions(self.cfg))
        self.books.record_policy(policy)

    def steps_bar(self, desc: str, start: int, total: int):
        # a phase of no steps (the warmup of a --warmup-from run) draws no bar
        return progress_bar(range(start, total), desc=desc, unit="step", initial=start, total=total,
                            disable=not (self.cfg.progress and self.procs.main and total > 0))

    def my_chunks(self, step: int, n: int, phase: str) -> list[list[int]]:
        """This rank's micro-batches of global batch ``step`` of ``phase``."""
        cfg = self.cfg
        return micro_batches(batch_indices(step, cfg.batch_size, n, cfg.seed, phase),
                             cfg.micro_batch_size, self.procs)

    # -- phases -----------------------------------------------------------------------------
    def execute(self) -> dict:
        cfg = self.cfg
        data_path, captioner_path = resolve_run_inputs(cfg, self.procs)
        self.books.record_captioner(captioner_path)
        cache, captioner, policy = load_run_inputs(cfg, data_path, captioner_path, self.device)
        self.cache = cache
        if cfg.evaluate:  # a missing evaluation split fails now, not after training
            cache.split(cfg.eval_split)
        train = cache.split("train")
        verified = cache.verify_shards(train.indices + (cache.split(cfg.eval_split).indices
                                                        if cfg.evaluate else []))
        if self.procs.main:
            print(f"training data: {verified}")
        clips_train = [train[i] for i in range(len(train))]
        n = len(clips_train)
        if n == 0:
            raise ValueError(f"{data_path}: the train split is empty")
        self.record_policy(policy, captioner, clips_train)
        self.warmup_steps = self.books.warmup_steps = 0 if cfg.warmup_from else \
            math.ceil(cfg.warmup_epochs * n / cfg.batch_size)
        self.rl_steps = 0 if cfg.warmup_only else math.ceil(cfg.epochs * n / cfg.batch_size)

        start_phase, start_step, saved = "warmup", 0, None
        if self.books.checkpoint is not None:
            saved = load_checkpoint(self.books.checkpoint, policy)
            start_phase, start_step = saved["phase"], saved["step"]
            if self.procs.main:
                dropped = truncate_metrics(self.books.log_file, start_phase, start_step)
                print(f"resuming {self.run_dir} at {start_phase} step {start_step}"
                      + (f" ({dropped} metrics records after it dropped: they are redone)"
                         if dropped else ""))

        model = policy
        if self.procs.world > 1:
            # the retention input is unused in the warmup (avex.policy.network)
            model = torch.nn.parallel.DistributedDataParallel(
                policy, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                find_unused_parameters=cfg.retention_input)

        with StopSignals() as self.books.stop:
            if start_phase == "warmup":
                self.run_warmup(model, captioner, clips_train, start_step, saved)
                saved, start_step = None, 0
            if start_phase != "done":
                self.run_rl(model, captioner, clips_train, start_step, saved)
        results = {}
        if cfg.evaluate:
            results = self.score_table(policy, captioner, cache)
        self.procs.barrier()
        self.procs.close()
        return results

    def score_table(self, policy, captioner, cache) -> dict:
        """Train the table's comparison methods, then score the table (the main process). A
        stop in either names this run's resume command, which redoes what is missing: a
        comparison's own run would resume without the table."""
        resume = self.books.resume_command()
        try:
            comparisons = self.train_comparisons()
        except TrainingInterrupted as stop:
            raise TrainingInterrupted(stop.checkpoint, resume,
                                      "training a comparison method of the table stopped at "
                                      "a step boundary") from None
        if not self.procs.main:
            return {}
        try:
            return score_run(self.cfg, self.run_dir, policy, captioner, cache, comparisons)
        except KeyboardInterrupt:
            raise TrainingInterrupted(latest_checkpoint(self.run_dir), resume,
                                      "stopped while scoring the table; the trained policy is "
                                      "saved") from None

    def train_comparisons(self) -> dict:
        """The trained methods of the final table, each trained from this run's seed and warmup
        policy (so only the training signal differs), before the table: CaCoVID-AV in
        ``<run_dir>/cacovid``. Method name -> run directory."""
        cfg = self.cfg
        if cfg.warmup_only or "cacovid" not in cfg.eval_methods:
            return {}
        return {"cacovid": train_variant(cfg, self.run_dir / CACOVID_DIR,
                                         warmup_from=self.run_dir, evaluate=False,
                                         eval_methods=[], **METHODS["cacovid"].train)}

    def run_warmup(self, model, captioner, clips, start_step, saved):
        cfg = self.cfg
        optimizer = torch.optim.AdamW(unwrap(model).parameters(), lr=cfg.warmup_lr,
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
            load_warmup(unwrap(model), load_file(str(warmup_policy_file(cfg.warmup_from))))
        targets = self.targets(captioner, clips) if self.warmup_steps else []
        bar = self.steps_bar("warmup", start_step, self.warmup_steps)
        for step in bar:
            chunks = self.my_chunks(step, len(clips), "warmup")
            optimizer.zero_grad(set_to_none=True)
            total = 0.0  # summed on the device, read once a step (a sync per chunk otherwise)
            for i, chunk in enumerate(chunks):
                batch = captioner.embed([clips[j] for j in chunk])
                with no_sync(model, last=i == len(chunks) - 1):
                    loss = warmup_loss(model, batch, AVLayout.of(batch.modality),
                                       [targets[j] for j in chunk])
                    (loss * len(chunk) * self.procs.world / cfg.batch_size).backward()
                total = total + loss.detach().double() * (
                    len(chunk) / (cfg.batch_size / self.procs.world))
            total = float(total)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            scheduler.step()
            show(bar, bce=f"{total:.3f}")
            self.books.log({"phase": "warmup", "step": step, "bce": total, "time": time.time()})
            if self.books.stop_requested():
                self.books.interrupt(model, "warmup", step + 1, optimizer, scheduler)
            if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < self.warmup_steps:
                self.books.save(model, "warmup", step + 1, optimizer, scheduler)
        self.books.save_warmup_policy(model)
        # the RL phase starts from here on resume
        rl_optimizer, rl_scheduler = self.rl_optimizer(model)
        self.books.save(model, "rl", 0, rl_optimizer, rl_scheduler)

    def targets(self, captioner, clips) -> list[torch.Tensor]:
        """The warmup targets of the train clips (:func:`warmup_targets`) from the scores of
        ``warmup_teacher`` (:func:`avex.training.warmup_teachers.teacher_scores`)."""
        cfg = self.cfg
        # each teacher's scores are computed once per (captioner, cache[, decoding]) and kept in
        # the cache dir
        settings = dict(num_beams=cfg.num_beams, max_new_tokens=cfg.max_new_tokens,
                        cache_dir=cfg.cache_dir)
        if self.procs.main:
            teacher_scores(cfg.warmup_teacher, captioner, self.cache, "train",
                           progress=cfg.progress, **settings)
        self.procs.barrier()
        scores = teacher_scores(cfg.warmup_teacher, captioner, self.cache, "train", **settings)
        return warmup_targets(scores, clips, training_retentions(cfg))

    def full_captions(self, captioner, split: str):
        """y_full of ``split`` under the run's decoding (:func:`avex.fidelity.full_captions`):
        generated once per captioner, benchmark and decoding, and kept in the cache dir."""
        cfg = self.cfg
        settings = dict(num_beams=cfg.num_beams, max_new_tokens=cfg.max_new_tokens,
                        cache_dir=cfg.cache_dir)
        if self.procs.main:
            full_captions(captioner, self.cache, split, progress=cfg.progress, **settings)
        self.procs.barrier()
        return full_captions(captioner, self.cache, split, **settings)

    def rl_optimizer(self, model):
        cfg = self.cfg
        policy = unwrap(model)
        params = policy.parameters()
        if cfg.retention_input:   # the projection learns at its own lr (TrainConfig)
            params = [{"params": [p for n, p in policy.named_parameters() if n != "retention_in"]},
                      {"params": [policy.retention_in], "lr": cfg.retention_lr}]
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, cosine_with_warmup(max(1, self.rl_steps), cfg.lr_warmup))
        return optimizer, scheduler

    def run_rl(self, model, captioner, clips, start_step, saved):
        cfg = self.cfg
        optimizer, scheduler = self.rl_optimizer(model)
        if saved is not None:
            optimizer.load_state_dict(saved["optimizer"])
            scheduler.load_state_dict(saved["scheduler"])
            set_rng_state(saved["rng"])
        average = None
        if cfg.ema > 0:   # from the weights RL starts from, or the checkpoint's average
            average = WeightAverage(unwrap(model), cfg.ema)
            if saved is not None and saved.get("ema") is not None:
                average.load_state_dict(saved["ema"])
        # --advantage-scale running: this rank's moving average of RLOO's advantage deviation
        scale = RunningScale(ADVANTAGE_SCALE_DECAY) if cfg.advantage_scale == "running" else None
        if scale is not None and saved is not None:
            scale.value = saved.get("advantage_scale")
        # CIDEr needs every clip's references; a label-free cache trains on fidelity alone
        cider = CiderD(corpus_references=[c.refs_av for c in clips], tokenize=True) \
            if all(c.refs_av for c in clips) else None
        full = self.full_captions(captioner, "train") if cfg.reward != "cider" else None
        targets = self.targets(captioner, clips) if cfg.lambda_target > 0 else None
        saturation = exchange_saturation(cfg, self.run_dir / EXCHANGE_CALIBRATION_FILE, captioner,
                                         cider, clips, write=self.procs.main,
                                         policy=unwrap(model), full=full)
        bar = self.steps_bar("RL + AVEX", start_step, self.rl_steps)
        rewarded = False   # any reward above 0 yet (checked over the first steps of a run)
        for step in bar:
            chunks = self.my_chunks(step, len(clips), "rl")
            optimizer.zero_grad(set_to_none=True)
            sums: dict[str, float] = {}
            diagnostics, reward_diagnostics = [], []
            every = cfg.diagnostics_every
            for i, chunk in enumerate(chunks):
                batch_clips = [clips[j] for j in chunk]
                batch = captioner.embed(batch_clips)
                chunk_id = step * (cfg.batch_size // cfg.micro_batch_size) + \
                    self.procs.rank + i * self.procs.world
                seed = sample_seed(cfg.seed, step, chunk_id)
                diagnose = every > 0 and step % every == 0
                with no_sync(model, last=i == len(chunks) - 1):
                    terms = rl_loss(cfg, model, captioner, cider, batch, batch_clips, seed,
                                    draw_retention(cfg, seed),
                                    None if targets is None else [targets[j] for j in chunk],
                                    saturation=saturation, grad_ratios=diagnose,
                                    full_tokens=None if full is None else
                                    full.targets(batch_clips), diagnose=diagnose,
                                    advantage_scale=None if scale is None else scale.value)
                    (terms["loss"] * len(chunk) * self.procs.world / cfg.batch_size).backward()
                if scale is not None:   # the same value on every rank
                    scale.update(self.books.mean_over_ranks(float(terms["advantage_std"])))
                if "diagnostics" in terms:
                    diagnostics.append(terms.pop("diagnostics"))
                reward_diagnostics.append(terms.pop("reward_diagnostics"))
                weight = len(chunk) / (cfg.batch_size / self.procs.world)
                for name, value in terms.items():
                    value = value.detach().float()
                    sums[name] = sums.get(name, 0.0) + value * weight
            sums = {name: value.cpu() for name, value in sums.items()}  # one copy a step
            total_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            lr = scheduler.get_last_lr()[0]   # the rate this step trained at, before step()
            optimizer.step()
            scheduler.step()
            if average is not None:
                average.update(unwrap(model))
            record = {"phase": "rl", "step": step, "lr": lr,
                      "grad_norm": float(total_norm), "time": time.time(),
                      **{k: v for k, v in sums.items()}}
            record["reward_diagnostics"] = reward_diagnostics   # this rank's micro-batches
            if diagnostics:
                record["exchange_diagnostics"] = diagnostics
            self.books.log(record)
            show(bar, reward=f"{float(sums['reward']):.1f}", loss=f"{float(sums['loss']):.3f}")
            if start_step == 0 and step < ZERO_REWARD_STEPS and cfg.reward != "fidelity":
                # the mean anchor reward and its spread over anchors: both 0 only if every
                # anchor's CIDEr-D was 0 (it is never negative); with cider+fidelity, CIDEr's
                # mean over the anchors (the tie-break is not a sign of captions scoring)
                if "cider_reward" in sums:
                    rewarded = self.books.any_rank(float(sums["cider_reward"]) > 0) or rewarded
                else:
                    rewarded = self.books.any_rank(
                        float(sums["reward"]) > 0
                        or float(sums.get("reward_spread", 0.0)) > 0) or rewarded
                if not rewarded and step + 1 == min(ZERO_REWARD_STEPS, self.rl_steps):
                    raise zero_reward_error(step + 1, min(len(clips), cfg.batch_size
                                                          * (step + 1)), captioner)
            if self.books.stop_requested() and step + 1 < self.rl_steps:
                self.books.interrupt(model, "rl", step + 1, optimizer, scheduler,
                                     rl_state(average, scale))
            if (step + 1) % cfg.checkpoint_every == 0 and step + 1 < self.rl_steps:
                self.books.save(model, "rl", step + 1, optimizer, scheduler,
                                rl_state(average, scale))
        if average is not None:   # the run's policy is the average (checkpoint, artifact)
            average.copy_to(unwrap(model))
        self.books.save(model, "done", self.rl_steps, optimizer, scheduler)
        if self.procs.main:
            write_exchange_report(self.run_dir)   # the reward's ties, the exchange labels
            # the artifact: AVEXPolicy.from_pretrained / avex.load_policy
            unwrap(model).save_pretrained(self.run_dir / SAVED_POLICY_DIR)
        if self.books.stop_requested():   # asked during the last step: done, but no evaluation
            raise TrainingInterrupted(latest_checkpoint(self.run_dir), self.books.resume_command())


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
    check_warmup_source(cfg)
    built = built_captioner_path(cfg)
    if built is not None:   # one built in the run is checked there (RunRecords)
        check_recorded_captioner(cfg, built, resume=resume)
    if cfg.data != "embedded":  # a user's cache: manifest, shard headers and splits, read now
        cache = FeatureCache(cfg.data)
        if cfg.captioner != "embedded":
            check_captioner_benchmark(cache.meta.source, cfg.captioner, cache.root)
        check_references(cfg, cache)
        if cfg.evaluate:
            cache.split(cfg.eval_split)
            cfg.eval_methods = comparisons_the_data_can_train(cfg, cache)
    return Run(cfg, resume=resume)


def built_captioner_path(cfg: TrainConfig) -> Path | None:
    """The captioner directory ``cfg`` names where it is there already (an embedded one is
    built by the run when missing: None)."""
    if cfg.captioner != "embedded":
        return Path(cfg.captioner)
    if cfg.data != "embedded":
        return None   # refused when the run resolves its inputs
    path = embedded_captioner_path(cfg.benchmark_preset, cfg.captioner_preset, cfg.cache_dir)
    return path if path.is_dir() else None


def check_warmup_source(cfg: TrainConfig) -> None:
    """``warmup_from``'s run must have been trained with this run's captioner (the same folder
    name; :func:`avex.cache_and_captioner.asset_names`): its warmup policy scored that
    captioner's embeddings of the clips, so another's would start RL from scores of inputs it
    never saw. Another cache with the same captioner is a choice, and passes."""
    if not cfg.warmup_from or not (Path(cfg.warmup_from) / CONFIG_FILE).is_file():
        return
    theirs, mine = asset_names(read_run_config(cfg.warmup_from)), asset_names(cfg.to_dict())
    if theirs[1] != mine[1]:
        raise ValueError(f"warmup_from: {cfg.warmup_from} was trained with captioner "
                         f"{theirs[1]!r} (on {theirs[0]!r}), this run with {mine[1]!r} (on "
                         f"{mine[0]!r}); its warmup policy scored the other captioner's "
                         "embeddings of the clips. Pass a run trained with this captioner, or "
                         "drop --warmup-from to train a warmup here")


def check_references(cfg: TrainConfig, cache) -> None:
    """A reward that reads CIDEr (``cider``, ``cider+fidelity``) needs the AV references of
    every train clip; a cache without them (label-free) trains with ``reward: fidelity``."""
    if cfg.reward == "fidelity":
        return
    train = cache.split("train")
    missing = clips_without_references(train)
    if missing:
        raise ValueError(f"reward = {cfg.reward!r} scores captions against reference captions, "
                         f"but {len(missing)} of {len(train)} train clips of {cache.root} have "
                         f"none (e.g. clip {missing[0]!r}); pass --reward fidelity to train "
                         "without references")


def clips_without_references(split) -> list[str]:
    """The ids of ``split``'s clips (a cache split) that have no AV reference caption."""
    return [clip_id for clip_id, refs in zip(split.clip_ids, split.references("av")) if not refs]


def comparisons_the_data_can_train(cfg: TrainConfig, cache) -> list:
    """``cfg.eval_methods``, less CaCoVID-AV where the train clips lack references: it trains
    with its own reward, CIDEr, whatever the run's. Left out of the default rows with a note;
    refused when asked for by name."""
    if "cacovid" not in cfg.eval_methods or cfg.warmup_only:
        return list(cfg.eval_methods)
    train = cache.split("train")
    missing = clips_without_references(train)
    if not missing:
        return list(cfg.eval_methods)
    why = (f"CaCoVID-AV trains with its own reward, CIDEr against reference captions, but "
           f"{len(missing)} of {len(train)} train clips of {cache.root} have none")
    if list(cfg.eval_methods) != DEFAULT_EVAL_METHODS:
        raise ValueError(f"eval_methods = {cfg.eval_methods}: {why}; leave 'cacovid' out "
                         "(for instance --eval-methods random,attention)")
    print(f"note: the table leaves CaCoVID-AV out: {why}")
    return [name for name in cfg.eval_methods if name != "cacovid"]


def train(cfg: TrainConfig, *, resume: bool = False) -> dict:
    """Train a policy with ``cfg`` (warmup, then RL + exchanges) and, unless
    ``cfg.evaluate`` is off, score it. ``resume=True`` continues the run in ``cfg.run_dir``
    (or the newest under ``runs/``) from its latest checkpoint, with its saved settings.

    Returns ``{"run_dir": str, "rows": [...], "table": str}`` (no rows without evaluation).
    """
    run = prepare_run(cfg, resume=resume)
    return {"run_dir": run.cfg.run_dir, **run.execute()}


def run_finished(run_dir) -> bool:
    """Whether ``run_dir`` holds a finished run (its latest checkpoint's phase is "done")."""
    run_dir = Path(run_dir)
    latest = latest_checkpoint(run_dir) if run_dir.exists() else None
    return latest is not None and read_state(latest).get("phase") == "done"


def ensure_trained(cfg: TrainConfig) -> Path:
    """Train ``cfg`` unless ``cfg.run_dir`` already holds a finished run (then it is reused; an
    unfinished one is resumed). A run there trained with other settings is refused
    (:func:`check_reusable`)."""
    run_dir = Path(cfg.run_dir)
    check_reusable(cfg)
    if run_finished(run_dir):
        return run_dir
    started = run_dir.exists() and latest_checkpoint(run_dir) is not None
    train(cfg, resume=started)
    return run_dir


def train_variant(base: TrainConfig, run_dir, *, warmup_from=None, **settings) -> Path:
    """``base`` with ``settings`` (TrainConfig fields: a method's, an ablation's), trained in
    ``run_dir`` from the warmup policy of the run ``warmup_from`` (None: a warmup of its own),
    so that variants of one warmup differ in their RL phase alone. A finished run in
    ``run_dir`` is reused and an unfinished one resumed (:func:`ensure_trained`)."""
    return ensure_trained(variant_config(base, run_dir, warmup_from=warmup_from, **settings))


def variant_config(base: TrainConfig, run_dir, *, warmup_from=None, **settings) -> TrainConfig:
    """The settings :func:`train_variant` trains with."""
    return dataclasses.replace(
        base, run_dir=str(run_dir), warmup_from=None if warmup_from is None else str(warmup_from),
        **settings)


def main(argv=None) -> dict:
    parser = build_parser("python -m avex.train", __doc__.split("\n\n")[0])
    args = parser.parse_args(argv)
    try:  # every setting is checked before any work starts; a bad one is a usage error
        run = prepare_run(resolve_config(args), resume=args.resume,
                          explicit=explicit_settings(args) if args.resume else None)
    except (ValueError, TypeError, OSError) as err:
        parser.error(str(err))
    try:
        return {"run_dir": run.cfg.run_dir, **run.execute()}
    except TrainingInterrupted as stop:
        print(f"{stop.what}; checkpoint: {stop.checkpoint}\n"
              f"resume with:\n  {stop.resume}", file=sys.stderr, flush=True)
        sys.exit(130)
