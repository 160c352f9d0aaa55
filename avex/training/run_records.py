"""A training run's books: where it lives (a new run directory), what it keeps there (its
settings, metrics, policy record and checkpoints, written by the main process) and how it
resumes (the settings a resumed run keeps, the checkpoint it may take, its metrics after that
checkpoint); and the stop at a step boundary, which any process's signal asks of every one."""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import time
from pathlib import Path

import torch
import torch.distributed as torch_dist

from avex.files import (check_weights, cpu_state_dict, save_tensors_atomically,
                        write_text_atomically)
from avex.policy import policy_record
from avex.run_files import (CAPTIONER_RECORD_FILE, CHECKPOINTS_DIR, CONFIG_FILE, METRICS_FILE,
                            POLICY_FILE, POLICY_RECORD_FILE, WARMUP_POLICY_FILE,
                            captioner_record, check_captioner, latest_checkpoint,
                            read_run_config, read_state)
from avex.training.checkpoint import rng_state, save_checkpoint
from avex.training.config import SETTINGS_BEFORE_THEY_EXISTED, TrainConfig
from avex.training.distributed import unwrap
from avex.training.stopping import TrainingInterrupted


RUNS_ROOT = Path("runs")


def choose_run_dir(cfg: TrainConfig, resume: bool) -> str:
    if cfg.run_dir is not None:
        return cfg.run_dir
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ValueError("under torchrun, pass --run-dir (every rank must write to the same one)")
    if resume:
        runs = sorted(p for p in RUNS_ROOT.glob("*") if (p / CHECKPOINTS_DIR).is_dir())
        if not runs:
            raise FileNotFoundError(f"--resume: no run under {RUNS_ROOT}/; pass --run-dir")
        return str(runs[-1])
    return str(RUNS_ROOT / time.strftime("%Y%m%d-%H%M%S"))


# Settings a resumed run may take from the command line: where it lives and how it reports.
# Every other setting is the run's own; a flag that contradicts it is refused.
RESUME_OVERRIDES = ("run_dir", "cache_dir", "device", "progress")


#: settings that don't shape the policy a run trains (where it lives, how it reports, what
#: its table scores at the end): a finished run that differs only in these is the run asked for
NOT_TRAINING = RESUME_OVERRIDES + ("evaluate", "eval_retentions", "eval_split",
                                   "max_eval_clips", "eval_methods", "checkpoint_every",
                                   "diagnostics_every")
#: settings naming a path, compared as the paths they resolve to
PATH_SETTINGS = ("data", "captioner", "warmup_from")
#: setting -> when it has no effect on training (given a run's settings): such a setting may
#: differ between a run and the settings asked for when it has no effect in both, so that a
#: later change of its default does not refuse older runs
INERT = {"retention_lr": lambda settings: not settings.get("retention_input")}


def check_reusable(cfg: TrainConfig) -> None:
    """Refuse to reuse or resume the run in ``cfg.run_dir`` (an experiment's run folder that
    already holds one) when it was trained with other settings than ``cfg``: its scores would be
    reported as those of ``cfg``. Settings of :data:`NOT_TRAINING` may differ, and so may those
    of :data:`INERT` where they have no effect in either."""
    run_dir = Path(cfg.run_dir)
    if not (run_dir / CONFIG_FILE).exists():
        return
    saved = {**SETTINGS_BEFORE_THEY_EXISTED, **read_run_config(run_dir)}
    wanted = cfg.to_dict()
    differ = {}
    for name, asked in wanted.items():
        had = saved.get(name)
        if name in INERT and INERT[name](wanted) and INERT[name](saved):
            continue
        if name == "warmup_from" and had is not None and asked is not None \
                and not Path(had).exists():
            continue   # a moved run names its warmup's old place: nothing left to compare
        same = _same_path(asked, had) if name in PATH_SETTINGS else asked == had
        if name not in NOT_TRAINING and not same:
            differ[name] = (asked, had)
    if differ:
        listed = ", ".join(f"{name}={asked!r} (the run has {had!r})"
                           for name, (asked, had) in sorted(differ.items()))
        raise ValueError(f"{run_dir} already holds a run trained with other settings than this "
                         f"one asks for: {listed}; give another output folder, or remove that "
                         "run to train it again")


def _same_path(a, b) -> bool:
    if a is None or b is None or a == b:
        return a == b
    return Path(a).resolve() == Path(b).resolve()


def resumed_config(cfg: TrainConfig, explicit: dict | None = None) -> TrainConfig:
    """The settings a resumed run continues with: its own ``config.json``, in the directory it
    was given (a copied or moved run writes where it now is, never where it was made).
    ``explicit`` (settings asked for on the command line) must agree with them."""
    run_dir = Path(cfg.run_dir)
    if not (run_dir / CONFIG_FILE).exists():
        return cfg
    saved = read_run_config(run_dir)
    unknown = set(saved) - {f.name for f in dataclasses.fields(TrainConfig)}
    if unknown:
        raise ValueError(f"{run_dir / CONFIG_FILE}: unknown settings {sorted(unknown)} (a "
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
    return TrainConfig(**{**SETTINGS_BEFORE_THEY_EXISTED, **saved, **overrides}).validate()


def check_owner(checkpoint: Path, cfg: TrainConfig) -> None:
    """Refuse a checkpoint written by a run with other settings (checkpoints copied in from
    elsewhere): resuming it would mix two runs."""
    check_weights(checkpoint / POLICY_FILE)
    saved = read_state(checkpoint)["config"]
    differ = sorted(name for name, value in cfg.to_dict().items()
                    if name not in RESUME_OVERRIDES and name in saved and saved[name] != value)
    if differ:
        raise ValueError(f"{checkpoint} belongs to a run with other settings than "
                         f"{Path(cfg.run_dir) / CONFIG_FILE} (they differ in {differ}); "
                         "resume the run it came from, or start a new one")


def truncate_metrics(path: Path, phase: str, step: int) -> int:
    """Drop the records of ``metrics.jsonl`` at or after the checkpoint a run resumes from
    (``phase``, ``step``): they are done again, and a step must appear once. Returns the
    number of records dropped."""
    if not path.is_file():
        return 0
    order = {"warmup": 0, "rl": 1, "done": 2}
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
            position = (order[record["phase"]], int(record["step"]))
        except (ValueError, KeyError, TypeError):
            kept.append(line)   # not a step record: kept as it is
            continue
        if position >= (order[phase], step):
            dropped += 1
        else:
            kept.append(line)
    if dropped:
        write_text_atomically(path, "".join(line + "\n" for line in kept))
    return dropped


def resume_checkpoint(cfg: TrainConfig, resume: bool) -> Path | None:
    """The checkpoint a run in ``cfg.run_dir`` continues from: with ``resume``, its latest one
    (which must exist and belong to a run with these settings); without, None, and the
    directory must hold no run yet."""
    run_dir = Path(cfg.run_dir)
    if not resume:
        if latest_checkpoint(run_dir) is not None:
            raise FileExistsError(f"{run_dir} already holds a run; pass --resume to "
                                  "continue it or --run-dir for a new one")
        return None
    checkpoint = latest_checkpoint(run_dir)
    if checkpoint is None:
        raise FileNotFoundError(f"--resume: no checkpoint under {run_dir}/{CHECKPOINTS_DIR}; "
                                "start the run without --resume")
    check_owner(checkpoint, cfg)
    return checkpoint


def check_recorded_captioner(cfg: TrainConfig, captioner_path, *, resume: bool) -> None:
    """A resumed run must find the captioner it started with (another captioner's embeddings
    would change what the policy reads mid-run), as must a run that starts from another's
    warmup (:func:`avex.run_files.check_captioner`)."""
    if resume:
        check_captioner(cfg.run_dir, captioner_path, name="--resume")
    if cfg.warmup_from:
        check_captioner(cfg.warmup_from, captioner_path, name="warmup_from")


class RunRecords:
    """What a run keeps in its directory: ``config.json`` when it starts, a ``metrics.jsonl``
    line a step, ``policy.json``, and checkpoints numbered by global step (warmup steps, then
    RL steps; the run sets :attr:`warmup_steps`); the main process writes, every process waits
    for a checkpoint. :attr:`stop` is the run's :class:`~avex.stop_signals.StopSignals` while
    it trains."""

    def __init__(self, cfg: TrainConfig, procs, device, resume: bool):
        self.cfg, self.procs, self.device = cfg, procs, device
        self.run_dir = Path(cfg.run_dir)
        self.checkpoint = resume_checkpoint(cfg, resume)
        if procs.main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / CONFIG_FILE).write_text(json.dumps(cfg.to_dict(), indent=2))
        self.log_file = self.run_dir / METRICS_FILE
        self.warmup_steps = 0
        self.stop = None

    def record_captioner(self, captioner_path) -> None:
        """``captioner.json``: the captioner this run trains with, checked first
        (:func:`check_recorded_captioner`; for one that existed before the run,
        ``prepare_run`` checked it already)."""
        check_recorded_captioner(self.cfg, captioner_path, resume=self.checkpoint is not None)
        if self.procs.main:
            write_text_atomically(self.run_dir / CAPTIONER_RECORD_FILE,
                                  json.dumps(captioner_record(captioner_path), indent=2) + "\n")

    def log(self, record: dict):
        if not self.procs.main:
            return
        record = {k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in record.items()}
        with open(self.log_file, "a") as f:
            f.write(json.dumps(record) + "\n")

    def record_policy(self, policy) -> None:
        """``policy.json``: the policy's sizes and what it is trained on (``avex.load_policy``
        reads it to rebuild and check the policy)."""
        if self.procs.main:
            text = json.dumps(policy_record(policy.config, policy.trained_on), indent=2)
            (self.run_dir / POLICY_RECORD_FILE).write_text(text + "\n")

    def save_warmup_policy(self, policy) -> None:
        """``warmup_policy.safetensors``: the policy after the warmup (other runs start from
        it)."""
        if self.procs.main:
            save_tensors_atomically(self.run_dir / WARMUP_POLICY_FILE,
                                    cpu_state_dict(unwrap(policy)))

    def save(self, policy, phase, step, optimizer, scheduler, extra: dict | None = None):
        """Checkpoint the step boundary; ``extra``: more state to resume with (the RL phase's
        weight average)."""
        if self.procs.main:
            state = {"phase": phase, "step": step, "optimizer": optimizer.state_dict(),
                     "scheduler": scheduler.state_dict() if scheduler else None,
                     "rng": rng_state(), "config": self.cfg.to_dict(), **(extra or {})}
            global_step = step if phase == "warmup" else self.warmup_steps + step
            save_checkpoint(self.run_dir, global_step, unwrap(policy), state)
        self.procs.barrier()

    def any_rank(self, flag: bool) -> bool:
        """``flag`` or'ed over every process (so that all of them take the same branch)."""
        if self.procs.world == 1:
            return flag
        value = torch.tensor([1.0 if flag else 0.0], device=self.device)
        torch_dist.all_reduce(value, op=torch_dist.ReduceOp.MAX)
        return bool(value.item())

    def mean_over_ranks(self, value: float) -> float:
        """``value`` averaged over every process."""
        if self.procs.world == 1:
            return value
        total = torch.tensor([value], dtype=torch.float64, device=self.device)
        torch_dist.all_reduce(total, op=torch_dist.ReduceOp.SUM)
        return float(total.item()) / self.procs.world

    def stop_requested(self) -> bool:
        return self.any_rank(self.stop is not None and self.stop.requested)

    def resume_command(self) -> str:
        return f"python -m avex.train --resume --run-dir {shlex.quote(str(self.run_dir))}"

    def interrupt(self, model, phase, step, optimizer, scheduler, extra: dict | None = None):
        """A stop was asked for: checkpoint this step boundary, then stop."""
        self.save(model, phase, step, optimizer, scheduler, extra)
        raise TrainingInterrupted(latest_checkpoint(self.run_dir), self.resume_command())
