"""Every token-selection method the toolkit compares, behind one interface.

A method is a *selector*::

    selector(batch, layout, retention) -> bool [B, M]            a keep-set on the AV axis
                                       | Selection(keep, inputs_embeds)

``batch`` is an :class:`avex.captioner.AVBatch`, ``layout`` its :class:`avex.selection.AVLayout`,
``retention`` rho in (0, 1]. Each row keeps exactly K = ``layout.budget(retention)`` AV tokens;
text is never on the AV axis, so it is never dropped. A merging method (ToMe-AV) also returns
replacement ``inputs_embeds`` [B, L, D]: the kept positions then carry the merged embeddings.

The registry, :data:`avex.registry.METHODS`, names every method once (its label, what its
selector is built from, the settings of a trained one); ``make_selector(name, ...)`` builds one.
"""
from __future__ import annotations

from avex.methods.attention import attention_selector
from avex.methods.fastav import fastav_selector
from avex.methods.fastv import fastv_selector
from avex.methods.learned import policy_selector
from avex.methods.random import random_selector
from avex.methods.tome import tome_selector
from avex.policy import load_policy
from avex.registry import METHODS, SELECTORS, Method, label
from avex.selection import Selection

#: what each need is, for the error that names a missing one
_NEEDS = {"llm": "the frozen LLM (llm=..., or captioner=...)",
          "attention": "a text-to-AV attention function (attention=..., or captioner=...)",
          "policy": "a trained policy (policy=...)"}


def make_selector(name: str, *, captioner=None, llm=None, attention=None, policy=None,
                  seed: int = 0, **options):
    """A selector for method ``name`` (one of :data:`~avex.registry.SELECTORS`), built from
    what it uses:

    * ``llm``, the frozen Hugging Face LLM: FastV-AV, FastAV (and ToMe-AV's ``features="keys"``);
    * ``attention``, a text-to-AV attention function ``batch -> [M_b] per row``: Attention-AV;
    * ``policy``, an :class:`~avex.policy.AVEXPolicy`: CaCoVID-AV and AVEX-Prune;
    * ``captioner``, a :class:`~avex.captioner.FrozenCaptioner`, supplies the first two (its
      ``model`` and its ``text_to_av_attention``) where they are not given.

    ``seed`` seeds Random; ``options`` go to the method's constructor."""
    if name not in SELECTORS:
        raise ValueError(f"method must be one of {list(SELECTORS)}, got {name!r}")
    if captioner is not None:
        llm = captioner.model if llm is None else llm
        attention = captioner.text_to_av_attention if attention is None else attention
    given = {"llm": llm, "attention": attention, "policy": policy}
    for need in METHODS[name].needs:
        if given[need] is None:
            raise ValueError(f"method {name!r} needs {_NEEDS[need]}")
    if name == "random":
        return random_selector(seed, **options)
    if name == "fastv":
        return fastv_selector(llm, **options)
    if name == "tome":
        return tome_selector(llm, **options)
    if name == "fastav":
        return fastav_selector(llm, **options)
    if name == "attention":
        return attention_selector(attention, **options)
    return policy_selector(policy, **options)


__all__ = ["Method", "METHODS", "SELECTORS", "Selection", "label", "make_selector",
           "random_selector", "fastv_selector", "tome_selector", "fastav_selector",
           "attention_selector",
           "policy_selector", "load_policy"]
