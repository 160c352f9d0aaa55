"""The baselines run on the batch's device (no host round trip timed as their own cost) and
select exactly what their first, host-side versions selected. The host-side versions are kept
here, verbatim in behaviour, as the oracles."""
import importlib
import math

import pytest
import torch

from avex.captioner import FrozenCaptioner
from avex.data import FeatureCache
from avex.methods import Selection, make_selector
from avex.methods._attention import head_averaged_attentions
from avex.methods.fastav import attention_rollout
from avex.methods.tome import merge_modality
from avex.pruning import expand_av_keep, prune_inputs
from avex.selection import AVLayout, topk_keep

tome = importlib.import_module("avex.methods.tome")


# --- the host-side versions (oracles) ----------------------------------------------------------

def topk_keep_per_row(scores, budget):
    keep = torch.zeros_like(scores, dtype=torch.bool)
    for row in range(scores.shape[0]):
        k = int(budget[row])
        if k <= 0:
            continue
        s = scores[row].double()
        order = torch.sort(-s, stable=True).indices
        valid = order[torch.isfinite(s[order])]
        keep[row, valid[:k]] = True
    return keep


def fastav_on_host(captioner, batch, layout, retention, rollout_layers, late_layer, drop):
    budget = layout.budget(retention).cpu()
    counts = layout.counts.cpu()
    atts = head_averaged_attentions(captioner.model, batch.inputs_embeds, batch.attention_mask,
                                    batch.position_ids, upto=rollout_layers)
    scores1 = layout.gather(attention_rollout(atts)[:, -1, :]).cpu()
    k1 = torch.tensor([n - math.ceil(drop * (n - k))
                       for k, n in zip(budget.tolist(), counts.tolist())])
    keep1 = topk_keep_per_row(scores1, k1)
    pruned = prune_inputs(batch.inputs_embeds, batch.modality,
                          keep=expand_av_keep(keep1, batch.modality))
    att2 = head_averaged_attentions(captioner.model, pruned.inputs_embeds, pruned.attention_mask,
                                    pruned.position_ids, upto=late_layer)[late_layer - 1]
    width = batch.modality.shape[1]
    per_position = torch.full(batch.modality.shape, float("-inf"))
    index, last = pruned.index.cpu(), att2[:, -1, :].cpu()
    for row in range(len(index)):
        valid = index[row] >= 0
        per_position[row, index[row][valid] - row * width] = last[row][valid]
    scores2 = layout.gather(per_position).cpu().masked_fill(~keep1, float("-inf"))
    return topk_keep_per_row(scores2, budget)


def apply_merges_one_by_one(values, feats, sizes, a, b):
    """ToMe-AV's first version of a round's merges: a Python loop, one merge at a time."""
    for src, dst in zip(a.tolist(), b.tolist()):
        total = sizes[src] + sizes[dst]
        values[dst] = (values[dst] * sizes[dst] + values[src] * sizes[src]) / total
        feats[dst] = (feats[dst] * sizes[dst] + feats[src] * sizes[src]) / total
        sizes[dst] = total


# --- the tests --------------------------------------------------------------------------------

def test_batched_topk_keep_equals_the_per_row_loop():
    gen = torch.Generator().manual_seed(0)
    for trial in range(30):
        batch, width = 1 + trial % 5, 1 + (trial * 7) % 40
        scores = (torch.randn(batch, width, generator=gen) * 2).round() / 2  # many ties
        special = torch.rand(batch, width, generator=gen)
        scores[special < 0.1] = float("-inf")  # padding; NaN, +inf and budgets < 0 are refused
        budget = torch.randint(0, width + 2, (batch,), generator=gen)
        assert torch.equal(topk_keep(scores, budget), topk_keep_per_row(scores, budget))


@pytest.mark.parametrize("duplicates", [False, True])
def test_tome_merges_equal_the_per_merge_loop(duplicates, monkeypatch):
    """Bit-identical survivors and merged values, also where tokens repeat exactly (ties in
    similarity, and several sources merging into one destination)."""
    gen = torch.Generator().manual_seed(1)
    for trial in range(20):
        n, dim = 3 + trial * 3, 6
        x = torch.randn(n, dim, generator=gen)
        if duplicates:  # dense, redundant tokens: a few distinct vectors repeated
            x = x[torch.randint(0, 3, (n,), generator=gen)]
        feats = x + 0.0 if trial % 2 else torch.randn(n, 4, generator=gen)
        for target in (1, n // 3 + 1, n - 1):
            got = merge_modality(x, feats, target)
            with monkeypatch.context() as patch:
                patch.setattr(tome, "_apply_merges", apply_merges_one_by_one)
                want = merge_modality(x, feats, target)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.fixture(scope="module")
def tiny(tiny_benchmark, tiny_captioner):
    captioner = FrozenCaptioner.load(tiny_captioner, device="cpu")
    test = FeatureCache(tiny_benchmark).split("test")
    return captioner, [test[i] for i in range(len(test))]


@pytest.mark.parametrize("retention", [0.5, 0.2])
def test_device_side_baselines_select_what_the_host_side_ones_did(tiny, retention):
    captioner, clips = tiny
    batch = captioner.embed(clips[:6])
    layout = AVLayout.of(batch.modality)
    for drop in (0.5, 0.0, 1.0):
        got = make_selector("fastav", captioner=captioner, stage1_drop=drop)(batch, layout,
                                                                           retention)
        depth = captioner.model.config.num_hidden_layers
        want = fastav_on_host(captioner, batch, layout, retention, max(1, depth // 2), depth,
                              drop)
        assert torch.equal(got, want), drop
    fastv = make_selector("fastv", captioner=captioner)
    att = head_averaged_attentions(captioner.model, batch.inputs_embeds, batch.attention_mask,
                                   batch.position_ids, upto=fastv.layer)[fastv.layer - 1]
    want = topk_keep_per_row(layout.gather(att[:, -1, :]), layout.budget(retention))
    assert torch.equal(fastv(batch, layout, retention), want)
    tome = make_selector("tome", captioner=captioner)(batch, layout, retention)
    assert isinstance(tome, Selection) and torch.equal(tome.keep.sum(1),
                                                        layout.budget(retention))
