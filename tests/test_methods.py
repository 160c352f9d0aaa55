"""Every baseline on the tiny benchmark: exact budget, text never dropped, determinism, the
ToMe merge arithmetic, FastV's scores against a direct computation, errors that name the bad
argument."""
import dataclasses

import pytest
import torch

from avex.methods import SELECTORS, Selection, make_selector
from avex.evaluate.ablation import ABLATIONS, own_warmup, scored_checkpoint
from avex.training.config import TrainConfig
from avex.methods.fastav import attention_rollout
from avex.methods.learned import recipe
from avex.methods.tome import merge_modality
from avex.captioner import FrozenCaptioner
from avex.data import FeatureCache
from avex.scoring import caption_split
from avex.policy import AVEXPolicy
from avex.pruning import TEXT, expand_av_keep
from avex.registry import METHODS
from avex.selection import AVLayout, split_budget, topk_keep


@pytest.fixture(scope="module")
def tiny(tiny_benchmark, tiny_captioner):
    captioner = FrozenCaptioner.load(tiny_captioner, device="cpu")
    cache = FeatureCache(tiny_benchmark)
    test = cache.split("test")
    clips = [test[i] for i in range(len(test))]
    torch.manual_seed(0)
    policy = AVEXPolicy.from_llm(captioner.model).eval()
    return captioner, clips, policy


def _selectors(captioner, policy):
    return {name: make_selector(name, captioner=captioner, policy=policy, seed=5)
            for name in SELECTORS}


@pytest.mark.parametrize("retention", [1.0, 0.5, 0.3, 0.1, 0.01])
def test_every_method_keeps_exactly_the_budget(tiny, retention):
    captioner, clips, policy = tiny
    # uneven rows: drop AV tokens from one clip so rows differ in length and are padded
    short = dataclasses.replace(clips[1], visual=clips[1].visual[:20], audio=clips[1].audio[:5])
    batch = captioner.embed([clips[0], short, clips[2]])
    layout = AVLayout.of(batch.modality)
    budget = layout.budget(retention)
    for name, select in _selectors(captioner, policy).items():
        out = select(batch, layout, retention)
        keep = out.keep if isinstance(out, Selection) else out
        assert keep.dtype == torch.bool and keep.shape == layout.modality.shape, name
        assert torch.equal(keep.sum(1), budget), (name, keep.sum(1), budget)
        assert not (keep & (layout.modality < 0)).any(), f"{name} kept padding"
        # on the sequence layout: every text token survives
        seq = expand_av_keep(keep, batch.modality)
        assert seq[batch.modality == TEXT].all(), name


def test_methods_are_deterministic_and_random_follows_its_seed(tiny):
    captioner, clips, policy = tiny
    batch = captioner.embed(clips[:4])
    layout = AVLayout.of(batch.modality)
    for name in SELECTORS:
        a = make_selector(name, captioner=captioner, policy=policy, seed=1)(batch, layout, 0.3)
        b = make_selector(name, captioner=captioner, policy=policy, seed=1)(batch, layout, 0.3)
        ka = a.keep if isinstance(a, Selection) else a
        kb = b.keep if isinstance(b, Selection) else b
        assert torch.equal(ka, kb), name
        if isinstance(a, Selection):
            assert torch.equal(a.inputs_embeds, b.inputs_embeds)
    r1 = make_selector("random", seed=1)(batch, layout, 0.3)
    r2 = make_selector("random", seed=2)(batch, layout, 0.3)
    assert not torch.equal(r1, r2)


def test_fastv_scores_are_the_last_tokens_attention_at_layer_k_minus_1(tiny):
    captioner, clips, _ = tiny
    batch = captioner.embed(clips[:3])
    layout = AVLayout.of(batch.modality)
    model = captioner.model
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        out = model(inputs_embeds=batch.inputs_embeds, attention_mask=batch.attention_mask,
                    position_ids=batch.position_ids, output_attentions=True)
    finally:
        model.set_attn_implementation(previous)
    assert model.config.num_hidden_layers == 1  # the tiny captioner
    for layer in (1,):
        scores = layout.gather(out.attentions[layer - 1].mean(1)[:, -1, :])
        expected = topk_keep(scores, layout.budget(0.25))
        got = make_selector("fastv", captioner=captioner, layer=layer)(batch, layout, 0.25)
        assert torch.equal(got, expected), layer


def test_tome_merges_by_size_weighted_mean_at_destination_positions():
    # four tokens: 0 ~ 1 and 2 ~ 3; alternate split A = {0, 2}, B = {1, 3}
    x = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]])
    alive, merged = merge_modality(x, x, 2)
    assert alive.tolist() == [1, 3]
    torch.testing.assert_close(merged, torch.tensor([[0.95, 0.05], [0.05, 0.95]]))
    # down to one token takes two rounds (one round merges at most half); sizes weight the mean
    alive, merged = merge_modality(x, x, 1)
    assert len(alive) == 1
    torch.testing.assert_close(merged[0], x.mean(0))


def test_tome_selection_carries_merged_embeddings(tiny):
    captioner, clips, _ = tiny
    batch = captioner.embed(clips[:2])
    layout = AVLayout.of(batch.modality)
    out = make_selector("tome")(batch, layout, 0.25)
    assert isinstance(out, Selection)
    changed = (out.inputs_embeds != batch.inputs_embeds).any(-1)  # [B, L]
    kept_positions = expand_av_keep(out.keep, batch.modality) & (batch.modality != TEXT)
    assert changed.any() and not (changed & ~kept_positions).any()
    # each modality merged within itself: visual and audio shares as split_budget says
    for row in range(2):
        mod = layout.modality[row]
        kv, ka = split_budget(int(layout.budget(0.25)[row]), int((mod == 0).sum()),
                              int((mod == 1).sum()))
        assert int(out.keep[row][mod == 0].sum()) == kv and int(out.keep[row][mod == 1].sum()) == ka
    keys = make_selector("tome", captioner=captioner, features="keys")(batch, layout, 0.25)
    assert torch.equal(keys.keep.sum(1), layout.budget(0.25))


def test_rollout_rows_stay_stochastic_and_mix_the_residual():
    att = torch.softmax(torch.randn(2, 5, 5), -1)
    r = attention_rollout([att, att])
    torch.testing.assert_close(r.sum(-1), torch.ones(2, 5))
    one = attention_rollout([att])
    torch.testing.assert_close(one, 0.5 * att + 0.5 * torch.eye(5))


def test_caption_split_runs_every_method(tiny):
    captioner, clips, policy = tiny
    for name, select in _selectors(captioner, policy).items():
        captions = caption_split(captioner, clips[:4], select, 0.3, batch_size=3,
                                 max_new_tokens=6)
        assert len(captions) == 4 and all(isinstance(c, str) for c in captions), name


def test_bad_arguments_name_themselves(tiny):
    captioner, clips, policy = tiny
    batch = captioner.embed(clips[:1])
    layout = AVLayout.of(batch.modality)
    with pytest.raises(ValueError, match="method must be one of .* got 'fastvv'"):
        make_selector("fastvv", captioner=captioner)
    with pytest.raises(ValueError, match=r"needs the frozen LLM \(llm=\.\.\., or captioner=\.\.\.\)"):
        make_selector("fastv")
    with pytest.raises(ValueError, match="needs a trained policy"):
        make_selector("avex")
    with pytest.raises(ValueError, match="layer must be <= the LLM's 1 layers, got 2"):
        make_selector("fastv", captioner=captioner, layer=2)
    with pytest.raises(ValueError, match="features must be one of"):
        make_selector("tome", features="values")
    for name in SELECTORS:
        with pytest.raises(ValueError, match=r"retention must be in \(0, 1\], got 1.5"):
            make_selector(name, captioner=captioner, policy=policy)(batch, layout, 1.5)
    with pytest.raises(FileNotFoundError, match="path: no run directory"):
        from avex.methods import load_policy
        load_policy("/no/such/run", captioner)


def test_split_budget():
    assert split_budget(10, 32, 8) == (8, 2)
    assert split_budget(2, 60, 4) == (1, 1)      # audio gets one even when round() says 0
    assert split_budget(1, 32, 8) == (1, 0)
    assert split_budget(5, 0, 8) == (0, 5)


def test_fastav_stage_shares(tiny):
    """stage1_drop=1: the rollout alone decides (it equals FastV at K = 1 on a one-layer LLM,
    since a one-layer rollout row is 0.5 A + 0.5 e_last); stage1_drop=0: stage 2 alone."""
    captioner, clips, _ = tiny
    batch = captioner.embed(clips[:3])
    layout = AVLayout.of(batch.modality)
    fastv = make_selector("fastv", captioner=captioner, layer=1)(batch, layout, 0.2)
    for drop in (1.0, 0.0):
        got = make_selector("fastav", captioner=captioner, stage1_drop=drop)(batch, layout, 0.2)
        assert torch.equal(got, fastv), drop
    with pytest.raises(ValueError, match=r"stage1_drop must be in \[0, 1\], got 2"):
        make_selector("fastav", captioner=captioner, stage1_drop=2)


def test_attention_av_keeps_the_most_attended_tokens_of_each_modality(tiny):
    """Attention-AV: K_a = round(K Na / N) audio tokens, and within each modality every kept
    token has at least the full-prefill text-to-AV attention of every dropped one."""
    captioner, clips, _ = tiny
    short = dataclasses.replace(clips[1], visual=clips[1].visual[:20], audio=clips[1].audio[:5])
    rows = [clips[0], short, clips[2]]
    batch = captioner.embed(rows)
    layout = AVLayout.of(batch.modality)
    attention = captioner.text_to_av_attention(batch)
    for retention in (0.5, 0.3, 0.1):
        keep = make_selector("attention", captioner=captioner)(batch, layout, retention)
        budget = layout.budget(retention)
        for row, clip in enumerate(rows):
            nv, na = clip.n_visual, clip.n_audio
            kv, ka = split_budget(int(budget[row]), nv, na)
            kept, weights = keep[row, :nv + na], attention[row]
            assert int(kept[:nv].sum()) == kv and int(kept[nv:].sum()) == ka
            for span in (slice(0, nv), slice(nv, nv + na)):
                k, w = kept[span], weights[span]
                if k.any() and (~k).any():
                    assert w[k].min() >= w[~k].max()


def test_a_runs_recipe_names_its_estimator_exchange_term_reward_selection_and_teacher():
    assert recipe({"warmup_only": True}) == "warmup only"
    # a run from before the reward and selection settings reads as CIDEr and Top-K
    assert recipe({"anchors": 8}) == "RLOO over 8 anchors, no exchange term"
    assert recipe({"anchors": 4, "exchanges": True, "lambda_ex": 0.1, "reward": "cider",
                   "selection": "topk"}) == \
        "RLOO over 4 anchors + exchange term, lambda_ex 0.1"
    assert recipe({"anchors": 8, "reward": "fidelity", "selection": "set-aware",
                   "redundancy": 4.0}) == ("RLOO over 8 anchors, no exchange term, fidelity "
                                           "reward, set-aware selection (redundancy 4)")
    # the warmup's teacher, where it is not the prompt's attention (runs from before the setting)
    assert recipe({"anchors": 8, "warmup_teacher": "caption-attention"}) == \
        "RLOO over 8 anchors, no exchange term, caption-attention warmup"
    assert recipe({"anchors": 8, "warmup_teacher": "prompt-attention"}) == \
        "RLOO over 8 anchors, no exchange term"


def test_every_arm_pins_its_reward_and_selection_and_cacovid_its_reward():
    """An arm (and the CaCoVID-AV baseline) trains what it was defined as, whatever the
    recipe's defaults: each names its reward and selection."""
    for name, (_, _, settings) in ABLATIONS.items():
        assert {"reward", "selection", "redundancy"} <= set(settings), name
    assert ABLATIONS["A"][2]["reward"] == "cider" and ABLATIONS["A-fid"][2]["reward"] == "fidelity"
    assert ABLATIONS["D-fid"][2]["selection"] == "set-aware"
    # E-fid is D-fid but for RL's retention draw, which weights 10% three in seven
    e, d = ABLATIONS["E-fid"][2], ABLATIONS["D-fid"][2]
    assert {k: v for k, v in e.items() if k != "train_retentions"} == d
    assert sorted(e["train_retentions"]) == [0.1, 0.1, 0.1, 0.2, 0.3, 0.4, 0.5]
    TrainConfig(**e).validate()
    # D8-fid differs from D-fid in the redundancy alone, C10-fid from C-fid in E's draw alone
    assert {**ABLATIONS["D8-fid"][2], "redundancy": 4.0} == d
    assert {**ABLATIONS["C10-fid"][2], "train_retentions": ABLATIONS["C-fid"][2].get(
        "train_retentions")} == {**ABLATIONS["C-fid"][2], "train_retentions": None}
    assert ABLATIONS["C10-fid"][2]["train_retentions"] == e["train_retentions"]
    # Dc-fid is D-fid from a caption-attention warmup of its own, scored at its last checkpoint
    assert {**ABLATIONS["Dc-fid"][2], "warmup_teacher": "prompt-attention"} == \
        {**d, "warmup_teacher": "prompt-attention"}
    assert own_warmup("Dc-fid") and scored_checkpoint("Dc-fid") == "latest"
    assert own_warmup("warmup-capattn") and scored_checkpoint("warmup-capattn") == "warmup"
    assert not own_warmup("D-fid") and scored_checkpoint("D-fid") == "latest"
    # Cc-fid, Dc-fid's control, is C-fid from the same kind of warmup
    assert ABLATIONS["Cc-fid"][2] == {**ABLATIONS["C-fid"][2], "warmup_teacher": "caption-attention"}
    assert own_warmup("Cc-fid") and scored_checkpoint("Cc-fid") == "latest"
    assert ABLATIONS["A"][2]["selection"] == "topk"
    assert METHODS["cacovid"].train["reward"] == "cider"
    assert METHODS["cacovid"].train["selection"] == "topk"
