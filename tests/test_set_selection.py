"""Set-aware selection (avex/set_selection.py, issue #36 item 5): redundancy 0 is today's
Gumbel-Top-K / Plackett-Luce / Top-K; the sampler draws from the step-wise law its
log-probability scores; the log-probability's gradient; ragged rows; the duplicate case it is
for; the setting in the policy, its artifact and the pruning API; bad settings refused."""
import itertools
import json
import math

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import Qwen2Config, Qwen2ForCausalLM

import avex
from avex.evaluate.diagnose import sample_keep_sets
from avex.kernels import gumbel_topk
from avex.kernels.gumbel_topk_ref import gumbel_noise, shifted_logits
from avex.methods.learned import policy_selector
from avex.policy import AVEXPolicy, PolicyConfig, TrainedOn
from avex.profiling.methods import selection as profiled_selection
from avex.pruning import AUDIO, PAD, TEXT, VISUAL, prune_inputs, select_keep
from avex.selection import AVLayout, indices_to_keep
from avex.set_selection import (_log_prob, log_prob_stepwise, select_indices,
                                set_aware_indices, set_aware_log_prob, set_aware_select)
from avex.train import main as train_main
from avex.training.config import TrainConfig


def ragged_scores(seed, rows=6, width=17, dtype=torch.float32, dim=5):
    """Scores with -inf padding past each row's length, hidden states, and budgets 1..length."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(rows, width, generator=gen, dtype=dtype) * 2
    lengths = torch.randint(1, width + 1, (rows,), generator=gen)
    lengths[0] = width
    scores[torch.arange(width) >= lengths[:, None]] = float("-inf")
    budget = torch.stack([torch.randint(1, int(n) + 1, (1,), generator=gen)[0] for n in lengths])
    budget[0] = width          # K = M
    budget[-1] = 1             # K = 1
    hidden = torch.randn(rows, width, dim, generator=gen, dtype=dtype)
    return scores, hidden, budget


# ----------------------------------------------------------------------------------------------
# redundancy 0 is today's path
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("sample", [True, False])
def test_zero_redundancy_is_gumbel_topk(seed, dtype, sample):
    """Same picks in the same order as gumbel_topk (same noise), same log-probability."""
    scores, hidden, budget = ragged_scores(seed, dtype=dtype)
    indices, log_prob = set_aware_select(scores, hidden, budget, redundancy=0.0, tau=0.5,
                                         seed=seed, sample=sample)
    expected, expected_log_prob = gumbel_topk(scores, budget, tau=0.5, seed=seed, sample=sample,
                                              log_prob=True)
    assert torch.equal(indices, expected)
    assert log_prob.dtype == expected_log_prob.dtype
    tol = 1e-10 if dtype == torch.float64 else 2e-5
    torch.testing.assert_close(log_prob, expected_log_prob, rtol=tol, atol=tol)


def test_zero_redundancy_ties_go_to_the_lower_index_as_in_topk():
    scores = torch.tensor([[1.0, 3.0, 3.0, 1.0, 3.0, float("-inf")]])
    hidden = torch.randn(1, 6, 3)
    for k in (1, 2, 3, 4, 5):
        budget = torch.tensor([k])
        picks = set_aware_indices(scores, hidden, budget, redundancy=0.0, sample=False)
        assert torch.equal(picks, gumbel_topk(scores, budget, sample=False)[0])
    assert set_aware_indices(scores, hidden, torch.tensor([4]), redundancy=0.0,
                             sample=False)[0].tolist() == [1, 2, 4, 0]


def test_select_indices_topk_is_gumbel_topk_and_set_aware_needs_hidden():
    scores, hidden, budget = ragged_scores(3)
    for sample in (True, False):
        got = select_indices("topk", scores, None, budget, tau=0.5, seed=9, sample=sample,
                             log_prob=True)
        want = gumbel_topk(scores, budget, tau=0.5, seed=9, sample=sample, log_prob=True)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(ValueError, match="selection 'set-aware' needs the policy's hidden"):
        select_indices("set-aware", scores, None, budget, redundancy=1.0)
    with pytest.raises(ValueError, match=r"selection must be one of .*got 'greedy'"):
        select_indices("greedy", scores, hidden, budget)


# ----------------------------------------------------------------------------------------------
# the law: log-probabilities sum to 1 over every ordered pick, and the sampler follows them
# ----------------------------------------------------------------------------------------------

def orderings(width, k):
    return torch.tensor(list(itertools.permutations(range(width), k)))


@pytest.mark.parametrize("width,k,redundancy", [(5, 2, 1.5), (5, 3, 3.0), (6, 3, 0.7),
                                                (6, 2, 0.0), (4, 4, 2.0)])
def test_log_probabilities_of_every_ordered_pick_sum_to_one(width, k, redundancy):
    gen = torch.Generator().manual_seed(width * 10 + k)
    scores = torch.randn(1, width, generator=gen, dtype=torch.float64)
    hidden = torch.randn(1, width, 3, generator=gen, dtype=torch.float64)
    hidden[0, 1] = hidden[0, 0]                       # a duplicate pair
    picks = orderings(width, k)
    n = len(picks)
    log_prob = set_aware_log_prob(scores.expand(n, -1), hidden.expand(n, -1, -1), picks,
                                  torch.full((n,), k), redundancy=redundancy, tau=0.7)
    assert float(log_prob.exp().sum()) == pytest.approx(1.0, abs=1e-12)


def empirical_law(picks, width, k):
    codes = (picks[:, :k] * width ** torch.arange(k - 1, -1, -1)).sum(1)
    return torch.bincount(codes, minlength=width ** k).double() / len(picks)


def naive_sampler(scores, hidden, budget, redundancy, tau, seed):
    """One Gumbel key per token, lowered by the penalty without the truncation carry: the
    plausible shortcut this module must not take (its picks follow another law)."""
    rows, width = scores.shape
    valid = scores > float("-inf")
    key = (shifted_logits(scores, valid, tau) + gumbel_noise(seed, rows, width)).double()
    unit = F.normalize(hidden.double(), dim=-1)
    redundant = torch.zeros(rows, width, dtype=torch.float64)
    out = []
    for _ in range(int(budget.max())):
        logits = key - redundancy / tau * redundant
        pick = logits.argmax(1)
        out.append(pick)
        key[torch.arange(rows), pick] = float("-inf")
        sim = (unit * unit[torch.arange(rows), pick][:, None]).sum(-1)
        redundant = torch.maximum(redundant, sim)
    return torch.stack(out, 1)


@pytest.mark.parametrize("width,k,redundancy", [(5, 2, 2.0), (5, 3, 3.0), (6, 3, 1.0)])
def test_sampler_frequencies_match_the_log_probabilities(width, k, redundancy):
    """200000 draws (one per row: the noise is per row and column) against exp(log pi) of
    every ordered pick: each ordering's frequency within 5 binomial standard errors of its
    probability (chance of a miss over <= 120 orderings: about 1e-4). The naive sampler
    above, the same keys without the truncation carry, is far off: the check can tell the
    two apart."""
    gen = torch.Generator().manual_seed(100 + width + k)
    scores = torch.randn(1, width, generator=gen, dtype=torch.float64)
    hidden = torch.randn(1, width, 3, generator=gen, dtype=torch.float64)
    hidden[0, 1] = hidden[0, 0]
    scores[0, :2] = scores[0].max() + 1.0             # the duplicates lead: Top-K takes both
    draws = 200_000
    budget = torch.full((draws,), k)
    rows, rows_hidden = scores.expand(draws, -1), hidden.expand(draws, -1, -1)
    picks = set_aware_indices(rows, rows_hidden, budget, redundancy=redundancy, tau=0.7,
                              seed=11)
    every = orderings(width, k)
    truth = set_aware_log_prob(scores.expand(len(every), -1), hidden.expand(len(every), -1, -1),
                               every, torch.full((len(every),), k), redundancy=redundancy,
                               tau=0.7).exp()
    codes = (every * width ** torch.arange(k - 1, -1, -1)).sum(1)
    error = (truth * (1 - truth) / draws).sqrt()
    ours = empirical_law(picks, width, k)[codes]
    assert float(((ours - truth).abs() / error).max()) < 5
    naive = empirical_law(naive_sampler(rows, rows_hidden, budget, redundancy, 0.7, 11),
                          width, k)[codes]
    assert float(((naive - truth).abs() / error).max()) > 10


# ----------------------------------------------------------------------------------------------
# gradients, ragged rows, the duplicate case
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(3))
def test_log_probability_gradcheck(seed):
    """float64 gradcheck w.r.t. the scores, the hidden states and the redundancy weight, on
    ragged rows (padding, K = M, K = 1)."""
    scores, hidden, budget = ragged_scores(seed, rows=4, width=7, dtype=torch.float64, dim=3)
    picks = set_aware_indices(scores, hidden, budget, redundancy=1.3, tau=0.7, seed=seed)
    finite = scores > float("-inf")
    values = scores[finite].clone().requires_grad_()
    hidden = hidden.clone().requires_grad_()
    beta = torch.tensor(1.3, dtype=torch.float64, requires_grad=True)

    def log_prob(values, hidden, beta):
        full = torch.full_like(scores, float("-inf")).masked_scatter(finite, values)
        return set_aware_log_prob(full, hidden, picks, budget, redundancy=beta, tau=0.7)
    assert torch.autograd.gradcheck(log_prob, (values, hidden, beta))
    (grad_hidden,) = torch.autograd.grad(log_prob(values, hidden, beta).sum(), hidden)
    assert bool(grad_hidden.abs().sum() > 0)             # the hidden states get a signal


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_all_steps_log_probability_equals_the_step_wise_reference(seed, dtype):
    """_log_prob (every step at once) against log_prob_stepwise (pick by pick), values and
    gradients, on fresh ragged rows: K = M, K = 1, a row with budget 0, tied scores, sizes
    that aren't powers of two, sampled and greedy picks."""
    width = (5, 17, 33, 80)[seed % 4]
    scores, hidden, budget = ragged_scores(seed, rows=7, width=width, dtype=dtype,
                                           dim=(3, 7, 64)[seed % 3])
    if seed % 3 == 0:
        scores = scores.round()                       # ties
    budget[3] = 0
    picks = set_aware_indices(scores, hidden, budget, redundancy=3.0, tau=0.5, seed=seed,
                              sample=seed % 2 == 0)
    outs, grads = [], []
    for fn in (_log_prob, log_prob_stepwise):
        s = scores.clone().requires_grad_()
        h = hidden.clone().requires_grad_()
        beta = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
        out = fn(s, h, picks, budget, beta, 0.5)
        weights = torch.linspace(-1, 2, len(out), dtype=out.dtype)
        (out * weights).sum().backward()
        outs.append(out.detach())
        grads.append([torch.nan_to_num(t.grad if t.grad is not None else torch.zeros_like(t))
                      for t in (s, h, beta)])
    assert outs[0].dtype == outs[1].dtype
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(outs[0], outs[1], rtol=tol, atol=tol)
    for ours, reference in zip(*grads):
        torch.testing.assert_close(ours, reference, rtol=tol, atol=tol)


def test_the_all_steps_log_probability_with_no_picks_is_zero():
    scores, hidden, _ = ragged_scores(1, rows=3, width=9)
    budget = torch.zeros(3, dtype=torch.int64)
    out = _log_prob(scores, hidden, torch.empty(3, 0, dtype=torch.int64), budget, 2.0, 1.0)
    assert torch.equal(out, torch.zeros(3))


def test_ragged_rows_pick_within_their_budget_and_never_padding():
    scores, hidden, budget = ragged_scores(5, rows=8, width=13)
    for sample in (True, False):
        picks = set_aware_indices(scores, hidden, budget, redundancy=2.0, seed=1, sample=sample)
        assert picks.shape == (8, int(budget.max()))
        for row in range(8):
            chosen = picks[row, :budget[row]]
            assert bool((picks[row, budget[row]:] == -1).all())
            assert len(set(chosen.tolist())) == int(budget[row])
            assert bool((scores[row, chosen] > float("-inf")).all())
        log_prob = set_aware_log_prob(scores, hidden, picks, budget, redundancy=2.0)
        assert bool(torch.isfinite(log_prob).all())
    full_row = set_aware_indices(scores[:1], hidden[:1], budget[:1], redundancy=2.0,
                                 sample=False)
    assert sorted(full_row[0].tolist()) == list(range(13))    # K = M keeps every token


def test_a_row_alone_picks_as_in_a_batch_when_greedy():
    scores, hidden, budget = ragged_scores(8)
    together = set_aware_indices(scores, hidden, budget, redundancy=1.0, sample=False)
    for row in range(len(scores)):
        alone = set_aware_indices(scores[row:row + 1], hidden[row:row + 1], budget[row:row + 1],
                                  redundancy=1.0, sample=False)
        assert torch.equal(alone[0], together[row, :budget[row]])


def duplicate_case():
    """Tokens 0 and 1 identical (one object in two frames), token 2 a little behind them and
    different: Top-K at K = 2 keeps both twins."""
    scores = torch.tensor([[5.0, 4.9, 4.7, 1.0, 0.5, float("-inf")]])
    hidden = torch.tensor([[[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0],
                            [0.0, 0.0, 1.0], [0.5, 0.5, 0.0], [0.0, 0.0, 0.0]]])
    return scores, hidden


def test_greedy_set_aware_picks_a_distinct_token_over_a_twin():
    scores, hidden = duplicate_case()
    budget = torch.tensor([2])
    assert set(gumbel_topk(scores, budget, sample=False)[0][0].tolist()) == {0, 1}
    assert set_aware_indices(scores, hidden, budget, redundancy=1.0,
                             sample=False)[0].tolist() == [0, 2]
    # a penalty smaller than the score gap leaves the twin in
    assert set_aware_indices(scores, hidden, budget, redundancy=0.1,
                             sample=False)[0].tolist() == [0, 1]


def test_sampled_sets_take_the_twin_less_often():
    scores, hidden = duplicate_case()
    draws = 20_000
    budget = torch.full((draws,), 2)
    rows, rows_hidden = scores.expand(draws, -1), hidden.expand(draws, -1, -1)
    twins = {}
    for redundancy in (0.0, 2.0):
        picks = set_aware_indices(rows, rows_hidden, budget, redundancy=redundancy, tau=0.5,
                                  seed=4)
        twins[redundancy] = float(((picks == 0).any(1) & (picks == 1).any(1)).double().mean())
    assert twins[0.0] > 0.4 and twins[2.0] < 0.5 * twins[0.0]


# ----------------------------------------------------------------------------------------------
# bad input
# ----------------------------------------------------------------------------------------------

def test_bad_input_is_refused_naming_the_argument():
    scores, hidden, budget = ragged_scores(0, rows=2, width=6)
    cases = [
        (dict(redundancy=-1.0), ValueError, "redundancy must be a finite number >= 0"),
        (dict(redundancy=float("nan")), ValueError, "redundancy must be a finite number"),
        (dict(redundancy="1"), TypeError, "redundancy must be a number"),
        (dict(tau=0.0), ValueError, "tau must be a finite number > 0"),
        # keys past float32 turn -inf and tie: the same token was picked K times
        (dict(scores=scores.index_put((torch.tensor([0, 0]), torch.tensor([0, 1])),
                                      torch.tensor([3e38, -3e38]))), ValueError,
         r"span .* plus the redundancy"),
        (dict(tau=1e-39), ValueError, "divided by tau = 1e-39"),
        (dict(tau=1e300), ValueError, r"tau must be below"),
        (dict(hidden=hidden[:, :3]), ValueError, r"hidden must have shape \[2, 6\] \+ \[D\]"),
        (dict(budget=torch.tensor([7, 1])), ValueError, r"budget\[0\] = 7 must lie in \[0, 6\]"),
        (dict(budget=torch.tensor([1.0, 1.0])), TypeError, "budget must be an integer tensor"),
        (dict(scores=scores.masked_fill(scores == scores[0, 0], float("nan"))), ValueError,
         "scores must be finite or -inf"),
        (dict(hidden=hidden.masked_fill(hidden == hidden[0, 0, 0], float("inf"))), ValueError,
         "hidden must be finite"),
    ]
    for change, error, message in cases:
        args = dict(scores=scores, hidden=hidden, budget=torch.tensor([6, 1]), redundancy=1.0,
                    tau=1.0)
        args.update(change)
        with pytest.raises(error, match=message):
            set_aware_indices(args.pop("scores"), args.pop("hidden"), args.pop("budget"), **args)
    picks = set_aware_indices(scores, hidden, torch.tensor([6, 1]), redundancy=1.0)
    twice = picks.clone()
    twice[0, 1] = twice[0, 0]
    with pytest.raises(ValueError, match="indices row 0 picks a token twice"):
        set_aware_log_prob(scores, hidden, twice, torch.tensor([6, 1]), redundancy=1.0)
    outside = picks.clone()
    outside[1, 0] = 6
    with pytest.raises(ValueError, match="indices must hold, in each row's first budget"):
        set_aware_log_prob(scores, hidden, outside, torch.tensor([6, 1]), redundancy=1.0)
    with pytest.raises(ValueError, match=r"seed must be an int in \[0, 2\*\*63\), got -1"):
        set_aware_indices(scores, hidden, torch.tensor([6, 1]), redundancy=1.0, seed=-1)
    with pytest.raises(ValueError, match=r"indices must have shape \[2, >= 6\]"):
        set_aware_log_prob(scores, hidden, picks[:, :3], torch.tensor([6, 1]), redundancy=1.0)


# ----------------------------------------------------------------------------------------------
# the setting: policy, artifact, pruning API, training config
# ----------------------------------------------------------------------------------------------

def tiny_llm():
    torch.manual_seed(0)
    config = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=50)
    return Qwen2ForCausalLM(config).eval()


def av_batch(seed=1, rows=3):
    torch.manual_seed(seed)
    layout = [TEXT] * 3 + [VISUAL] * 12 + [AUDIO] * 5 + [TEXT] * 2
    modality = torch.tensor([layout] + [[PAD] * r + layout[:len(layout) - r]
                                        for r in range(1, rows)])
    return torch.randn(rows, len(layout), 32), modality


def saved_policy(llm, path, **selection):
    torch.manual_seed(2)
    policy = AVEXPolicy.from_llm(llm, hidden_size=16, **selection).eval()
    policy.trained_on = TrainedOn.of_model(llm, "visual-then-audio", [0.5, 0.1])
    policy.save_pretrained(path)
    return policy


def test_the_artifact_keeps_the_selection_and_serves_with_it(tmp_path):
    llm = tiny_llm()
    saved_policy(llm, tmp_path / "p", selection="set-aware", redundancy=3.0)
    record = json.loads((tmp_path / "p" / "config.json").read_text())
    assert record["policy"]["selection"] == "set-aware" and record["policy"]["redundancy"] == 3.0
    loaded = avex.load_policy(tmp_path / "p", model=llm)
    assert loaded.config.selection == "set-aware" and loaded.config.redundancy == 3.0
    embeds, modality = av_batch()
    layout = AVLayout.of(modality)
    scores, hidden = loaded.score(embeds, modality, with_hidden=True)
    for retention in (0.1, 0.2, 0.4):
        budget = layout.budget(retention)
        picks = set_aware_indices(layout.gather(scores), layout.gather_vectors(hidden), budget,
                                  redundancy=3.0, sample=False)
        want = indices_to_keep(picks, layout.positions.shape[1])
        kept = select_keep(embeds, modality, policy=loaded, retention=retention)
        assert torch.equal(layout.gather(kept.float(), fill=0.0).bool(), want)
        pruned = prune_inputs(embeds, modality, policy=loaded, retention=retention)
        assert torch.equal(pruned.keep[:, 0] & ((modality == VISUAL) | (modality == AUDIO)),
                           kept)
        selector = policy_selector(loaded)
        assert torch.equal(selector(type("B", (), {"inputs_embeds": embeds,
                                                   "modality": modality})(), layout, retention),
                           want)
    # the rule matters here: Top-K of the same scores keeps another set somewhere
    differs = [not torch.equal(set_aware_indices(layout.gather(scores),
                                                 layout.gather_vectors(hidden),
                                                 layout.budget(r), redundancy=3.0,
                                                 sample=False).sort(1).values,
                               gumbel_topk(layout.gather(scores), layout.budget(r),
                                           sample=False)[0].sort(1).values)
               for r in (0.2, 0.3, 0.4, 0.5)]
    assert any(differs)


def test_per_item_selection_uses_the_policys_rule(tmp_path):
    llm = tiny_llm()
    policy = saved_policy(llm, tmp_path / "p", selection="set-aware", redundancy=3.0)
    embeds, modality = av_batch(rows=1)
    visual_only = torch.where(modality == AUDIO, TEXT, modality)   # one item, as vLLM serves
    per_item = select_keep(embeds, visual_only, policy=policy, retention=0.4, per_item=True)
    per_row = select_keep(embeds, visual_only, policy=policy, retention=0.4)
    assert torch.equal(per_item, per_row)


def test_old_records_load_as_topk(tmp_path):
    llm = tiny_llm()
    policy = saved_policy(llm, tmp_path / "p")
    file = tmp_path / "p" / "config.json"
    record = json.loads(file.read_text())
    assert record["policy"]["selection"] == "topk"
    for key in ("selection", "redundancy"):
        del record["policy"][key]
    file.write_text(json.dumps(record))
    loaded = avex.load_policy(tmp_path / "p", model=llm)
    assert loaded.config.selection == "topk" and not loaded.set_aware
    embeds, modality = av_batch()
    kept = select_keep(embeds, modality, policy=loaded, retention=0.2)
    by_scores = select_keep(embeds, modality, scores=policy.score(embeds, modality),
                            retention=0.2)
    assert torch.equal(kept, by_scores)


def test_bad_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"selection must be one of .*got 'diverse'"):
        PolicyConfig(input_size=8, hidden_size=8, num_heads=2, selection="diverse")
    with pytest.raises(ValueError, match="redundancy = 2.0 has no effect with selection 'topk'"):
        PolicyConfig(input_size=8, hidden_size=8, num_heads=2, redundancy=2.0)
    with pytest.raises(ValueError, match="redundancy must be a finite number >= 0"):
        PolicyConfig(input_size=8, hidden_size=8, num_heads=2, selection="set-aware",
                     redundancy=-1.0)
    with pytest.raises(ValueError, match=r"selection must be one of .*got 'greedy'"):
        TrainConfig(selection="greedy").validate()
    with pytest.raises(ValueError, match="selection 'set-aware' with redundancy 0 is Top-K"):
        TrainConfig(selection="set-aware", redundancy=0.0).validate()
    with pytest.raises(ValueError, match="redundancy = 1.0 has no effect with selection 'topk'"):
        TrainConfig(selection="topk", redundancy=1.0).validate()
    # the defaults: set-aware at 4; with the exchange term or search, Top-K (they rank tokens
    # by score alone); a selection without a redundancy takes its own
    assert (TrainConfig().selection, TrainConfig().redundancy) == ("set-aware", 4.0)
    for arm in ("exchanges", "exchange_search"):
        cfg = TrainConfig(**{arm: True}).validate()
        assert (cfg.selection, cfg.redundancy) == ("topk", 0.0)
    assert TrainConfig(selection="topk").validate().redundancy == 0.0
    for arm in ("exchanges", "exchange_search"):
        with pytest.raises(ValueError, match=f"selection 'set-aware' can't train with {arm}"):
            TrainConfig(selection="set-aware", redundancy=1.0, **{arm: True}).validate()
    assert TrainConfig(selection="set-aware", redundancy=1.0).validate().selection == "set-aware"
    llm = tiny_llm()
    saved_policy(llm, tmp_path / "p")
    file = tmp_path / "p" / "config.json"
    record = json.loads(file.read_text())
    record["policy"]["selection"] = "best"
    file.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"bad policy record .*selection must be one of .*'best'"):
        avex.load_policy(tmp_path / "p", model=llm)


def test_diagnose_samples_a_set_aware_policy_by_its_own_law():
    """diagnose's best-of-N draws a set-aware policy's samples from the step-wise set-aware
    law (its training anchors' distribution), and a Top-K policy's by Gumbel-Top-K."""
    scores, hidden, _ = ragged_scores(5, rows=1, width=23, dim=6)
    scores, hidden = scores[0], hidden[0]
    for selection, redundancy in (("set-aware", 3.0), ("topk", 0.0)):
        policy = AVEXPolicy(PolicyConfig(input_size=8, hidden_size=8, num_heads=2,
                                         selection=selection, redundancy=redundancy))
        keep = sample_keep_sets(scores, 7, 5, 0.5, 11, policy=policy, hidden=hidden)
        rows = scores[None].expand(5, -1).contiguous()
        budget = torch.full((5,), 7)
        if selection == "set-aware":
            expected = set_aware_indices(rows, hidden[None].expand(5, -1, -1).contiguous(),
                                         budget, redundancy=3.0, tau=0.5, seed=11)
        else:
            expected, _ = gumbel_topk(rows, budget, tau=0.5, seed=11)
        assert torch.equal(keep, indices_to_keep(expected, 23))
        assert keep.sum(1).tolist() == [7] * 5
    set_aware = AVEXPolicy(PolicyConfig(input_size=8, hidden_size=8, num_heads=2,
                                        selection="set-aware", redundancy=3.0))
    plain = sample_keep_sets(scores, 7, 5, 0.5, 11, policy=policy, hidden=hidden)
    assert not torch.equal(plain, sample_keep_sets(scores, 7, 5, 0.5, 11, policy=set_aware,
                                                   hidden=hidden))


def tiny_run_args(cache_dir, run_dir, *extra):
    # a run given --warmup-from trains no warmup, and refuses warmup settings
    warmup = [] if "--warmup-from" in extra else ["--warmup-epochs", "0.5"]
    return ["--benchmark-preset", "tiny", "--captioner-preset", "tiny",
            "--cache-dir", str(cache_dir), "--run-dir", str(run_dir), "--batch-size", "8",
            "--micro-batch-size", "4", "--epochs", "0.5", *warmup,
            "--no-progress", "--no-evaluate", "--seed", "3", *extra]


def test_a_set_aware_run_trains_and_saves_its_rule(tiny_cache_dir, tmp_path, capsys):
    """python -m avex.train --selection set-aware: the anchors are set-aware draws (the
    policy ends elsewhere than a Top-K run from the same seed and warmup), and the saved
    policy serves with the same rule."""
    train_main(tiny_run_args(tiny_cache_dir, tmp_path / "topk", "--selection", "topk"))
    train_main(tiny_run_args(tiny_cache_dir, tmp_path / "aware", "--warmup-from",
                             str(tmp_path / "topk"), "--selection", "set-aware",
                             "--redundancy", "2"))
    policy = avex.load_policy(tmp_path / "aware")
    assert policy.set_aware and policy.config.redundancy == 2.0
    assert avex.AVEXPolicy.from_pretrained(tmp_path / "aware" / "policy").set_aware
    assert not avex.load_policy(tmp_path / "topk").set_aware
    rl = [json.loads(line) for line in (tmp_path / "aware" / "metrics.jsonl").open()]
    assert all(math.isfinite(r["loss"]) for r in rl if r["phase"] == "rl")
    weights = [load_file(str(tmp_path / name / "policy" / "model.safetensors"))
               for name in ("topk", "aware")]
    assert any(not torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        train_main(tiny_run_args(tiny_cache_dir, tmp_path / "bad", "--selection", "set-aware",
                                 "--redundancy", "0"))
    assert exit_info.value.code == 2
    assert "selection 'set-aware' with redundancy 0 is Top-K" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_the_profiling_suite_selects_by_the_policys_rule(tmp_path):
    """avex.profiling times AVEX's stages with the policy's own selection: a set-aware
    policy's pruned inputs keep what select_keep keeps."""
    llm = tiny_llm()
    policy = saved_policy(llm, tmp_path / "p", selection="set-aware", redundancy=3.0)
    embeds, modality = av_batch()
    marks = []
    pruned = profiled_selection("avex", llm, policy, embeds, modality, 0.3)(marks.append)
    assert marks == ["policy"]
    assert torch.equal(pruned.keep[:, 0],
                       select_keep(embeds, modality, policy=policy, retention=0.3)
                       | (modality == TEXT))


def test_served_hidden_states_equal_the_training_ones():
    """score(with_hidden=True), the serving path, gives forward's hidden states (what training
    draws with) at every AV position, zeros elsewhere, so both select alike."""
    torch.manual_seed(5)
    policy = AVEXPolicy(PolicyConfig(input_size=32, hidden_size=16, num_heads=4,
                                     selection="set-aware", redundancy=2.0)).eval()
    embeds, modality = av_batch(rows=3)
    is_av = (modality == VISUAL) | (modality == AUDIO)
    with torch.no_grad():
        scores, hidden = policy(embeds, modality, with_hidden=True)
    served_scores, served_hidden = policy.score(embeds, modality, with_hidden=True)
    assert served_hidden.shape == hidden.shape == (*modality.shape, 16)
    torch.testing.assert_close(served_hidden[is_av], hidden[is_av], rtol=0, atol=1e-5)
    assert bool((served_hidden[~is_av] == 0).all())
    torch.testing.assert_close(served_scores[is_av], scores[is_av], rtol=0, atol=1e-5)
