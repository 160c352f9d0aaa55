"""Learned selectors: AVEX-Prune (the trained policy) and CaCoVID-AV.

Both score every AV token with an :class:`avex.policy.AVEXPolicy` and keep the deterministic
Top-K (``gumbel_topk(..., sample=False)``) over the joint AV span, at original positions; a
policy trained with set-aware selection (``config.selection``, :mod:`avex.set_selection`)
keeps its greedy set-aware picks instead.

CaCoVID-AV is CaCoVID's recipe (an RL policy trained with one set-level caption reward for
the sampled keep-set) on audio + visual tokens: the same policy network, warmup and budget as
AVEX-Prune, trained with ``python -m avex.train --no-exchanges`` (set-level REINFORCE, no token
exchanges). Deviation from CaCoVID: its own scorer architecture and video-only token pool are
replaced by the AVEX policy over both modalities, so the two learned rows differ only in the
training signal.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from avex import _checks
from avex.files import load_weights
from avex.kernels import gumbel_topk
from avex.policy import (POLICY_CONFIG, POLICY_FORMAT, POLICY_WEIGHTS, AVEXPolicy,
                         read_policy_record)
from avex.run_files import (CHECKPOINTS_DIR, CONFIG_FILE, POLICY_FILE, POLICY_RECORD_FILE,
                            STEP_NAME, WARMUP_POLICY_FILE, latest_checkpoint, read_run_config,
                            read_state)
from avex.selection import indices_to_keep


#: the RL estimators' names in a recipe (TrainConfig.rl_estimator)
_ESTIMATORS = {"rloo": "RLOO", "group": "group-normalised advantage",
               "paper": "the paper's L_RL"}


def recipe(cfg: dict) -> str:
    """What a training run's settings (its config.json, as ``read_run_config`` gives them)
    train, in words for a table's row: e.g. "RLOO over 8 anchors, no exchange term"."""
    if cfg.get("warmup_only"):
        return "warmup only"
    estimator = cfg.get("rl_estimator", "rloo")
    rl = (f"{_ESTIMATORS.get(estimator, estimator)} over {cfg.get('anchors')} anchors"
          if cfg.get("rl", True) else "no L_RL")
    if not cfg.get("exchanges"):
        return f"{rl}, no exchange term"
    selection = " (random groups)" if cfg.get("exchange_selection") == "random" else ""
    return f"{rl} + exchange term{selection}, lambda_ex {cfg.get('lambda_ex'):g}"


def policy_selector(policy):
    """The inference path: deterministic Top-K of ``policy``'s scores, or its greedy set-aware
    selection where the policy was trained with it (``policy.config.selection``)."""
    @torch.no_grad()
    def select(batch, layout, retention):
        budget = layout.budget(_checks.ratio("retention", retention))
        if policy.set_aware:
            scores, hidden = policy.score(batch.inputs_embeds, batch.modality, with_hidden=True)
            idx, _ = policy.select(layout.gather(scores), layout.gather_vectors(hidden), budget)
            return indices_to_keep(idx, layout.positions.shape[1])
        scores = layout.gather(policy.score(batch.inputs_embeds, batch.modality))
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


def is_saved_policy(path) -> bool:
    """Whether ``path`` is a directory written by ``AVEXPolicy.save_pretrained``."""
    path = Path(path)
    if not (path / POLICY_WEIGHTS).is_file() or not (path / POLICY_CONFIG).is_file():
        return False
    try:
        return json.loads((path / POLICY_CONFIG).read_text(encoding="utf-8")).get(
            "format") == POLICY_FORMAT
    except (ValueError, OSError, AttributeError):
        return False


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


def load_policy(path, captioner=None, *, model=None, checkpoint: str = "latest", device=None,
                allow_unfinished: bool = False):
    """A trained policy, in eval mode, from ``path``: a directory written by
    ``AVEXPolicy.save_pretrained``, or a ``python -m avex.train`` run directory (then
    ``checkpoints/latest`` unless ``checkpoint`` names a step directory, or ``"warmup"`` for
    warmup_policy.safetensors). ``avex.load_policy`` is this function.

    ``model`` (or ``captioner``, whose LLM is taken) is the model the policy will serve: it is
    checked against what the policy was trained on (model type, hidden size) before anything
    is loaded, and the policy goes to its device (else ``device``, else the CPU). The latest
    checkpoint of a run that did not finish is refused unless ``allow_unfinished``. A run made
    before runs recorded their policy (no ``policy.json``) needs the model to rebuild it."""
    _checks.flag("allow_unfinished", allow_unfinished)
    if captioner is not None:
        model = captioner.model if model is None else model
    if model is not None and device is None:
        device = next(model.parameters()).device
    path = Path(path)
    if is_saved_policy(path):
        if checkpoint != "latest":
            raise ValueError(f"checkpoint={checkpoint!r} names a checkpoint of a run directory, "
                             f"but {path} is a saved policy (it has one set of weights)")
        return AVEXPolicy.from_pretrained(path, model=model, device=device)
    weights, cfg = run_policy_weights(path, checkpoint, name="path")
    if checkpoint == "latest" and not allow_unfinished:
        check_finished(path, name="path")
    record = path / POLICY_RECORD_FILE
    if record.is_file():
        policy_cfg, trained_on = read_policy_record(record)
        if model is not None:
            trained_on.check_model(model)
        policy = AVEXPolicy(policy_cfg)
    elif model is not None:  # a run from before the record: rebuilt around its LLM
        # runs from before the positional input have no policy_positional setting
        policy = AVEXPolicy.from_llm(model, hidden_size=cfg.get("policy_hidden"),
                                     init_from_llm=False,
                                     positional=cfg.get("policy_positional", False),
                                     selection=cfg.get("selection", "topk"),
                                     redundancy=cfg.get("redundancy", 0.0))
        trained_on = None
    else:
        raise FileNotFoundError(f"path: {path} has no {POLICY_RECORD_FILE} (a run from before "
                                "runs recorded their policy); pass model= (the LLM it was "
                                "trained with) to rebuild it")
    load_weights(policy, weights)
    policy.trained_on = trained_on
    return policy.to(device or "cpu").eval()
