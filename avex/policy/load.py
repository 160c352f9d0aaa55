"""Loading a trained policy to serve it: ``avex.load_policy`` takes a saved policy
(:mod:`avex.policy.saved`) or a ``python -m avex.train`` run directory (its files are named and
read by :mod:`avex.run_files`: which weights, whether the run finished), checks it against the
model it will serve, and puts it on that model's device."""
from __future__ import annotations

from pathlib import Path

from avex import _checks
from avex.files import load_weights
from avex.policy.network import AVEXPolicy
from avex.policy.saved import is_saved_policy, load_saved_policy, read_policy_record
from avex.run_files import (POLICY_RECORD_FILE, check_captioner, check_finished,
                            run_policy_weights)


def load_policy(path, captioner=None, *, model=None, checkpoint: str = "latest", device=None,
                allow_unfinished: bool = False):
    """A trained policy, in eval mode, from ``path``: a directory written by
    ``AVEXPolicy.save_pretrained``, or a ``python -m avex.train`` run directory (then
    ``checkpoints/latest`` unless ``checkpoint`` names a step directory, or ``"warmup"`` for
    warmup_policy.safetensors). ``avex.load_policy`` is this function.

    ``model`` (or ``captioner``, whose LLM is taken) is the model the policy will serve: it is
    checked against what the policy was trained on (model type, hidden size) before anything
    is loaded (a run's recorded captioner against ``captioner``'s weights, too), and the policy
    goes to its device (else ``device``: 'cpu', 'cuda', 'cuda:N' or
    'auto', refused before anything is read where this machine lacks it; else the CPU). The latest
    checkpoint of a run that did not finish is refused unless ``allow_unfinished``. A run made
    before runs recorded their policy (no ``policy.json``) needs the model to rebuild it."""
    _checks.flag("allow_unfinished", allow_unfinished)
    device = _checks.placement("device", device)
    if captioner is not None:
        if getattr(captioner, "model", None) is None:
            raise TypeError(f"captioner must be a FrozenCaptioner (its .model is the LLM the "
                            f"policy will serve), got {type(captioner).__name__}")
        model = captioner.model if model is None else model
    if model is not None:
        if not callable(getattr(model, "parameters", None)) \
                or getattr(model, "config", None) is None:
            raise TypeError(f"model must be the Hugging Face model the policy will serve (with "
                            f".config and .parameters()), got {type(model).__name__}: "
                            f"{model!r:.80}")
    if model is not None and device is None:
        first = next(model.parameters(), None)
        device = first.device if first is not None else None
    path = Path(path)
    if is_saved_policy(path):
        if checkpoint != "latest":
            raise ValueError(f"checkpoint={checkpoint!r} names a checkpoint of a run directory, "
                             f"but {path} is a saved policy (it has one set of weights)")
        return load_saved_policy(AVEXPolicy, path, model=model, device=device)
    if getattr(captioner, "path", None) is not None:   # a run records the captioner it used
        check_captioner(path, captioner.path, name="path")
    return run_policy(path, model, checkpoint, allow_unfinished).to(device or "cpu").eval()


def run_policy(path: Path, model, checkpoint: str, allow_unfinished: bool) -> AVEXPolicy:
    """The policy of the ``python -m avex.train`` run directory ``path`` (:func:`load_policy`):
    rebuilt from its record (checked against ``model``, if given) or, for a run from before
    the record, around ``model``."""
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
    return policy
