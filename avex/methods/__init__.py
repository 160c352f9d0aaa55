"""Every token-selection method the toolkit compares, behind one interface and one registry.

A method is a *selector*::

    selector(batch, layout, retention) -> bool [B, M]            a keep-set on the AV axis
                                       | Selection(keep, inputs_embeds)

``batch`` is an :class:`avex.captioner.AVBatch`, ``layout`` its :class:`avex.selection.AVLayout`,
``retention`` rho in (0, 1]. Each row keeps exactly K = ``layout.budget(retention)`` AV tokens;
text is never on the AV axis, so it is never dropped. A merging method (ToMe-AV) also returns
replacement ``inputs_embeds`` [B, L, D]: the kept positions then carry the merged embeddings.

:data:`METHODS` names every method once; the sweep, the ablation, training's own table and the
profiling suite all print these labels. ``make_selector(name, ...)`` builds one.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from avex.methods.attention import attention_selector
from avex.methods.fastav import fastav_selector
from avex.methods.fastv import fastv_selector
from avex.methods.learned import load_policy, policy_selector
from avex.methods.random import random_selector
from avex.methods.tome import tome_selector
from avex.selection import Selection


@dataclass(frozen=True)
class Method:
    label: str                   # what every table prints
    needs: tuple = ()            # "captioner" (the frozen LLM) or "policy" (a trained policy)
    seeded: bool = False         # the selection depends on a seed (Random, trained policies)
    train: dict | None = None    # trained methods: TrainConfig fields that define the method
    options: dict = field(default_factory=dict)


#: method name -> Method. "full" is the reference row every table starts with.
METHODS = {
    "full": Method("Full tokens"),
    "random": Method("Random", seeded=True),
    "fastv": Method("FastV-AV", ("captioner",)),
    "tome": Method("ToMe-AV"),
    "fastav": Method("FastAV", ("captioner",)),
    "attention": Method("Attention-AV (balanced)", ("captioner",)),
    # CaCoVID's set-level reward at the matched budget (issue #25): 8 sampled sets per clip,
    # as AVEX-Prune captions per step, with a group-normalised advantage
    "cacovid": Method("CaCoVID-AV", ("policy",), seeded=True,
                      train={"exchanges": False, "rl_estimator": "group", "anchors": 8}),
    "avex": Method("AVEX-Prune", ("policy",), seeded=True, train={}),
}
#: the methods that select a subset (every one but "full")
SELECTORS = tuple(name for name in METHODS if name != "full")


def label(name: str) -> str:
    """The printed name of method ``name``."""
    return METHODS[name].label


def make_selector(name: str, *, captioner=None, policy=None, seed: int = 0, **options):
    """A selector for method ``name`` (one of :data:`SELECTORS`).

    ``captioner`` (a :class:`~avex.captioner.FrozenCaptioner`) is needed by FastV-AV, FastAV
    and Attention-AV, ``policy`` (an :class:`~avex.policy.AVEXPolicy`) by CaCoVID-AV and
    AVEX-Prune;
    ``seed`` seeds Random; ``options`` go to the method's constructor."""
    if name not in SELECTORS:
        raise ValueError(f"method must be one of {list(SELECTORS)}, got {name!r}")
    needs = METHODS[name].needs
    if "captioner" in needs and captioner is None:
        raise ValueError(f"method {name!r} needs the frozen captioner (captioner=...)")
    if "policy" in needs and policy is None:
        raise ValueError(f"method {name!r} needs a trained policy (policy=...)")
    if name == "random":
        return random_selector(seed, **options)
    if name == "fastv":
        return fastv_selector(captioner, **options)
    if name == "tome":
        return tome_selector(captioner=captioner, **options)
    if name == "fastav":
        return fastav_selector(captioner, **options)
    if name == "attention":
        return attention_selector(captioner, **options)
    return policy_selector(policy, **options)


__all__ = ["Method", "METHODS", "SELECTORS", "Selection", "label", "make_selector",
           "random_selector", "fastv_selector", "tome_selector", "fastav_selector",
           "attention_selector",
           "policy_selector", "load_policy"]
