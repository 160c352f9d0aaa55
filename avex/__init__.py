"""AVEX-Prune: audio-visual exchange-aware token pruning for Video-LLMs.

Heavy modules (transformers, pycocoevalcap) load on first use, so ``import avex`` stays cheap.
"""
import importlib

__version__ = "0.1.0"

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
