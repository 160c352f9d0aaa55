"""A saved policy: what it is, how it is written and read, and the one check that a folder
holds one.

    <folder>/config.json          the policy's sizes (PolicyConfig) and what it was trained on
                                  (TrainedOn), with the format's name and version
             model.safetensors    its weights

``AVEXPolicy.save_pretrained`` and ``from_pretrained`` are :func:`save_policy` and
:func:`load_saved_policy`; ``avex.load_policy`` (:mod:`avex.policy.load`) reads a saved policy
through them, and the vLLM plugin checks one with :func:`read_saved_policy` before its engine
starts. What a policy was trained on, and the layout rule, are here too: serving refuses what
training did not see.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from avex import __version__, _checks
from avex.files import cpu_state_dict, load_weights, save_tensors_atomically, write_json_atomically
from avex.modality import AUDIO, VISUAL, packed_positions
from avex.policy.config import PolicyConfig


POLICY_FORMAT = "avex-policy"
POLICY_FORMAT_VERSION = 1
POLICY_CONFIG = "config.json"
POLICY_WEIGHTS = "model.safetensors"

#: How a row's audio-visual tokens are laid out, from the order of its modality runs (text in
#: between ignored). Serving must keep the layout training saw: the policy's position features
#: count each token's place within its modality, and the frozen LLM reads the same sequence.
LAYOUTS = {
    "visual": "visual tokens only",
    "audio": "audio tokens only",
    "visual-then-audio": "all visual tokens, then all audio tokens (VideoLLaMA 2, the "
                         "embedded benchmark)",
    "audio-then-visual": "all audio tokens, then all visual tokens",
    "interleaved": "visual and audio tokens alternating in chunks (Qwen2.5-Omni with "
                   "use_audio_in_video)",
}
#: layout a policy was trained on -> the row layouts it scores (a row may lack a modality)
ACCEPTED_LAYOUTS = {
    "visual": {"visual"},
    "audio": {"audio"},
    "visual-then-audio": {"visual", "audio", "visual-then-audio"},
    "audio-then-visual": {"visual", "audio", "audio-then-visual"},
    "interleaved": set(LAYOUTS),
}


def row_layouts(modality: torch.Tensor) -> list:
    """The layout (a key of :data:`LAYOUTS`) of each row of modality codes [B, L]; None for a
    row without audio-visual tokens."""
    _checks.tensor("modality", modality, ndim=2, integer=True)
    is_av = (modality == VISUAL) | (modality == AUDIO)
    at, valid = packed_positions(is_av)
    codes = modality.gather(1, at)
    changes = ((codes[:, 1:] != codes[:, :-1]) & valid[:, 1:]).sum(1)
    names = []
    for first, runs, any_av in zip(codes[:, 0].tolist(), (changes + 1).tolist(),
                                   valid[:, 0].tolist()):
        if not any_av:
            names.append(None)
        elif runs == 1:
            names.append("visual" if first == VISUAL else "audio")
        elif runs == 2:
            names.append("visual-then-audio" if first == VISUAL else "audio-then-visual")
        else:
            names.append("interleaved")
    return names


def layout_of(rows) -> str:
    """The narrowest layout of :data:`LAYOUTS` that accepts every one of ``rows`` (row layouts
    from :func:`row_layouts`; None entries are ignored)."""
    seen = {name for name in rows if name is not None}
    if not seen:
        raise ValueError("no row has an audio-visual token, so there is no layout to record")
    for name in LAYOUTS:
        if seen <= ACCEPTED_LAYOUTS[name]:
            return name
    raise AssertionError(seen)  # "interleaved" accepts every layout


@dataclass(frozen=True)
class TrainedOn:
    """What a policy was trained on, recorded in its artifact: the frozen LLM's model type and
    hidden size, the layout of its training sequences (:data:`LAYOUTS`) and the retention range
    of its training."""
    model_type: str
    hidden_size: int
    layout: str
    retention_range: tuple

    def __post_init__(self):
        _checks.text("model_type", self.model_type)
        _checks.int_at_least("hidden_size", self.hidden_size, 1)
        _checks.choice("layout", self.layout, tuple(LAYOUTS))
        span = self.retention_range
        if not isinstance(span, (list, tuple)) or len(span) != 2:
            raise ValueError(f"retention_range must be [low, high], got {span!r}")
        low = _checks.ratio("retention_range[0]", span[0])
        high = _checks.ratio("retention_range[1]", span[1])
        if low > high:
            raise ValueError(f"retention_range must be [low, high] with low <= high, got "
                             f"{list(self.retention_range)}")
        object.__setattr__(self, "retention_range", (float(low), float(high)))

    @classmethod
    def of_model(cls, model, layout: str, retentions) -> "TrainedOn":
        """The record for a policy trained with the frozen LLM ``model`` on ``layout``, at
        ``retentions`` (the retention(s) training drew from)."""
        retentions = list(retentions)
        return cls(model.config.model_type, model.config.get_text_config().hidden_size, layout,
                   (min(retentions), max(retentions)))

    def to_dict(self) -> dict:
        return {"model_type": self.model_type, "hidden_size": self.hidden_size,
                "layout": self.layout, "retention_range": list(self.retention_range)}

    def check_model(self, model) -> None:
        config = getattr(model, "config", None)
        kind = getattr(config, "model_type", None)
        if kind is None or not hasattr(config, "get_text_config"):
            raise TypeError(f"model must be a Hugging Face model (with a config), got "
                            f"{type(model).__name__}")
        differ = []
        if kind != self.model_type:
            hint = _inner_model_hint(model, self.model_type)
            differ.append(f"model type {kind!r}, the policy was trained with "
                          f"{self.model_type!r}{hint}")
        hidden = config.get_text_config().hidden_size
        if hidden != self.hidden_size:
            differ.append(f"hidden size {hidden}, the policy was trained with {self.hidden_size}")
        if differ:
            raise ValueError(f"the policy was trained with another model: {type(model).__name__} "
                             f"has {'; '.join(differ)}")

    def check_layout(self, modality: torch.Tensor) -> None:
        accepted = ACCEPTED_LAYOUTS[self.layout]
        for row, name in enumerate(row_layouts(modality)):
            if name is not None and name not in accepted:
                raise ValueError(
                    f"modality row {row} is laid out as {name!r} ({LAYOUTS[name]}), but the "
                    f"policy was trained on {self.layout!r} ({LAYOUTS[self.layout]}); serve "
                    "with the layout of the training data (the same processor settings, e.g. "
                    "use_audio_in_video)")

    def check_retention(self, retention: float) -> None:
        """Warn (once per call site) when ``retention`` lies outside the trained range: the
        scores don't depend on it, but the policy was never rewarded there."""
        low, high = self.retention_range
        if not low - 1e-9 <= retention <= high + 1e-9:
            warnings.warn(f"retention={retention:g} lies outside the range the policy was "
                          f"trained at ({low:g}-{high:g}); its Top-K there is untested",
                          stacklevel=3)


def _inner_model_hint(model, model_type: str) -> str:
    """" (pass model.NAME ...)" where a direct sub-module of ``model`` is a ``model_type``
    model (the full Qwen2.5-Omni holds the thinker a policy serves), else "". Read from the
    model itself, so no family is named here."""
    children = model.named_children() if hasattr(model, "named_children") else ()
    for name, child in children:
        if getattr(getattr(child, "config", None), "model_type", None) == model_type:
            return f" (pass model.{name}, the {model_type!r} inside it)"
    return ""


def policy_record(cfg: PolicyConfig, trained_on: TrainedOn) -> dict:
    """The JSON of a saved policy's config.json."""
    sizes = asdict(cfg)
    # so that a reader from before these settings reads a record that doesn't use them (one
    # that does is refused there, not served without merging)
    if not sizes["retention_input"]:
        del sizes["retention_input"]
    if sizes["merge_threshold"] is None:
        del sizes["merge_threshold"]
    return {"format": POLICY_FORMAT, "version": POLICY_FORMAT_VERSION,
            "avex_version": __version__, "policy": sizes,
            "trained_on": trained_on.to_dict()}


def read_policy_record(path) -> tuple[PolicyConfig, TrainedOn]:
    """(PolicyConfig, TrainedOn) of a policy's config.json; refused, naming the file, when it
    isn't one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path.parent}: not a saved AVEX policy (no {path.name}); "
                                "save one with AVEXPolicy.save_pretrained or pass a "
                                "python -m avex.train run directory to avex.load_policy")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise ValueError(f"{path}: corrupt or truncated ({err})") from None
    if not isinstance(raw, dict) or raw.get("format") != POLICY_FORMAT:
        got = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise ValueError(f"{path}: 'format' must be {POLICY_FORMAT!r} (a saved AVEX policy), "
                         f"got {got!r}")
    if raw.get("version") != POLICY_FORMAT_VERSION:
        raise ValueError(f"{path}: policy format version {raw.get('version')!r} is not "
                         f"supported (this avex reads version {POLICY_FORMAT_VERSION})")
    try:
        cfg = PolicyConfig(**raw["policy"])
        trained_on = TrainedOn(**raw["trained_on"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path}: bad policy record ({type(err).__name__}: {err})") from None
    return cfg, trained_on


def read_saved_policy(path) -> tuple[PolicyConfig, TrainedOn]:
    """The check of a saved policy: (PolicyConfig, TrainedOn) of the folder ``path``, whose
    ``config.json`` must be a policy record and whose weights must be beside it; refused,
    naming the file, otherwise. No weights are read."""
    path = Path(path)
    cfg, trained_on = read_policy_record(path / POLICY_CONFIG)
    if not (path / POLICY_WEIGHTS).is_file():
        raise FileNotFoundError(f"{path}: no {POLICY_WEIGHTS} beside {POLICY_CONFIG}")
    return cfg, trained_on


def is_saved_policy(path) -> bool:
    """Whether ``path`` is a folder written by ``AVEXPolicy.save_pretrained`` (its two files,
    the record naming the format), as opposed to a ``python -m avex.train`` run directory."""
    path = Path(path)
    if not (path / POLICY_WEIGHTS).is_file() or not (path / POLICY_CONFIG).is_file():
        return False
    try:
        return json.loads((path / POLICY_CONFIG).read_text(encoding="utf-8")).get(
            "format") == POLICY_FORMAT
    except (ValueError, OSError, AttributeError):
        return False


def save_policy(policy, path) -> Path:
    """Write ``policy`` to the folder ``path``: ``config.json`` (its sizes and what it was
    trained on) and ``model.safetensors``; :func:`load_saved_policy` reads it back."""
    if policy.trained_on is None:
        raise ValueError("save_pretrained: the policy records nothing of what it was "
                         "trained on (policy.trained_on is None); set it to a TrainedOn, "
                         "or save the policy of a python -m avex.train run (avex.load_policy)")
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"save_pretrained: path {str(path)!r} is a file, not a directory")
    path.mkdir(parents=True, exist_ok=True)
    save_tensors_atomically(path / POLICY_WEIGHTS, cpu_state_dict(policy),
                            metadata={"format": "pt"})
    write_json_atomically(path / POLICY_CONFIG, policy_record(policy.config, policy.trained_on),
                          indent=2)
    return path


def load_saved_policy(cls, path, *, model=None, device=None):
    """The policy (of class ``cls``) that :func:`save_policy` wrote to ``path``, in eval mode.
    With ``model``, the model it will serve is checked against the record first."""
    device = _checks.placement("device", device)
    path = Path(path)
    cfg, trained_on = read_saved_policy(path)
    if model is not None:
        trained_on.check_model(model)
    policy = load_weights(cls(cfg), path / POLICY_WEIGHTS)
    policy.trained_on = trained_on
    return policy.to(device or "cpu").eval()
