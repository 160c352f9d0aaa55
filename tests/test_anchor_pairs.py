"""The anchor-pair exchange term (``--lambda-pairs``): every pair of a clip's RL anchors is an
exchange of their symmetric difference, labelled by their reward difference."""
from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from avex.training.config import TrainConfig
from avex.training.steps import anchor_pair_term


def reference(scores, anchors, rewards):
    """Pair by pair, in plain Python: the term's contract."""
    rows, count = anchors.shape[:2]
    found = []   # (row, dF, dR) of every pair whose sets and rewards differ
    for b in range(rows):
        for i in range(count):
            for j in range(i + 1, count):
                gain = anchors[b, i] & ~anchors[b, j]
                loss = anchors[b, j] & ~anchors[b, i]
                d_reward = float(rewards[b, i] - rewards[b, j])
                if (gain.any() or loss.any()) and d_reward != 0:
                    found.append((b, scores[b][gain].sum() - scores[b][loss].sum(), d_reward))
    zero = scores[torch.isfinite(scores)].sum() * 0
    if not found:
        return zero
    saturation = float(torch.tensor([abs(d) for _, _, d in found], dtype=torch.float64).median())
    total = zero
    for b in range(rows):
        mine = [(f, d) for row, f, d in found if row == b]
        for f, d in mine:
            total = total + min(abs(d) / saturation, 1.0) * F.softplus(-math.copysign(1, d) * f) \
                / len(mine)
    return total / rows


def draw(rows, count, width, kept, generator, *, pad=0, tie=False):
    scores = torch.randn(rows, width, dtype=torch.float64, generator=generator)
    anchors = torch.zeros(rows, count, width, dtype=torch.bool)
    for b in range(rows):
        real = width - (pad if b == rows - 1 else 0)
        for a in range(count):
            anchors[b, a, torch.randperm(real, generator=generator)[:kept]] = True
    if pad:
        scores[rows - 1, width - pad:] = float("-inf")   # past the row's AV tokens
    rewards = torch.randn(rows, count, dtype=torch.float64, generator=generator)
    if tie:
        rewards[0, 1] = rewards[0, 0]                      # a pair with dR = 0
        anchors[1, 1] = anchors[1, 0]                      # a pair with the same set
    return scores, anchors, rewards


@pytest.mark.parametrize("rows,count,width,kept,pad", [
    (1, 2, 5, 2, 0), (3, 4, 7, 3, 2), (2, 8, 13, 1, 0), (4, 3, 11, 11 - 3, 3), (2, 5, 6, 5, 0)],
    ids=["two anchors", "padded row", "K=1", "K=M of a padded row", "K=M-1"])
def test_the_term_matches_the_pairwise_reference(rows, count, width, kept, pad):
    generator = torch.Generator().manual_seed(rows * 100 + count * 10 + width)
    for tie in (False, True):
        if tie and rows < 2:
            continue
        scores, anchors, rewards = draw(rows, count, width, min(kept, width - pad), generator,
                                        pad=pad, tie=tie)
        here = scores.clone().requires_grad_(True)
        there = scores.clone().requires_grad_(True)
        got, want = anchor_pair_term(here, anchors, rewards), reference(there, anchors, rewards)
        assert torch.isfinite(got)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        got.backward()
        want.backward()
        torch.testing.assert_close(here.grad, there.grad, rtol=1e-10, atol=1e-12)
        assert bool(torch.isfinite(here.grad).all())


def test_the_gradient_raises_the_better_anchors_own_tokens():
    """Two anchors that swap one token: descending the term raises the score of the token the
    better-rewarded anchor kept and lowers the other's, and the shared token gets nothing."""
    scores = torch.zeros(1, 3, dtype=torch.float64, requires_grad=True)
    anchors = torch.tensor([[[True, True, False], [True, False, True]]])
    anchor_pair_term(scores, anchors, torch.tensor([[2.0, 1.0]], dtype=torch.float64)).backward()
    assert scores.grad[0, 1] < 0 < scores.grad[0, 2] and scores.grad[0, 0] == 0


def test_gradcheck_in_float64():
    generator = torch.Generator().manual_seed(7)
    scores, anchors, rewards = draw(3, 4, 9, 4, generator, pad=2)
    finite = scores.masked_fill(~torch.isfinite(scores), 0.0).requires_grad_(True)
    # the -inf past a row's tokens are fixed inputs, not variables: put them back inside
    pad = ~torch.isfinite(scores)
    assert torch.autograd.gradcheck(
        lambda s: anchor_pair_term(s.masked_fill(pad, float("-inf")), anchors, rewards),
        (finite,))


def test_pairs_without_a_label_give_zero_and_no_gradient():
    """All rewards tied, or every anchor the same set: nothing to learn, a 0 loss, a 0 gradient
    (not NaN from a median of nothing)."""
    scores = torch.randn(2, 6, dtype=torch.float64, requires_grad=True)
    anchors = torch.zeros(2, 3, 6, dtype=torch.bool)
    anchors[:, :, :3] = True
    anchors[0, 1, 2], anchors[0, 1, 4] = False, True
    value = anchor_pair_term(scores, anchors, torch.ones(2, 3, dtype=torch.float64))
    value.backward()
    assert value.item() == 0 and bool((scores.grad == 0).all())


@pytest.mark.parametrize("settings,message", [
    ({"lambda_pairs": -0.1}, r"lambda_pairs must be .*got -0.1"),
    ({"lambda_pairs": 0.1, "anchors": 1, "rl_estimator": "paper"},
     r"lambda_pairs = 0.1 pairs a clip's anchors, and anchors = 1 makes no pair"),
    ({"lambda_pairs": 0.1, "exchange_search": True, "selection": "topk", "redundancy": 0.0},
     r"lambda_pairs = 0.1 pairs a clip's anchors, and exchange_search draws none"),
], ids=["negative", "one anchor", "exchange search"])
def test_settings_the_term_cannot_use_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**settings).validate()


def test_training_with_the_term_logs_it_and_moves_the_policy(tiny_cache_dir, tmp_path):
    """A tiny run with --lambda-pairs logs the term at every RL step, names it in its recipe, and
    ends with other weights than the same run without it (the same warmup)."""
    from avex.methods.learned import recipe
    from avex.train import main
    from safetensors.torch import load_file

    def train(run, *extra):
        main(["--benchmark-preset", "tiny", "--captioner-preset", "tiny", "--cache-dir",
              str(tiny_cache_dir), "--run-dir", str(run), "--batch-size", "8",
              "--micro-batch-size", "4", "--epochs", "0.5", "--warmup-epochs", "0.5",
              "--no-progress", "--no-evaluate", "--seed", "3", *extra])
        latest = (run / "checkpoints" / "latest").read_text().strip()
        return load_file(str(run / "checkpoints" / latest / "policy.safetensors"))

    plain = train(tmp_path / "plain")
    paired = train(tmp_path / "paired", "--lambda-pairs", "0.5")
    records = [json.loads(line) for line in
               (tmp_path / "paired" / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in records if r.get("phase") == "rl"]
    assert rl and all(math.isfinite(r["pairs"]) and r["pairs"] >= 0 for r in rl)
    assert any(r["pairs"] > 0 for r in rl)
    # weighted so that its gradient is lambda_pairs x L_RL's: a positive, finite scale
    assert all(math.isfinite(r["pairs_scale"]) and r["pairs_scale"] >= 0 for r in rl)
    assert any(r["pairs_scale"] > 0 for r in rl)
    assert not any("pairs" in r for r in (json.loads(line) for line in (
        tmp_path / "plain" / "metrics.jsonl").read_text().splitlines()))
    config = json.loads((tmp_path / "paired" / "config.json").read_text())
    assert "anchor-pair exchanges, lambda 0.5" in recipe(config)
    assert any(not torch.equal(plain[name], paired[name]) for name in plain)
