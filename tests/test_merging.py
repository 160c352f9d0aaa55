"""Merging the dropped tokens into the kept ones they duplicate (avex/merging.py): the function
against a token-by-token reference, and the setting wherever a saved policy serves."""
import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

import avex
from avex.merging import merge_dropped
from avex.methods.learned import policy_selector
from avex.policy import PolicyConfig
from avex.pruning import (AUDIO, PAD, TEXT, VISUAL, expand_av_keep, item_index, prune_inputs,
                          select_keep)
from avex.selection import AVLayout, Selection
from avex.train import main as train_main
from avex.training.config import TrainConfig, build_parser, resolve_config
from test_set_selection import saved_policy, tiny_llm


def reference(embeds, modality, keep, threshold, groups=None):
    """Token by token, in float64: each dropped AV token's most similar kept token of its
    group (the earliest on a tie) takes it in when the cosine is >= threshold."""
    groups = modality if groups is None else groups
    out = embeds.clone()
    for row in range(embeds.shape[0]):
        av = [i for i in range(embeds.shape[1]) if int(modality[row, i]) in (VISUAL, AUDIO)]
        kept = [i for i in av if keep[row, i]]
        members = {i: [i] for i in kept}
        for j in (i for i in av if not keep[row, i]):
            best, into = None, None
            for i in kept:
                if groups[row, i] != groups[row, j]:
                    continue
                sim = F.cosine_similarity(embeds[row, i].double(), embeds[row, j].double(),
                                          dim=0, eps=1e-12).item()
                if best is None or sim > best:
                    best, into = sim, i
            if best is not None and best >= threshold:
                members[into].append(j)
        for i, group in members.items():
            if len(group) > 1:
                out[row, i] = embeds[row, group].double().mean(0).to(embeds.dtype)
    return out


def random_case(seed, rows=4, width=23, dim=6, dtype=torch.float64, duplicates=True):
    """Ragged rows (left padding), text between the modalities, kept sets of every size
    (none and all in some rows), and near-duplicates so that thresholds bite."""
    g = torch.Generator().manual_seed(seed)
    layout = [TEXT] * 2 + [VISUAL] * 11 + [TEXT] + [AUDIO] * (width - 14 - 2) + [TEXT] * 2
    modality = torch.tensor([[PAD] * r + layout[:width - r] for r in range(rows)])
    embeds = torch.randn(rows, width, dim, generator=g, dtype=dtype)
    if duplicates:   # every third token a noisy copy of its left neighbour
        embeds[:, 1::3] = embeds[:, 0:-1:3][:, :embeds[:, 1::3].shape[1]] \
            + 0.1 * torch.randn(embeds[:, 1::3].shape, generator=g, dtype=dtype)
    keep = torch.rand(rows, width, generator=g) < torch.linspace(0.0, 1.0, rows)[:, None]
    return embeds, modality, keep


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("threshold", [-1.0, 0.0, 0.5, 0.9, 1.0])
def test_merge_dropped_matches_the_reference(seed, threshold):
    embeds, modality, keep = random_case(seed)
    got = merge_dropped(embeds, modality, keep, threshold)
    assert torch.allclose(got, reference(embeds, modality, keep, threshold), atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lower_precision_inputs_are_merged_in_float32_and_cast_back(dtype):
    embeds, modality, keep = random_case(7)
    got = merge_dropped(embeds.to(dtype), modality, keep, 0.5)
    assert got.dtype == dtype
    want = reference(embeds.to(dtype).double(), modality, keep, 0.5)
    assert torch.allclose(got.double(), want, atol=2e-2 if dtype == torch.bfloat16 else 1e-5)


def test_only_kept_av_tokens_change_and_only_within_their_group():
    embeds, modality, keep = random_case(3, rows=3)
    got = merge_dropped(embeds, modality, keep, -1.0)   # every dropped token joins somewhere
    av = (modality == VISUAL) | (modality == AUDIO)
    assert torch.equal(got[~(av & keep)], embeds[~(av & keep)])
    assert torch.allclose(got, reference(embeds, modality, keep, -1.0), atol=1e-12)
    # a kept token is the mean of its own modality's tokens only: visual and audio apart
    split = modality.clone()
    split[modality == AUDIO] = VISUAL   # one group for both: the means change
    assert not torch.allclose(merge_dropped(embeds, modality, keep, -1.0, groups=split), got)
    # groups: each token its own group leaves everything as it was
    alone = torch.arange(embeds.shape[1]).expand(embeds.shape[0], -1)
    assert torch.equal(merge_dropped(embeds, modality, keep, -1.0, groups=alone), embeds)


def test_ties_go_to_the_earliest_kept_token_and_exact_copies_merge_at_threshold_1():
    base = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    embeds = torch.stack([base, base * 2, torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64),
                          base])[None]
    modality = torch.full((1, 4), VISUAL)
    keep = torch.tensor([[True, True, True, False]])
    got = merge_dropped(embeds, modality, keep, 1.0 - 1e-9)
    assert torch.allclose(got[0, 0], base) and torch.equal(got[0, 1], embeds[0, 1])
    # the copy joined token 0 (the earliest of the two at cosine 1), whose mean is itself
    later_first = merge_dropped(embeds[:, [1, 0, 2, 3]], modality, keep, 1.0 - 1e-9)
    assert torch.allclose(later_first[0, 0], (base * 2 + base) / 2)


def test_nothing_kept_or_nothing_dropped_changes_nothing():
    embeds, modality, _ = random_case(1)
    for keep in (torch.zeros_like(modality, dtype=torch.bool),
                 torch.ones_like(modality, dtype=torch.bool)):
        assert torch.equal(merge_dropped(embeds, modality, keep, -1.0), embeds)


def test_chunks_of_dropped_tokens_give_the_whole_answer(monkeypatch):
    embeds, modality, keep = random_case(4, rows=2)
    whole = merge_dropped(embeds, modality, keep, 0.3)
    monkeypatch.setattr("avex.merging._CHUNK", 2)
    assert torch.equal(merge_dropped(embeds, modality, keep, 0.3), whole)


def test_bad_input_is_refused_naming_the_argument():
    embeds, modality, keep = random_case(0)
    with pytest.raises(ValueError, match="threshold"):
        merge_dropped(embeds, modality, keep, 1.5)
    with pytest.raises(TypeError, match="threshold"):
        merge_dropped(embeds, modality, keep, "0.5")
    with pytest.raises(TypeError, match="keep"):
        merge_dropped(embeds, modality, keep.long(), 0.5)
    with pytest.raises(ValueError, match=r"keep has shape \[4, 22\]"):
        merge_dropped(embeds, modality, keep[:, 1:], 0.5)
    with pytest.raises(TypeError, match="inputs_embeds"):
        merge_dropped(embeds.long(), modality, keep, 0.5)
    with pytest.raises(ValueError, match="groups"):
        merge_dropped(embeds, modality, keep, 0.5, groups=modality[:, 1:])


# ----------------------------------------------------------------------------------------------
# the setting: policy, artifact, serving paths, training config
# ----------------------------------------------------------------------------------------------

def av_batch(rows=3):
    torch.manual_seed(1)
    layout = [TEXT] * 3 + [VISUAL] * 12 + [AUDIO] * 5 + [TEXT] * 2
    modality = torch.tensor([layout] + [[PAD] * r + layout[:len(layout) - r]
                                        for r in range(1, rows)])
    embeds = torch.randn(rows, len(layout), 32)
    embeds[:, 4:15:2] = embeds[:, 3:14:2] + 0.05 * torch.randn(rows, 6, 32)  # near-copies
    return embeds, modality


def test_the_artifact_keeps_the_threshold_and_every_serving_path_merges(tmp_path):
    llm = tiny_llm()
    saved_policy(llm, tmp_path / "p", selection="set-aware", redundancy=3.0,
                 merge_threshold=0.8)
    assert json.loads((tmp_path / "p" / "config.json").read_text())["policy"][
        "merge_threshold"] == 0.8
    policy = avex.load_policy(tmp_path / "p", model=llm)
    assert policy.config.merge_threshold == 0.8
    embeds, modality = av_batch()
    layout = AVLayout.of(modality)
    merged_any = False
    for retention in (0.2, 0.5):
        kept = select_keep(embeds, modality, policy=policy, retention=retention)
        want = merge_dropped(embeds, modality, kept, 0.8)
        merged_any |= not torch.equal(want, embeds)
        pruned = prune_inputs(embeds, modality, policy=policy, retention=retention)
        plain = prune_inputs(want, modality, keep=kept | (modality == TEXT))
        assert torch.equal(pruned.inputs_embeds, plain.inputs_embeds)
        assert torch.equal(pruned.keep, plain.keep)
        batch = type("Batch", (), {"inputs_embeds": embeds, "modality": modality})()
        chosen = policy_selector(policy)(batch, layout, retention)
        assert isinstance(chosen, Selection)
        assert torch.equal(expand_av_keep(chosen.keep, modality) & (modality != TEXT), kept)
        assert torch.equal(chosen.inputs_embeds, want)
    assert merged_any
    # per item: merged within each item only
    kept = select_keep(embeds, modality, policy=policy, retention=0.3, per_item=True)
    pruned = prune_inputs(embeds, modality, policy=policy, retention=0.3, per_item=True)
    want = merge_dropped(embeds, modality, kept, 0.8, groups=item_index(modality))
    assert torch.equal(pruned.inputs_embeds,
                       prune_inputs(want, modality, keep=kept | (modality == TEXT)).inputs_embeds)


def test_without_a_threshold_nothing_changes_and_the_record_omits_it(tmp_path):
    llm = tiny_llm()
    saved_policy(llm, tmp_path / "p")
    record = json.loads((tmp_path / "p" / "config.json").read_text())
    assert "merge_threshold" not in record["policy"]   # what a reader from before reads
    policy = avex.load_policy(tmp_path / "p", model=llm)
    embeds, modality = av_batch()
    layout = AVLayout.of(modality)
    batch = type("Batch", (), {"inputs_embeds": embeds, "modality": modality})()
    chosen = policy_selector(policy)(batch, layout, 0.2)
    assert isinstance(chosen, torch.Tensor) and chosen.dtype == torch.bool
    kept = select_keep(embeds, modality, policy=policy, retention=0.2)
    pruned = prune_inputs(embeds, modality, policy=policy, retention=0.2)
    assert torch.equal(pruned.inputs_embeds,
                       prune_inputs(embeds, modality, keep=kept | (modality == TEXT)).inputs_embeds)


def test_bad_thresholds_are_refused_where_they_are_set():
    with pytest.raises(ValueError, match="merge_threshold"):
        PolicyConfig(input_size=8, hidden_size=8, merge_threshold=1.5)
    config = PolicyConfig(input_size=8, hidden_size=8)
    with pytest.raises(TypeError, match="merge_threshold"):
        dataclasses.replace(config, merge_threshold="high")
    with pytest.raises(ValueError, match="merge_threshold"):
        TrainConfig(merge_threshold=-2.0).validate()
    parser = build_parser("avex.train", "")
    assert parser.parse_args(["--merge-threshold", "0.7"]).merge_threshold == 0.7
    none = parser.parse_args(["--merge-threshold", "None"])
    assert resolve_config(none).merge_threshold is None
    assert TrainConfig().merge_threshold == 0.8   # the default since round 6
    with pytest.raises(SystemExit):
        parser.parse_args(["--merge-threshold", "high"])


def test_a_run_saves_its_threshold_and_its_table_merges(tiny_cache_dir, tmp_path, capsys):
    """--merge-threshold: RL trains as without it (the same weights), the saved policy
    carries it, and the end-of-run table serves merged tokens; the table's CaCoVID-AV, a
    baseline, is trained and served unmerged."""
    common = ["--benchmark-preset", "tiny", "--captioner-preset", "tiny", "--cache-dir",
              str(tiny_cache_dir), "--batch-size", "8", "--micro-batch-size", "4",
              "--epochs", "0.5", "--no-progress", "--seed", "3", "--eval-methods", "",
              "--eval-retentions", "0.1"]
    train_main([*common, "--run-dir", str(tmp_path / "plain"), "--warmup-epochs", "0.5",
                "--merge-threshold", "none"])
    train_main([*common, "--run-dir", str(tmp_path / "merged"), "--warmup-from",
                str(tmp_path / "plain"), "--merge-threshold", "0.5", "--eval-methods",
                "cacovid"])
    cacovid = avex.load_policy(tmp_path / "merged" / "cacovid")
    assert cacovid.config.merge_threshold is None
    plain, merged = avex.load_policy(tmp_path / "plain"), avex.load_policy(tmp_path / "merged")
    assert plain.config.merge_threshold is None and merged.config.merge_threshold == 0.5
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(),
                                                 merged.state_dict().values()))
    tables = [(tmp_path / name / "results.md").read_text() for name in ("plain", "merged")]
    assert "merged from cosine 0.5" in tables[1] and "merged from" not in tables[0]
