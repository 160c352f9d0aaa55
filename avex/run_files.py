"""The files of a ``python -m avex.train`` run directory, named in one place::

    <run>/config.json                  the run's settings (TrainConfig.to_dict)
         policy.json                   the policy's sizes and what it is trained on
         metrics.jsonl                 one line per optimiser step (warmup, then RL)
         warmup_policy.safetensors     the policy after the warmup (other runs start from it)
         exchange_calibration.json     w(dR)'s saturation, measured once (with the exchange term)
         exchange_diagnostics.json     the RL groups' reward ties; with the exchange term, its
                                       labels and gradients (and a .png)
         checkpoints/step-N/, latest   atomic checkpoints (avex.training.checkpoint)
         policy/                       the finished policy (AVEXPolicy.save_pretrained)
         results.md, results.json      the end-of-run table
         cacovid/                      CaCoVID-AV, trained from this run's warmup for the table

A leaf module: anything that reads or writes a run directory names its files from here, and
reads them with the readers below (the latest checkpoint, its state, the run's settings, the
policy weights a run offers and whether it finished); :mod:`avex.training.checkpoint` writes
the checkpoints, :mod:`avex.training.run_records` the rest.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from avex.judge_identity import captioner_sha256

CONFIG_FILE = "config.json"
# the captioner a run trained with: its path and the SHA-256 of its weights
CAPTIONER_RECORD_FILE = "captioner.json"
POLICY_RECORD_FILE = "policy.json"
METRICS_FILE = "metrics.jsonl"
WARMUP_POLICY_FILE = "warmup_policy.safetensors"
EXCHANGE_CALIBRATION_FILE = "exchange_calibration.json"
EXCHANGE_DIAGNOSTICS_FILE = "exchange_diagnostics.json"
EXCHANGE_DIAGNOSTICS_FIGURE = "exchange_diagnostics.png"
CHECKPOINTS_DIR = "checkpoints"
SAVED_POLICY_DIR = "policy"
RESULTS_MD = "results.md"
RESULTS_JSON = "results.json"
CACOVID_DIR = "cacovid"
# inside checkpoints/: step-N/ directories, each a policy.safetensors and a state.pt, and the
# one-line file ``latest`` naming the newest
LATEST = "latest"
POLICY_FILE = "policy.safetensors"
STATE_FILE = "state.pt"
STEP_NAME = re.compile(r"^step-\d+$")
STATE_KEYS = ("phase", "step", "optimizer", "rng", "config")


def warmup_policy_file(run_dir, *, name: str = "warmup_from") -> Path:
    """The warmup policy of the run directory ``run_dir``; a missing one is refused, naming the
    setting (``name``) the directory came from."""
    path = Path(run_dir) / WARMUP_POLICY_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{name}: no {WARMUP_POLICY_FILE} in {str(run_dir)!r}")
    return path


def latest_checkpoint(run_dir) -> Path | None:
    """The checkpoint ``<run>/checkpoints/latest`` names, or None when there is none. A pointer
    that names anything but a ``step-N`` directory of this run is refused: a run resumes only
    from its own checkpoints."""
    pointer = Path(run_dir) / CHECKPOINTS_DIR / LATEST
    if not pointer.exists():
        return None
    try:
        name = pointer.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{pointer}: unreadable ({err}); it should name a step-N directory "
                         "beside it") from None
    if not STEP_NAME.match(name):
        raise ValueError(f"{pointer} names {name!r}, not a step-N checkpoint of this run; the "
                         f"checkpoints of {run_dir} belong elsewhere or the file is corrupt")
    path = pointer.parent / name
    if not (path / POLICY_FILE).exists() or not (path / STATE_FILE).exists():
        raise FileNotFoundError(f"{pointer} points at {path}, which is missing or incomplete")
    return path


def read_run_config(run_dir) -> dict:
    """The settings ``<run>/config.json`` holds; a corrupt one is refused naming the file."""
    file = Path(run_dir) / CONFIG_FILE
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise
    except (ValueError, OSError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"{file}: corrupt or truncated run settings ({err})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{file}: expected a JSON object of settings, got "
                         f"{type(data).__name__}")
    return data


def captioner_record(captioner_path) -> dict:
    """What ``<run>/captioner.json`` records of the captioner at ``captioner_path``: the
    path and the SHA-256 of its weights (None for a model with no weight files there)."""
    return {"path": str(captioner_path), "sha256": captioner_sha256(captioner_path)}


def check_captioner(run_dir, captioner_path, *, name: str) -> None:
    """Refuse to continue or score the run ``run_dir`` with the captioner at
    ``captioner_path`` when the run recorded another one (weights that hash otherwise): its
    policy was trained on the other captioner's embeddings, and its scores would be reported
    as this one's. A run from before the record, or a captioner without weight files, passes.
    ``name``: the setting ``run_dir`` came from."""
    file = Path(run_dir) / CAPTIONER_RECORD_FILE
    if not file.is_file():
        return
    try:
        had = json.loads(file.read_text(encoding="utf-8"))
        if not isinstance(had, dict):
            raise ValueError(f"expected a JSON object, got {type(had).__name__}")
    except (ValueError, OSError) as err:
        raise ValueError(f"{file}: corrupt or truncated captioner record ({err})") from None
    now = captioner_record(captioner_path)
    if had.get("sha256") and now["sha256"] and had["sha256"] != now["sha256"]:
        raise ValueError(
            f"{name}: {run_dir} was trained with the captioner at {had.get('path')} whose "
            f"weights hash to {had['sha256'][:16]}, but the captioner at {captioner_path} "
            f"hashes to {now['sha256'][:16]} (replaced since, e.g. by python -m avex.captioner "
            "install, or another captioner); the run's policy scored the other captioner's "
            "embeddings. Use the captioner it was trained with, or train the run again")


def read_state(path) -> dict:
    """The ``state.pt`` of checkpoint ``path``; a corrupt or truncated one is refused naming it."""
    file = Path(path) / STATE_FILE
    try:
        state = torch.load(file, weights_only=False)
    except Exception as err:  # UnpicklingError, EOFError, RuntimeError (zip), OSError
        raise ValueError(f"{file}: corrupt or truncated checkpoint state ({type(err).__name__}: "
                         f"{err}); resume from an intact copy of the run") from None
    missing = [k for k in STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise ValueError(f"{file}: not a training checkpoint state (missing {missing})")
    return state


def run_policy_weights(run_dir, checkpoint: str = "latest", *, name: str = "run_dir"):
    """(weights file, settings) of a ``python -m avex.train`` run directory, checked without
    loading anything: ``checkpoints/latest`` unless ``checkpoint`` names a step directory, or
    ``"warmup"`` for warmup_policy.safetensors. Raises naming what is missing, and the
    argument (``name``) it came from."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{name}: no run directory at {str(run_dir)!r}")
    if not (run_dir / CONFIG_FILE).is_file():
        raise FileNotFoundError(f"{name}: {run_dir} has no {CONFIG_FILE} (not a "
                                "`python -m avex.train` run)")
    cfg = read_run_config(run_dir)
    if checkpoint == "warmup":
        weights = run_dir / WARMUP_POLICY_FILE
    elif checkpoint == "latest":
        latest = latest_checkpoint(run_dir)
        if latest is None:
            raise FileNotFoundError(f"{name}: {run_dir} has no checkpoints/latest")
        weights = latest / POLICY_FILE
    else:
        if not isinstance(checkpoint, str) or not STEP_NAME.match(checkpoint):
            raise ValueError(f"checkpoint must be 'latest', 'warmup' or a step-N directory "
                             f"name, got {checkpoint!r}")
        weights = run_dir / CHECKPOINTS_DIR / checkpoint / POLICY_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"{name}: no policy weights at {weights}")
    return weights, cfg


def run_progress(run_dir) -> dict:
    """Where a run's latest checkpoint stands: ``{"finished", "phase", "step", "checkpoint"}``
    (``checkpoint`` the step directory's name)."""
    latest = latest_checkpoint(run_dir)
    if latest is None:
        raise FileNotFoundError(f"{run_dir} has no checkpoints/latest")
    state = read_state(latest)
    return {"finished": state["phase"] == "done", "phase": state["phase"],
            "step": int(state["step"]), "checkpoint": latest.name}


def check_finished(run_dir, *, name: str = "run_dir") -> dict:
    """:func:`run_progress`, refusing a run whose training did not finish (it was stopped or
    killed): its latest checkpoint is not the policy the run would have made."""
    progress = run_progress(run_dir)
    if not progress["finished"]:
        raise ValueError(f"{name}: {run_dir} did not finish training (its latest checkpoint, "
                         f"{progress['checkpoint']}, is {progress['phase']} step "
                         f"{progress['step']}); resume it with python -m avex.train --resume "
                         f"--run-dir {run_dir}, or accept the unfinished policy explicitly "
                         "(--allow-unfinished / allow_unfinished=True)")
    return progress
