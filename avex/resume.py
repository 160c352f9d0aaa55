"""Where a run lives and how it resumes: a new run directory, the settings a resumed run keeps
(its own config.json), the checkpoint it may take, and its metrics after that checkpoint."""
from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

from avex.checkpoint import POLICY_FILE, check_weights, read_run_config, read_state
from avex.config import TrainConfig
from avex.run_files import CHECKPOINTS_DIR, CONFIG_FILE


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
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        os.replace(tmp, path)
    return dropped
