"""Atomic training checkpoints.

A checkpoint is a directory ``<run>/checkpoints/step-<N>/`` holding

    policy.safetensors   the policy's weights
    state.pt             optimiser, scheduler, RNG states, data position, step, config

It is written under a temporary name and renamed into place, then ``<run>/checkpoints/latest``
(a one-line file) is replaced atomically to point at it. A run killed at any moment leaves
either the previous checkpoint or the new one, never a half-written one.
"""
from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from avex.files import cpu_state_dict, load_weights, write_text_atomically
from avex.run_files import CHECKPOINTS_DIR, LATEST, POLICY_FILE, STATE_FILE, read_state

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


def save_checkpoint(run_dir, step: int, policy: torch.nn.Module, state: dict,
                    keep_last: int = 2) -> Path:
    """Write checkpoint ``step`` atomically and point ``latest`` at it; keep the newest few."""
    root = Path(run_dir) / CHECKPOINTS_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    staging = Path(tempfile.mkdtemp(dir=root, prefix=f".step-{step:08d}."))
    try:
        save_file(cpu_state_dict(policy), str(staging / POLICY_FILE))
        torch.save(state, staging / STATE_FILE)
        if final.exists():  # a rerun of the same step replaces it
            shutil.rmtree(final)
        os.replace(staging, final)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    write_text_atomically(root / LATEST, final.name + "\n", durable=True)
    old = sorted(p for p in root.glob("step-*") if p.is_dir())[:-keep_last]
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    return final


def load_checkpoint(path, policy: torch.nn.Module) -> dict:
    """Load the weights into ``policy`` and return the saved state dict."""
    path = Path(path)
    state = read_state(path)
    load_weights(policy, path / POLICY_FILE)
    return state
