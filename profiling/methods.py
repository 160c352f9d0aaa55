"""The methods the suite profiles, each run by the project's own code.

* ``full``: every token; ``avex``: the policy's scores, Top-K and compaction
  (:func:`avex.prune_inputs`);
* ``fastv``, ``tome``, ``fastav``, ``attention``: the selectors of :mod:`avex.methods`, called
  on a batch-1 :class:`~avex.captioner.frozen.AVBatch`, then the same compaction.

FastV-AV gets a copy of the LLM cut to its first K layers (weights shared, not copied):
``avex.methods._attention`` runs every layer of the model it is given, and the attention of
layer K-1 does not depend on the layers after it, so the cut model selects the same tokens for
K layers' work instead of all of them. FastAV needs the attention of the last layer, so it gets
the whole model (and its stage 1 runs every layer too, though it reads only the first E).
Attention-AV runs the whole model too: its full-token prefill with eager attention, through the
frozen captioner's own ``text_to_av_attention``.
"""
from __future__ import annotations

import copy
import types

import torch

from avex.modality import AUDIO, VISUAL
from avex.captioner import AVBatch, FrozenCaptioner
from avex.methods import (attention_selector, fastav_selector, fastv_selector, label,
                          tome_selector)
from avex.pruning import expand_av_keep, prune_inputs
from avex.selection import AVLayout

METHODS = ("full", "avex", "fastv", "tome", "fastav", "attention")
NAMES = {m: label(m) for m in METHODS}   # the labels of avex.methods' registry
FASTV_LAYER = 2   # avex.methods.fastv's default K
FASTAV_STAGE1_DROP = 0.5   # avex.methods.fastav's default, passed explicitly to it


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


class AttentionSource:
    """A bare LLM with the one captioner method Attention-AV calls: the frozen captioner's own
    ``text_to_av_attention`` (on an AVBatch it reads only ``self.model``)."""

    text_to_av_attention = FrozenCaptioner.text_to_av_attention

    def __init__(self, model):
        self.model = model


def baseline_selector(method: str, model, *, fastv_layer: int = FASTV_LAYER, **options):
    """The :mod:`avex.methods` selector for ``method`` on ``model`` (see the module
    docstring for the model each one is given)."""

    if method == "fastv":
        layer = min(fastv_layer, model.config.num_hidden_layers)
        cut = first_layers(model, layer)
        return fastv_selector(types.SimpleNamespace(model=cut), layer=layer), cut
    if method == "fastav":
        options.setdefault("stage1_drop", FASTAV_STAGE1_DROP)
        return fastav_selector(types.SimpleNamespace(model=model), **options), model
    if method == "tome":
        return tome_selector(**options), None
    if method == "attention":
        return attention_selector(AttentionSource(model), **options), model
    raise ValueError(f"method: {method!r} is not a baseline; baselines: fastv, tome, fastav, "
                     "attention")


def selection(method: str, model, policy, inputs_embeds, modality, retention: float):
    """A function ``(mark=None) -> PrunedInputs``: the method's scoring, selection and
    compaction of ``inputs_embeds`` [B, L, D] (``full``: compaction only; the baselines: batch
    1). AVEX calls ``mark("policy")`` once its policy has scored the tokens."""
    if method == "full":
        keep = modality >= 0
        return lambda mark=None: prune_inputs(inputs_embeds, modality, keep=keep)
    if method == "avex":
        def select(mark=None):
            scores = policy.score(inputs_embeds, modality)   # what serving runs
            if mark is not None:
                mark("policy")
            return prune_inputs(inputs_embeds, modality, scores=scores, retention=retention)
        return select
    if method not in METHODS:
        raise ValueError(f"methods: unknown method {method!r}; available: {list(METHODS)}")

    selector, _ = baseline_selector(method, model)
    batch = av_batch(inputs_embeds, modality)
    layout = AVLayout.of(modality)

    def select(mark=None):
        out = selector(batch, layout, retention)
        keep, embeds = (out.keep, out.inputs_embeds) if isinstance(out, tuple) else \
            (out, inputs_embeds)   # ToMe-AV returns merged embeddings with its keep-set
        return prune_inputs(embeds, modality, keep=expand_av_keep(keep, modality))
    return select
