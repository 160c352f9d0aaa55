"""The methods the suite profiles, each run by the project's own code.

* ``full``: every token; ``avex``: the policy's scores, Top-K and compaction
  (:func:`avex.prune_inputs`);
* the baselines, ``fastv``, ``tome``, ``fastav`` and ``attention``: the registry's selectors
  (:func:`avex.methods.make_selector`), called on a batch-1 :class:`~avex.captioner.frozen.AVBatch`,
  then the same compaction. Random's keep-set costs nothing beyond AVEX's compaction, and
  CaCoVID-AV is AVEX's policy with other weights, so neither is profiled apart.

FastV-AV gets a copy of the LLM cut to its first K layers (weights shared, not copied):
``avex.methods._attention`` runs every layer of the model it is given, and the attention of
layer K-1 does not depend on the layers after it, so the cut model selects the same tokens for
K layers' work instead of all of them. FastAV needs the attention of the last layer, so it gets
the whole model (and its stage 1 runs every layer too, though it reads only the first E).
Attention-AV runs the whole model too: its full-token prefill with eager attention, the frozen
captioner's own text-to-AV attention (:func:`avex.captioner.frozen.text_to_av_attention`).
"""
from __future__ import annotations

import copy
import functools

import torch

from avex.captioner import AVBatch
from avex.captioner.frozen import text_to_av_attention
from avex.methods import make_selector
from avex.methods.fastv import fastv_layer
from avex.modality import AUDIO, VISUAL
from avex.pruning import expand_av_keep, prune_inputs
from avex.registry import METHODS as REGISTRY
from avex.registry import label
from avex.selection import AVLayout, indices_to_keep

#: the registry's baselines: untrained selectors whose selection has a cost of its own
BASELINES = tuple(name for name, method in REGISTRY.items()
                  if method.train is None and name not in ("full", "random"))
#: what the suite profiles: full tokens, AVEX and the baselines (names and labels: the registry's)
PROFILED = ("full", "avex") + BASELINES
NAMES = {m: label(m) for m in PROFILED}


def av_batch(inputs_embeds: torch.Tensor, modality: torch.Tensor):
    """A batch-1 :class:`AVBatch` (no padding) around ``inputs_embeds`` [1, L, D]."""

    length = modality.shape[1]
    counts = [(int((modality == VISUAL).sum()), int((modality == AUDIO).sum()))]
    return AVBatch(inputs_embeds=inputs_embeds,
                   attention_mask=torch.ones_like(modality),
                   modality=modality,
                   position_ids=torch.arange(length, device=modality.device)[None],
                   clip_ids=["profile"], av_counts=counts)


def first_layers(model, layers: int):
    """``model`` cut to its first ``layers`` decoder layers, sharing every weight and the config
    with it (the attention modules read their implementation from that config)."""
    decoder = copy.copy(model.model)
    decoder._modules = dict(decoder._modules)   # copy.copy would share the submodule dict
    decoder.layers = torch.nn.ModuleList(list(model.model.layers)[:layers])
    cut = copy.copy(model)
    cut._modules = dict(cut._modules)
    cut.model = decoder
    return cut


def baseline_selector(method: str, model, **options):
    """(selector, model its selection runs or None) for ``method``, one of :data:`BASELINES`,
    on the LLM ``model`` (see the module docstring for the model each one is given)."""
    if method not in BASELINES:
        raise ValueError(f"method: {method!r} is not a baseline; baselines: "
                         f"{', '.join(BASELINES)}")
    if method == "fastv":
        layer = fastv_layer(model, options.pop("layer", None))
        cut = first_layers(model, layer)
        return make_selector("fastv", llm=cut, layer=layer, **options), cut
    if method == "attention":
        attention = functools.partial(text_to_av_attention, model)
        return make_selector("attention", attention=attention, **options), model
    return make_selector(method, llm=model, **options), model if method == "fastav" else None


def _policy_selection(policy, inputs_embeds, modality, retention: float):
    """AVEX's stages as serving runs them: the policy's scores (and hidden states, for a
    set-aware policy), then its own selection rule and the compaction."""
    layout = AVLayout.of(modality)

    def select(mark=None):
        if not policy.set_aware:
            scores = policy.score(inputs_embeds, modality, retention=retention)  # as served
            if mark is not None:
                mark("policy")
            return prune_inputs(inputs_embeds, modality, scores=scores, retention=retention)
        scores, hidden = policy.score(inputs_embeds, modality, retention=retention,
                                      with_hidden=True)
        if mark is not None:
            mark("policy")
        picks, _ = policy.select(layout.gather(scores), layout.gather_vectors(hidden),
                                 layout.budget(retention))
        keep = indices_to_keep(picks, layout.positions.shape[1])
        return prune_inputs(inputs_embeds, modality, keep=expand_av_keep(keep, modality))
    return select


def selection(method: str, model, policy, inputs_embeds, modality, retention: float):
    """A function ``(mark=None) -> PrunedInputs``: the method's scoring, selection and
    compaction of ``inputs_embeds`` [B, L, D] (``full``: compaction only; the baselines: batch
    1). AVEX calls ``mark("policy")`` once its policy has scored the tokens."""
    if method == "full":
        keep = modality >= 0
        return lambda mark=None: prune_inputs(inputs_embeds, modality, keep=keep)
    if method == "avex":
        return _policy_selection(policy, inputs_embeds, modality, retention)
    if method not in PROFILED:
        raise ValueError(f"methods: unknown method {method!r}; available: {list(PROFILED)}")

    selector, _ = baseline_selector(method, model)
    batch = av_batch(inputs_embeds, modality)
    layout = AVLayout.of(modality)

    def select(mark=None):
        out = selector(batch, layout, retention)
        keep, embeds = (out.keep, out.inputs_embeds) if isinstance(out, tuple) else \
            (out, inputs_embeds)   # ToMe-AV returns merged embeddings with its keep-set
        return prune_inputs(embeds, modality, keep=expand_av_keep(keep, modality))
    return select
