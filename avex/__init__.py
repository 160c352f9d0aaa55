"""AVEX-Prune: audio-visual exchange-aware token pruning for Video-LLMs.

Heavy modules (transformers, pycocoevalcap) load on first use, so ``import avex`` stays cheap.
"""
import importlib
import sys
from pathlib import Path

__version__ = "0.1.0"


def _unshadow_checkout_root() -> None:
    """Take a source checkout's root off ``sys.path``.

    ``python -m`` (``python -m avex.train``, ``python -m pytest``) run from the checkout puts
    its root first on ``sys.path``. There the top-level ``kernels/`` and ``profiling/`` folders,
    installed as ``avex.kernels`` and ``avex.profiling``, would be found as PyPI's ``kernels``
    and ``profiling``; transformers 5.25 depends on PyPI's ``kernels`` and imports it. avex
    itself is imported from its installation (``pip install -e .`` maps the folders), so the
    root is not needed as an import root.
    """
    root = Path(__file__).resolve().parent.parent
    if not ((root / "setup.py").is_file() and (root / "kernels" / "gumbel_topk_host.c").is_file()):
        return   # an installed wheel: no checkout here
    sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != root]
    for name in ("kernels", "profiling"):   # imported from the checkout before avex was
        module = sys.modules.get(name)
        if module is not None and Path(getattr(module, "__file__", None) or "/").resolve() \
                .is_relative_to(root / name):
            del sys.modules[name]


_unshadow_checkout_root()

# public name -> module that defines it
_LAZY = {
    "gumbel_topk": "avex.kernels",
    "plackett_luce_log_prob": "avex.kernels",
    "build_exchanges": "avex.kernels",
    "compact": "avex.kernels",
    "prune_inputs": "avex.pruning",
    "generate": "avex.pruning",
    "PrunedInputs": "avex.pruning",
    "expand_av_keep": "avex.pruning",
    "PAD": "avex.modality",
    "VISUAL": "avex.modality",
    "AUDIO": "avex.modality",
    "TEXT": "avex.modality",
    "FeatureCache": "avex.data",
    "CacheWriter": "avex.data",
    "FrozenCaptioner": "avex.captioner",
    "AVEXPolicy": "avex.policy",
    "TrainedOn": "avex.policy",
    "load_policy": "avex.policy",
    "CiderD": "avex.reward",
    "caption_metrics": "avex.metrics",
    "caption_metrics_by_reference_type": "avex.metrics",
}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'avex' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__():
    return sorted(list(globals()) + list(_LAZY))
