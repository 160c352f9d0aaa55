"""Atomic training checkpoints.

A checkpoint is a directory ``<run>/checkpoints/step-<N>/`` holding

    policy.safetensors   the policy's weights
    state.pt             optimiser, scheduler, RNG states, data position, step, config

It is written under a temporary name and renamed into place, then ``<run>/checkpoints/latest``
(a one-line file) is replaced atomically to point at it. A run killed at any moment leaves
either the previous checkpoint or the new one, never a half-written one.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from avex.run_files import CHECKPOINTS_DIR, CONFIG_FILE

LATEST = "latest"
POLICY_FILE = "policy.safetensors"
STATE_FILE = "state.pt"
STATE_KEYS = ("phase", "step", "optimizer", "rng", "config")
STEP_NAME = re.compile(r"^step-\d+$")


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
            "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save_checkpoint(run_dir, step: int, policy: torch.nn.Module, state: dict,
                    keep_last: int = 2) -> Path:
    """Write checkpoint ``step`` atomically and point ``latest`` at it; keep the newest few."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    staging = Path(tempfile.mkdtemp(dir=root, prefix=f".step-{step:08d}."))
    try:
        weights = {k: v.detach().cpu().contiguous() for k, v in policy.state_dict().items()}
        save_file(weights, str(staging / POLICY_FILE))
        torch.save(state, staging / STATE_FILE)
        if final.exists():  # a rerun of the same step replaces it
            shutil.rmtree(final)
        os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _write_atomically(root / LATEST, final.name + "\n")
    old = sorted(p for p in root.glob("step-*") if p.is_dir())[:-keep_last]
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    return final


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


def read_weights(file) -> dict[str, torch.Tensor]:
    """A safetensors file of weights; a corrupt or truncated one is refused naming it."""
    try:
        return load_file(str(file))
    except Exception as err:  # SafetensorError, OSError
        raise ValueError(f"{file}: corrupt or truncated weights ({type(err).__name__}: "
                         f"{err}); use an intact copy of the run") from None


def check_weights(file) -> None:
    """Read only the header of a safetensors file: a truncated or corrupt one is refused, naming
    it, before any model is loaded."""
    try:
        with safe_open(str(file), framework="pt") as handle:
            handle.keys()
    except Exception as err:  # SafetensorError, OSError
        raise ValueError(f"{file}: corrupt or truncated weights ({type(err).__name__}: "
                         f"{err}); use an intact copy of the run") from None


def load_weights(policy: torch.nn.Module, file) -> torch.nn.Module:
    """``policy.load_state_dict`` from ``file``, naming the file when the weights don't fit."""
    try:
        policy.load_state_dict(read_weights(file))
    except RuntimeError as err:
        raise ValueError(f"{file}: the weights do not fit this policy ({err})") from None
    return policy


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


def load_checkpoint(path, policy: torch.nn.Module) -> dict:
    """Load the weights into ``policy`` and return the saved state dict."""
    path = Path(path)
    state = read_state(path)
    load_weights(policy, path / POLICY_FILE)
    return state
