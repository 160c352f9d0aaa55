"""Learned selectors: AVEX-Prune (the trained policy) and CaCoVID-AV.

Both score every AV token with an :class:`avex.policy.AVEXPolicy` and keep the deterministic
Top-K (``gumbel_topk(..., sample=False)``) over the joint AV span, at original positions.

CaCoVID-AV is CaCoVID's recipe (an RL policy trained with one set-level caption reward for
the sampled keep-set) on audio + visual tokens: the same policy network, warmup and budget as
AVEX-Prune, trained with ``python -m avex.train --no-exchanges`` (set-level REINFORCE, no token
exchanges). Deviation from CaCoVID: its own scorer architecture and video-only token pool are
replaced by the AVEX policy over both modalities, so the two learned rows differ only in the
training signal.
"""
from __future__ import annotations

from pathlib import Path

import torch

from avex import _checks
from avex.checkpoint import (POLICY_FILE, STEP_NAME, latest_checkpoint, load_weights,
                             read_run_config)
from avex.kernels import gumbel_topk
from avex.policy import AVEXPolicy
from avex.selection import indices_to_keep


def policy_selector(policy):
    """Deterministic Top-K of ``policy``'s scores (the inference path)."""
    @torch.no_grad()
    def select(batch, layout, retention):
        budget = layout.budget(_checks.ratio("retention", retention))
        scores = layout.gather(policy(batch.inputs_embeds, batch.modality))
        idx, _ = gumbel_topk(scores, budget, sample=False)
        return indices_to_keep(idx, scores.shape[1])
    return select


def run_policy_weights(run_dir, checkpoint: str = "latest", *, name: str = "run_dir"):
    """(weights file, settings) of a ``python -m avex.train`` run directory, checked without
    loading anything: ``checkpoints/latest`` unless ``checkpoint`` names a step directory, or
    ``"warmup"`` for warmup_policy.safetensors. Raises naming what is missing, and the
    argument (``name``) it came from."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{name}: no run directory at {str(run_dir)!r}")
    config = run_dir / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"{name}: {run_dir} has no config.json (not a "
                                "`python -m avex.train` run)")
    cfg = read_run_config(run_dir)
    if checkpoint == "warmup":
        weights = run_dir / "warmup_policy.safetensors"
    elif checkpoint == "latest":
        latest = latest_checkpoint(run_dir)
        if latest is None:
            raise FileNotFoundError(f"{name}: {run_dir} has no checkpoints/latest")
        weights = latest / POLICY_FILE
    else:
        if not isinstance(checkpoint, str) or not STEP_NAME.match(checkpoint):
            raise ValueError(f"checkpoint must be 'latest', 'warmup' or a step-N directory "
                             f"name, got {checkpoint!r}")
        weights = run_dir / "checkpoints" / checkpoint / POLICY_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"{name}: no policy weights at {weights}")
    return weights, cfg


def load_policy(run_dir, captioner, *, checkpoint: str = "latest"):
    """The policy of a ``python -m avex.train`` run directory (``checkpoints/latest`` unless
    ``checkpoint`` names a step directory, or ``"warmup"`` for warmup_policy.safetensors)."""
    weights, cfg = run_policy_weights(run_dir, checkpoint)
    # runs from before the positional input have no policy_positional setting
    policy = AVEXPolicy.from_llm(captioner.model, hidden_size=cfg.get("policy_hidden"),
                                 init_from_llm=False,
                                 positional=cfg.get("policy_positional", False))
    load_weights(policy, weights)
    return policy.to(captioner.device).eval()
