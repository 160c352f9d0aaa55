"""The exchange search arm (issue #36 item 4; avex/training/exchange_search.py): the search on a toy
additive reward, its swaps, its cost, the distillation loss, the settings, and a tiny run."""
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from avex.modality import AUDIO, PAD, VISUAL
from avex.selection import topk_keep
from avex.training.config import TrainConfig
from avex.training.exchange_search import (Rewards, candidate_types, deep_count, distill_loss,
                                           propose, round_sizes, run_search, swap_delta_f)

TYPES = ["vv", "aa", "va", "av"]


def toy(batch=4, visual=12, audio=8, pad=0, seed=0):
    """Scores, modality [B, M] (visual, then audio, then ``pad`` PAD slots) and a per-token
    value: the toy reward of a set is the sum of its tokens' values."""
    gen = torch.Generator().manual_seed(seed)
    modality = torch.tensor([VISUAL] * visual + [AUDIO] * audio + [PAD] * pad).repeat(batch, 1)
    scores = torch.randn(batch, modality.shape[1], generator=gen)
    scores = scores.masked_fill(modality == PAD, float("-inf"))
    value = torch.randn(batch, modality.shape[1], generator=gen).masked_fill(modality == PAD, 0)
    return scores, modality, value


def additive(value, log=None):
    def evaluate(sets):
        if log is not None:
            log.append(tuple(sets.shape))
        return Rewards((sets.double() * value[:, None]).sum(-1).float(), None, None)
    return evaluate


def search(scores, modality, value, budget, log=None, **settings):
    args = dict(reward="cider", types=TYPES, g=2, candidates=7, rounds=2, deep=0.5, seed=1)
    args.update(settings)
    start = topk_keep(scores, torch.full((scores.shape[0],), budget))
    return run_search(scores, start, modality, additive(value, log), **args)


def worth(keep, value):
    return (keep.double() * value).sum(-1)


@pytest.mark.parametrize("seed", range(5))
def test_final_set_never_loses_reward_and_keeps_its_size_and_modalities(seed):
    scores, modality, value = toy(seed=seed, pad=3)
    found = search(scores, modality, value, 6, rounds=3, candidates=9)
    assert torch.equal(found.final.sum(1), found.start.sum(1))
    assert not (found.final & (modality == PAD)).any()
    start, final = worth(found.start, value), worth(found.final, value)
    assert (final >= start - 1e-6).all()
    assert torch.allclose(found.final_reward.double(), final, atol=1e-5)
    assert torch.allclose(found.start_reward.double(), start, atol=1e-5)
    assert ((final > start + 1e-6) == (found.accepted > 0)).all()


def test_search_reaches_the_optimum_where_a_swap_reaches_it():
    """The Top-K set holds two bad visual tokens; the two good ones outside it lie at the very
    bottom of the scores, below four worse ones. Only the swap of the two bad tokens for the
    two deepest is an improvement (a partial one ties or loses), and searches whose G' is
    drawn deep reach that optimum; no search ends anywhere else than at the start or there."""
    visual, audio = 10, 6
    modality = torch.tensor([VISUAL] * visual + [AUDIO] * audio)[None]
    scores = torch.linspace(2, -2, visual + audio)[None]             # Top-4: tokens 0..3
    value = torch.zeros(1, visual + audio)
    value[0, [0, 1]] = 1.0
    value[0, [2, 3]] = -1.0                                         # the policy's mistake
    value[0, 4:visual - 2] = -3.0
    value[0, [visual - 2, visual - 1]] = 1.0                        # the deepest visual tokens
    optimum = torch.tensor([[1, 1, 0, 0] + [0] * 4 + [1, 1] + [0] * audio]).bool()
    reached = 0
    for seed in range(10):
        found = search(scores, modality, value, 4, types=["vv"], g=2, deep=1.0,
                       candidates=30, rounds=3, seed=seed)
        assert torch.equal(found.final, optimum) or torch.equal(found.final, found.start)
        reached += bool(torch.equal(found.final, optimum))
    # each candidate finds it with probability 1/15: 1 - (14/15)^30 = 0.87 a search
    assert reached >= 7, reached
    # G' of the next-best tokens only (the paper's exchange) never finds it
    for seed in range(3):
        found = search(scores, modality, value, 4, types=["vv"], g=2, deep=0.0,
                       candidates=30, rounds=3, seed=seed)
        assert torch.equal(found.final, found.start)


def test_only_strictly_improving_swaps_are_accepted():
    """A candidate that ties the current set is never taken; one that beats it always is
    (the round's best)."""
    scores, modality, value = toy(batch=8, seed=3)
    value = value.round()                         # integer values: many ties
    found = search(scores, modality, value, 6, rounds=7, candidates=7)
    # per round (one candidate each): accepted iff dR < 0 (the candidate beat the current set)
    accepted = ((found.delta_reward < 0) & found.valid).sum(1)
    assert torch.equal(accepted, found.accepted)
    tied = (found.delta_reward == 0) & found.valid
    assert tied.any()                             # the case the rule is about happened


def test_candidates_reach_deep_below_the_boundary():
    """G' = the next-best token plus one drawn from every other token outside the set: over
    draws, the lowest-scored visual token is inserted, never only the next-best ones."""
    visual, audio = 40, 10
    modality = torch.tensor([VISUAL] * visual + [AUDIO] * audio)[None]
    scores = torch.linspace(3, -3, visual + audio)[None]
    keep = topk_keep(scores, torch.tensor([8]))
    protected = torch.zeros_like(keep)
    gen = torch.Generator().manual_seed(0)
    inserted = set()
    for _ in range(200):
        swaps = propose(scores, keep, modality, protected, ["vv"], 2, 0.5, gen)
        assert swaps.valid.all()
        near, far = swaps.inserted[0, 0].tolist()
        assert near == 8                          # the next-best visual token
        inserted.add(far)
        assert torch.equal(swaps.removed[0, 0].sort().values, torch.tensor([6, 7]))
    assert visual - 1 in inserted and max(inserted) == visual - 1
    assert len(inserted) > 20 and 8 not in inserted
    # deep = 0: the paper's exchange, the g next-best; deep = 1: every one drawn
    only_near = propose(scores, keep, modality, protected, ["vv"], 2, 0.0, gen)
    assert only_near.inserted[0, 0].tolist() == [8, 9]
    assert deep_count(2, 0.5) == 1 and deep_count(3, 0.5) == 2 and deep_count(8, 0.0) == 0


def test_protected_tokens_are_never_removed_and_types_keep_their_modalities():
    scores, modality, _ = toy(batch=2, seed=5)
    keep = topk_keep(scores, torch.tensor([8, 8]))
    protected = keep & (scores < scores[keep].median())       # the low half of the set
    gen = torch.Generator().manual_seed(0)
    swaps = propose(scores, keep, modality, protected, TYPES, 2, 0.5, gen)
    rows = torch.arange(2)[:, None]
    for c, name in enumerate(TYPES):
        ok = swaps.valid[:, c]
        removed, inserted = swaps.removed[ok, c], swaps.inserted[ok, c]
        codes = {"v": VISUAL, "a": AUDIO}
        assert (modality[ok][rows[:len(removed)], removed] == codes[name[0]]).all()
        assert (modality[ok][rows[:len(inserted)], inserted] == codes[name[1]]).all()
        assert not protected[ok][rows[:len(removed)], removed].any()
        assert (swaps.keep[:, c].sum(1) == 8).all()
        assert torch.equal(swaps.keep[~ok, c], keep[~ok])      # not built: the set itself


def test_reward_evaluations_equal_what_is_reported():
    scores, modality, value = toy(seed=2)
    for candidates, rounds in ((7, 2), (7, 7), (4, 1), (9, 3)):
        log = []
        found = search(scores, modality, value, 6, log, candidates=candidates, rounds=rounds)
        assert len(log) == found.calls == rounds
        assert sum(s[1] for s in log) == found.passes == 1 + candidates
        assert all(s[0] == scores.shape[0] for s in log)
        assert found.delta_reward.shape == (scores.shape[0], candidates)
    assert round_sizes(7, 2) == [4, 3] and round_sizes(8, 8) == [1] * 8
    assert candidate_types(TYPES, [4, 3]) == [TYPES, TYPES[:3]]
    assert candidate_types(TYPES, [1, 1, 1, 1, 1]) == [[t] for t in TYPES + TYPES[:1]]
    with pytest.raises(ValueError, match="candidates"):
        round_sizes(2, 3)


def test_cider_plus_fidelity_compares_rounds_on_one_scale():
    """Each reward call breaks CIDEr's ties among its own sets: the search recomputes the
    tie-break over the current set and the round's candidates, so a candidate that ties CIDEr
    and has the higher fidelity is accepted, and one with lower CIDEr never is."""
    scores, modality, _ = toy(batch=1, seed=4)
    fid = torch.randn(1, 20, generator=torch.Generator().manual_seed(1))

    def evaluate(sets):
        cider = torch.full(sets.shape[:2], 10.0)     # every set ties CIDEr
        dense = (sets.double() * fid[:, None]).sum(-1).float()
        # a per-call tie-break, as set_rewards returns it: not comparable across calls
        return Rewards(cider + torch.rand(sets.shape[:2]), cider, dense)
    start = topk_keep(scores, torch.tensor([6]))
    found = run_search(scores, start, modality, evaluate, reward="cider+fidelity", types=TYPES,
                       g=2, candidates=8, rounds=8, deep=0.5, seed=0)
    final, first = (found.final.double() * fid).sum(), (start.double() * fid).sum()
    assert final >= first and (found.accepted > 0).all() == bool(final > first)
    assert found.final_reward.item() == found.start_reward.item() == 10.0   # CIDEr's points


def test_distillation_gradient_raises_the_final_set_and_lowers_the_rest():
    """float64: every member of the final set gets a score-raising gradient, every other token
    a lowering one (padding none), for both forms."""
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 24, generator=gen, dtype=torch.float64)
    scores[2, 20:] = float("-inf")
    final = torch.zeros(3, 24, dtype=torch.bool)
    final[0, [0, 5, 9]] = final[1, [3, 4, 22, 23]] = final[2, [1, 2, 19]] = True
    final[1] &= scores[1] < scores[1].median()   # members the scores rank low
    present = torch.isfinite(scores)
    for form in ("pl", "bce"):
        leaf = scores.clone().requires_grad_()
        loss = distill_loss(leaf, final, tau=0.5, form=form)
        assert loss.dtype == torch.float64 and torch.isfinite(loss).all()
        loss.sum().backward()
        grad = leaf.grad
        assert (grad[final] < 0).all(), form
        assert (grad[present & ~final] > 0).all(), form
        assert (grad[~present] == 0).all()
    empty = torch.zeros_like(final)
    assert torch.equal(distill_loss(scores, empty, tau=1.0), torch.zeros(3, dtype=torch.float64))


def test_swap_delta_f_is_the_group_score_difference():
    scores = torch.arange(10.0)[None].requires_grad_()
    removed, inserted = torch.tensor([[[1, 2], [0, 0]]]), torch.tensor([[[7, 9], [3, 3]]])
    delta = swap_delta_f(scores, removed, inserted, torch.tensor([[True, False]]))
    assert delta.tolist() == [[(1 + 2) - (7 + 9), 0.0]]


@pytest.mark.parametrize("settings,match", [
    (dict(search_rounds=0), "search_rounds must be >= 1, got 0"),
    (dict(search_candidates=1, search_rounds=2), r"search_candidates \(1\) must be at least "
                                                 r"search_rounds \(2\)"),
    (dict(search_deep=1.5), r"search_deep must be .*in \[0, 1\], got 1.5"),
    (dict(distill_weight=-1.0), "distill_weight must be a finite number >= 0, got -1"),
    (dict(distill_loss="kl"), "distill_loss must be one of .* got 'kl'"),
    (dict(exchange_search=True, exchanges=True), "exchange_search and exchanges"),
    (dict(exchange_search=True, lambda_best=0.5), "lambda_best = 0.5"),
    (dict(exchange_search=True, exchange_types=[]), "exchange_types is empty"),
])
def test_bad_search_settings_are_refused_by_name(settings, match):
    with pytest.raises((ValueError, TypeError), match=match):
        TrainConfig(**settings).validate()


def test_search_flags_without_the_search_are_refused(tmp_path, capsys):
    from avex.train import main

    with pytest.raises(SystemExit) as stop:
        main(["--run-dir", str(tmp_path / "run"), "--search-rounds", "3"])
    assert stop.value.code == 2
    assert "search_rounds = 3 has no effect without the exchange search" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--run-dir", str(tmp_path / "run"), "--exchange-search", "--lambda-ex", "0.5"])
    assert "lambda_ex = 0.5 has no effect" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_ablation_variants_of_the_matched_budget():
    from avex.evaluate.ablation import ABLATIONS

    for arm in ("S", "A-fid", "B-fid", "C-fid", "S-fid"):
        TrainConfig(**ABLATIONS[arm][2]).validate()
    s = TrainConfig(**ABLATIONS["S"][2])
    assert s.exchange_search and 1 + s.search_candidates == ABLATIONS["A"][2]["anchors"] == 8
    for arm in ("A", "B", "C", "S"):
        fid = ABLATIONS[f"{arm}-fid"][2]
        assert fid == {**ABLATIONS[arm][2], "reward": "fidelity"}


# ----------------------------------------------------------------------------------------------
# A tiny run of the arm
# ----------------------------------------------------------------------------------------------

def tiny_args(cache_dir, run_dir, *extra):
    return ["--benchmark-preset", "tiny", "--captioner-preset", "tiny",
            "--cache-dir", str(cache_dir), "--run-dir", str(run_dir), "--batch-size", "8",
            "--micro-batch-size", "4", "--epochs", "1", "--warmup-epochs", "0.5",
            "--no-progress", "--seed", "3", "--no-evaluate", "--checkpoint-every", "1",
            "--exchange-search", "--search-rounds", "2", "--search-candidates", "5", *extra]


def weights(run_dir) -> dict:
    latest = (Path(run_dir) / "checkpoints" / "latest").read_text().strip()
    return load_file(str(Path(run_dir) / "checkpoints" / latest / "policy.safetensors"))


def rl_records(run_dir) -> list[dict]:
    records = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").open()]
    return [r for r in records if r["phase"] == "rl"]


@pytest.mark.slow
@pytest.mark.parametrize("reward", ["cider", "fidelity", "cider+fidelity"])
def test_tiny_search_run_logs_and_resumes_exactly(tiny_cache_dir, tmp_path, monkeypatch,
                                                  reward):
    """The arm trains on the tiny benchmark under each reward and logs what its searches did;
    a run stopped after RL step 2 (as SIGINT stops it: a checkpoint at the step boundary) and
    resumed ends bit-identical to the uninterrupted one, with the same metrics."""
    from avex.training.run_records import RunRecords
    from avex.train import main

    whole = tmp_path / "whole"
    main(tiny_args(tiny_cache_dir, whole, "--reward", reward))
    rl = rl_records(whole)
    assert len(rl) >= 4
    for r in rl:
        assert r["search_passes"] == 6 and r["search_calls"] == 2
        assert 0 <= r["search_tied"] <= 1 and 0 <= r["search_valid"] <= 1
        assert 0 <= r["search_accepted"] <= 2 and r["search_gain"] >= -1e-4
        assert r["reward_diagnostics"] and "exchange" in r and "distill" in r
    assert any(r["search_accepted"] > 0 for r in rl)
    assert json.loads((whole / "config.json").read_text())["exchange_search"] is True
    assert (whole / "exchange_calibration.json").is_file()
    assert (whole / "policy").is_dir() and (whole / "exchange_diagnostics.json").is_file()

    logged = RunRecords.log

    def log(self, record):
        logged(self, record)
        if record.get("phase") == "rl" and record["step"] == 2:
            self.cut = True
    monkeypatch.setattr(RunRecords, "log", log)
    monkeypatch.setattr(RunRecords, "stop_requested", lambda self: getattr(self, "cut", False))
    cut = tmp_path / "cut"
    with pytest.raises(SystemExit):
        main(tiny_args(tiny_cache_dir, cut, "--reward", reward))
    monkeypatch.undo()
    assert len(rl_records(cut)) == 3 and not (cut / "policy").exists()
    main(["--resume", "--run-dir", str(cut), "--no-progress"])
    first, again = weights(whole), weights(cut)
    for name in first:
        assert torch.equal(first[name], again[name]), name
    strip = (lambda rs: [{k: v for k, v in r.items() if k != "time"} for r in rs])
    assert strip(rl_records(cut)) == strip(rl)
