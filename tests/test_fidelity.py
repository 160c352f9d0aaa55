"""The fidelity reward (issue #36): teacher-forced log p(y_full | S) and margins against a plain
per-set loop, the margins' promise about greedy decoding, y_full's cache, the reward forms, the
tie-break of cider+fidelity, the rewards inside the RL step, the diagnostics, and training with
a fidelity reward, on a label-free cache included."""
import dataclasses
import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from avex import fidelity
from avex.captioner import FrozenCaptioner
from avex.captioner.batch import TeacherForced
from avex.data import CacheWriter, FeatureCache
from avex.fidelity import break_ties, fidelity_reward, full_captions, grounded_fidelity
from avex.kernels import gumbel_topk
from avex.modality import AUDIO, PAD, TEXT, VISUAL
from avex.reward import CiderD
from avex.selection import AVLayout, indices_to_keep
from avex.train import main
from avex.training.config import TrainConfig
from avex.training.exchange_diagnostics import anchor_statistics, exchange_statistics
from avex.training.steps import rl_loss, set_rewards


@pytest.fixture(scope="module")
def tiny(tiny_cache_dir, tiny_benchmark, tiny_captioner):
    """(cache root, feature cache, captioner) of the session's tiny benchmark."""
    return tiny_cache_dir, FeatureCache(tiny_benchmark), FrozenCaptioner.load(tiny_captioner,
                                                                              device="cpu")


def clips_of(cache, split="train", count=6):
    part = cache.split(split)
    return [part[i] for i in range(count)]


def random_sets(layout, retentions, per_retention, seed=0):
    """bool [B, S, M]: Gumbel-Top-K sets of random scores at each retention, then full tokens."""
    rows, width = layout.modality.shape
    scores = torch.randn(rows, width, generator=torch.Generator().manual_seed(seed))
    sets = []
    for i, retention in enumerate(retentions):
        budget = layout.budget(retention)
        index, _ = gumbel_topk(scores.repeat_interleave(per_retention, 0),
                               budget.repeat_interleave(per_retention), seed=seed + i)
        sets.append(indices_to_keep(index.view(rows, per_retention, -1), width))
    return torch.cat(sets + [(layout.modality >= 0)[:, None]], dim=1)


def full_tokens(captioner, batch, max_new_tokens=24):
    everything = AVLayout.of(batch.modality).modality >= 0
    return [row[0] for row in captioner.keep_set_tokens(
        batch.inputs_embeds, batch.modality, everything[:, None], max_new_tokens=max_new_tokens,
        position_ids=batch.native_position_ids)]


def reference_scores(model, batch, av_keep, targets, positions):
    """The plain loop: per sample and set, the unpadded row's text and kept AV tokens at
    ``positions`` [B, L] (their own), then the target's tokens at the row's last position + 1
    + t, one Hugging Face forward each. Returns log p and margins [B, S, T] (T: each target)."""
    log_probs, margins = [], []
    for b in range(av_keep.shape[0]):
        mod = batch.modality[b]
        present = mod != PAD
        av_index = torch.cumsum(((mod == VISUAL) | (mod == AUDIO)).long(), 0) - 1
        target = torch.tensor(targets[b])
        rows_lp, rows_margin = [], []
        for s in range(av_keep.shape[1]):
            kept = present & ((mod == TEXT) | (((mod == VISUAL) | (mod == AUDIO))
                                               & av_keep[b, s][av_index.clamp_min(0)]))
            last = positions[b][present].max()
            embeds = torch.cat([batch.inputs_embeds[b][kept],
                                model.get_input_embeddings()(target)])[None]
            pos = torch.cat([positions[b][kept],
                             last + 1 + torch.arange(len(target))])[None]
            with torch.no_grad():
                logits = model(inputs_embeds=embeds, position_ids=pos).logits[0].double()
            step_logits = logits[int(kept.sum()) - 1:-1]                    # [T, V]
            lp = torch.log_softmax(step_logits, -1)[torch.arange(len(target)), target]
            chosen = step_logits[torch.arange(len(target)), target]
            others = step_logits.clone()
            others[torch.arange(len(target)), target] = -math.inf
            rows_lp.append(lp)
            rows_margin.append(chosen - others.max(-1).values)
        log_probs.append(rows_lp)
        margins.append(rows_margin)
    return log_probs, margins


@pytest.mark.parametrize("native", [False, True])
def test_teacher_forced_matches_a_plain_loop_over_sets(tiny, native):
    """One batched forward over every set gives what a per-set Hugging Face forward gives,
    with the batch's count of tokens as positions, or with positions of the model's own
    (``native``: gaps inside the row, as a model's own positions may have)."""
    _, cache, captioner = tiny
    batch = captioner.embed(clips_of(cache, count=3))
    layout = AVLayout.of(batch.modality)
    sets = random_sets(layout, (0.2, 0.5), 2)
    targets = full_tokens(captioner, batch)
    targets[1] = targets[1][:3]  # targets of several lengths
    positions = batch.position_ids
    native_positions = None
    if native:  # 0, 1, 2, ... with a jump of 7 after every 5th real token
        real = batch.attention_mask.cumsum(1) - 1
        positions = (real + 7 * (real // 5)).clamp_min(0) * batch.attention_mask
        native_positions = positions
    got = captioner.teacher_forced(batch.inputs_embeds, batch.modality, sets, targets,
                                   position_ids=native_positions)
    ref_lp, ref_margin = reference_scores(captioner.model, batch, sets, targets, positions)
    assert got.token_log_prob.shape == got.margin.shape == (3, sets.shape[1], max(map(len, targets)))
    assert got.length.tolist() == [len(t) for t in targets]
    for b, target in enumerate(targets):
        steps = len(target)
        for s in range(sets.shape[1]):
            torch.testing.assert_close(got.token_log_prob[b, s, :steps].double(), ref_lp[b][s],
                                       atol=1e-5, rtol=0)
            torch.testing.assert_close(got.margin[b, s, :steps].double(), ref_margin[b][s],
                                       atol=1e-5, rtol=0)
            assert torch.all(got.token_log_prob[b, s, steps:] == 0)
            assert torch.all(got.margin[b, s, steps:] == math.inf)
            assert got.mean_log_prob[b, s].item() == pytest.approx(
                ref_lp[b][s].mean().item(), abs=1e-5)


def test_positive_margins_are_greedy_reproducing_y_full(tiny):
    """Every margin > 0 under a set iff greedy decoding under it writes y_full exactly (steps
    whose margin is within 1e-4 of 0, a tie up to float error, are left out)."""
    _, cache, captioner = tiny
    batch = captioner.embed(clips_of(cache, count=8))
    layout = AVLayout.of(batch.modality)
    sets = random_sets(layout, (0.1, 0.3, 0.6, 0.9), 3, seed=5)
    targets = full_tokens(captioner, batch)
    scored = captioner.teacher_forced(batch.inputs_embeds, batch.modality, sets, targets)
    generated = captioner.keep_set_tokens(batch.inputs_embeds, batch.modality, sets,
                                          max_new_tokens=24)
    outcomes = []
    for b, target in enumerate(targets):
        for s in range(sets.shape[1]):
            if bool((scored.margin[b, s].abs() < 1e-4).any()):
                continue
            outcomes.append(bool(scored.reproduces[b, s]))
            assert outcomes[-1] == (generated[b][s] == target), (b, s)
    assert any(outcomes) and not all(outcomes)   # both kinds of set were seen
    assert bool(scored.reproduces[:, -1].all())  # full tokens write y_full


def test_teacher_forced_refuses_bad_input(tiny):
    _, cache, captioner = tiny
    batch = captioner.embed(clips_of(cache, count=2))
    sets = random_sets(AVLayout.of(batch.modality), (0.5,), 1)
    vocab = captioner.model.get_input_embeddings().num_embeddings
    args = (batch.inputs_embeds, batch.modality)
    with pytest.raises(ValueError, match="targets has 1 sequences but av_keep has 2 samples"):
        captioner.teacher_forced(*args, sets, [[4, 2]])
    with pytest.raises(ValueError, match=r"targets\[1\] must be a non-empty list of token ids"):
        captioner.teacher_forced(*args, sets, [[4, 2], []])
    with pytest.raises(ValueError, match=rf"in \[0, {vocab}\), got \[4, {vocab}\]"):
        captioner.teacher_forced(*args, sets, [[4, 2], [4, vocab]])
    with pytest.raises(TypeError, match="targets must be a list of B token id sequences"):
        captioner.teacher_forced(*args, sets, torch.tensor([[4, 2], [4, 2]]))
    with pytest.raises(TypeError, match="av_keep must be"):
        captioner.teacher_forced(*args, sets.float(), [[4, 2], [4, 2]])


def test_full_captions_are_the_evaluations_and_cached_by_what_they_depend_on(tiny, tmp_path,
                                                                                monkeypatch):
    """y_full is the full-token caption the evaluation writes (token ids with their EOS),
    generated once per captioner, benchmark, split and decoding, then read from the cache."""
    _, cache, captioner = tiny
    full = full_captions(captioner, cache, "test", cache_dir=tmp_path)
    clips = list(cache.split("test"))
    assert [full.texts[c.clip_id] for c in clips] == captioner.caption(clips, max_new_tokens=24)
    for clip, tokens in zip(clips, full.targets(clips)):
        assert captioner.decode(tokens) == full.texts[clip.clip_id]
        assert (tokens[-1] == captioner.eos_token_id) == (len(tokens) < 25)
        assert captioner.eos_token_id not in tokens[:-1]
    files = list((tmp_path / "full_captions").glob("*.json"))
    assert len(files) == 1
    identity = json.loads(files[0].read_text())["identity"]
    assert (identity["split"], identity["num_beams"], identity["max_new_tokens"]) == \
        ("test", 1, 24)

    def no_generation(*args, **kwargs):
        raise AssertionError("y_full was generated again")
    monkeypatch.setattr(fidelity, "_generate", no_generation)
    assert full_captions(captioner, cache, "test", cache_dir=tmp_path) == full
    monkeypatch.undo()
    short = full_captions(captioner, cache, "test", cache_dir=tmp_path, max_new_tokens=3)
    assert len(list((tmp_path / "full_captions").glob("*.json"))) == 2
    assert all(len(t) <= 3 for t in short.tokens.values())
    with pytest.raises(KeyError, match="no full-token caption for clip 'train-00000'"):
        full.targets(clips_of(cache, count=1))


def test_fidelity_reward_forms():
    """logp: 100 x the mean log p per token; margin: -100 x the mean hinge max(0, 1 - m),
    steps past a target's end counting in neither."""
    log_prob = torch.tensor([[[-0.5, -1.5, 0.0], [-0.1, -0.1, -0.4]]])     # [1, 2, 3]
    margin = torch.tensor([[[2.0, -1.0, math.inf], [0.5, 3.0, 0.0]]])
    scored = TeacherForced(log_prob, margin, torch.tensor([3]))
    assert fidelity_reward(scored, "logp")[0].tolist() == pytest.approx([-200 / 3, -20.0])
    assert fidelity_reward(scored, "margin")[0].tolist() == pytest.approx([-200 / 3, -50.0])
    short = TeacherForced(log_prob[:, :1, :2], margin[:, :1, :2], torch.tensor([2]))
    assert fidelity_reward(short, "logp")[0].tolist() == pytest.approx([-100.0])
    assert scored.reproduces.tolist() == [[False, False]]
    with pytest.raises(ValueError, match="form must be one of"):
        fidelity_reward(scored, "hinge")


def test_the_grounded_form_weights_tokens_by_their_av_evidence():
    """Each token weighs max(0, log p | full - log p | none): a token the prompt alone predicts
    (or the AV tokens make less likely) counts for nothing; a clip whose AV tokens help no
    token scores 0; steps past a target's end weigh 0 (their log p is 0 under every set)."""
    # one clip, sets: two scored sets, then its full and its empty set; 3 steps, the last past
    # the end of a 2-step target
    log_prob = torch.tensor([[[-1.0, -2.0, 0.0], [-0.5, -4.0, 0.0],
                              [-0.1, -0.2, 0.0], [-0.1, -3.2, 0.0]]], dtype=torch.float64)
    scored = TeacherForced(log_prob, torch.zeros_like(log_prob), torch.tensor([2]))
    # token 0: evidence 0 (full = none); token 1: evidence 3.0
    assert grounded_fidelity(scored)[0].tolist() == pytest.approx([-200.0, -400.0])
    unhelpful = log_prob.clone()
    unhelpful[0, 2] = unhelpful[0, 3] - torch.tensor([0.5, 0.1, 0.0], dtype=torch.float64)
    blind = TeacherForced(unhelpful, torch.zeros_like(log_prob), torch.tensor([2]))
    assert grounded_fidelity(blind)[0].tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="its full and its empty set: got 2 sets"):
        grounded_fidelity(TeacherForced(log_prob[:, :2], log_prob[:, :2], torch.tensor([2])))


def test_set_rewards_of_the_grounded_form_score_each_set_against_full_and_empty(tiny):
    """set_rewards appends each clip's full and empty AV set to one teacher-forced pass and
    returns the grounded reward of the given sets only; it is the plain per-token computation
    from three separate passes."""
    _, cache, captioner = tiny
    clips = clips_of(cache, count=3)
    batch = captioner.embed(clips)
    layout = AVLayout.of(batch.modality)
    sets = random_sets(layout, (0.2, 0.4), 2)
    targets = full_tokens(captioner, batch)
    got = set_rewards(TrainConfig(fidelity_form="grounded"), captioner, None, batch, clips,
                      sets, targets)
    assert got.reward.shape == sets.shape[:2]
    real = (layout.modality != PAD)[:, None]
    parts = [captioner.teacher_forced(batch.inputs_embeds, batch.modality, keep, targets)
             .token_log_prob for keep in (sets, real, torch.zeros_like(real))]
    weight = (parts[1][:, 0] - parts[2][:, 0]).clamp_min(0)
    expected = 100 * (parts[0] * weight[:, None]).sum(-1) / weight.sum(-1, keepdim=True)
    torch.testing.assert_close(got.reward, expected.float(), rtol=1e-4, atol=1e-3)
    assert bool((weight.sum(-1) > 0).all())   # the tiny captioner's AV tokens do help


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_the_tie_break_never_reorders_sets_whose_cider_differs(data):
    """cider+fidelity: sets whose CIDEr differs keep their order (strictly, and after rounding
    to float32 at worst merged); sets that tie are ordered by the dense term."""
    rows, sets = data.draw(st.integers(1, 3)), data.draw(st.integers(2, 9))
    levels = [0.0, 12.5, 12.5 + 1e-7, 13.0, 400.0, 400.25]
    primary = torch.tensor(data.draw(st.lists(st.sampled_from(levels), min_size=rows * sets,
                                              max_size=rows * sets)),
                           dtype=torch.float64).view(rows, sets)
    secondary = torch.tensor(data.draw(st.lists(
        st.floats(-300, 0, allow_nan=False), min_size=rows * sets, max_size=rows * sets)),
        dtype=torch.float64).view(rows, sets)
    combined = break_ties(primary, secondary)
    assert combined.dtype == torch.float64
    single = combined.float()
    for b in range(rows):
        span = combined[b] - primary[b]
        assert bool((span >= 0).all()) and bool((span <= fidelity.TIE_BREAK_POINTS).all())
        for i in range(sets):
            for j in range(sets):
                if primary[b, i] < primary[b, j]:
                    assert combined[b, i] < combined[b, j]
                    assert single[b, i] <= single[b, j]
                elif primary[b, i] == primary[b, j] and secondary[b, i] < secondary[b, j]:
                    assert combined[b, i] <= combined[b, j]
    # a clip whose sets all tie under CIDEr is ordered by the dense term alone
    tied = break_ties(torch.full((1, 3), 50.0), torch.tensor([[-3.0, -1.0, -2.0]]))
    assert tied.argsort().tolist() == [[0, 2, 1]]
    assert tied.tolist() == [[50.0, 51.0, 50.5]]


def test_break_ties_refuses_bad_input():
    with pytest.raises(ValueError, match=r"secondary has shape \[2, 3\] but primary has \[2, 2\]"):
        break_ties(torch.zeros(2, 2), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="secondary must be finite"):
        break_ties(torch.zeros(1, 2), torch.tensor([[0.0, math.nan]]))


@pytest.mark.parametrize("reward", ["cider", "fidelity", "cider+fidelity"])
def test_set_rewards_are_the_selected_reward(tiny, reward, monkeypatch):
    """cider: CIDEr x 100 of the generated captions, no teacher forcing; fidelity: 100 x mean
    log p(y_full | S), no generation; cider+fidelity: CIDEr with its ties broken by it."""
    _, cache, captioner = tiny
    clips = clips_of(cache, count=4)
    batch = captioner.embed(clips)
    sets = random_sets(AVLayout.of(batch.modality), (0.2, 0.4), 3)
    cider = CiderD(corpus_references=[c.refs_av for c in cache.split("train")], tokenize=True)
    targets = full_tokens(captioner, batch)
    cfg = TrainConfig(reward=reward)
    captions = captioner.caption_keep_sets(batch.inputs_embeds, batch.modality, sets)
    by_cider = torch.tensor(100.0 * cider.score([c for row in captions for c in row],
                                                [c.refs_av for c in clips for _ in range(7)]))
    dense = fidelity_reward(captioner.teacher_forced(batch.inputs_embeds, batch.modality, sets,
                                                     targets))

    def refuse(name):
        def call(*args, **kwargs):
            raise AssertionError(f"{name} under reward {reward!r}")
        return call
    if reward == "fidelity":
        monkeypatch.setattr(captioner, "generate_tokens", refuse("generation"))
    if reward == "cider":
        monkeypatch.setattr(captioner, "teacher_forced", refuse("teacher forcing"))
    got = set_rewards(cfg, captioner, cider, batch, clips, sets,
                      None if reward == "cider" else targets)
    expected = {"cider": by_cider.float().view(4, 7), "fidelity": dense,
                "cider+fidelity": break_ties(by_cider.view(4, 7), dense).float()}[reward]
    assert torch.equal(got.reward, expected)
    assert got.reward.dtype == torch.float32
    assert (got.cider is None) == (reward == "fidelity")
    assert (got.fidelity is None) == (reward == "cider")


@pytest.mark.parametrize("estimator,exchanges", [("rloo", False), ("group", False),
                                                 ("paper", True), ("rloo", True)])
def test_rl_step_trains_on_fidelity_without_generating(tiny, estimator, exchanges, monkeypatch):
    """Every estimator and the exchange term take the fidelity reward; a step generates no
    caption unless it is a diagnostic step (then CIDEr is compared with it)."""
    from avex.policy import AVEXPolicy

    _, cache, captioner = tiny
    clips = clips_of(cache, count=4)
    batch = captioner.embed(clips)
    cider = CiderD(corpus_references=[c.refs_av for c in cache.split("train")], tokenize=True)
    cfg = TrainConfig(reward="fidelity", rl_estimator=estimator, exchanges=exchanges,
                      anchors=4 if estimator != "paper" else 2, normalize_exchange=False)
    torch.manual_seed(0)
    policy = AVEXPolicy.from_llm(captioner.model)
    targets = full_tokens(captioner, batch)
    generate = captioner.generate_tokens
    calls = []
    monkeypatch.setattr(captioner, "generate_tokens",
                        lambda *a, **k: calls.append(1) or generate(*a, **k))
    terms = rl_loss(cfg, policy, captioner, cider, batch, clips, seed=3, retention=0.3,
                    full_tokens=targets)
    assert not calls
    terms["loss"].backward()
    grads = [p.grad for p in policy.parameters() if p.grad is not None]
    assert grads and all(bool(torch.isfinite(g).all()) for g in grads)
    assert sum(float(g.abs().sum()) for g in grads) > 0
    assert terms["reward"] < 0   # 100 x a mean log-probability
    ties = terms["reward_diagnostics"]
    assert (ties["retention"], ties["groups"]) == (0.3, 4) and 0 <= ties["tied"] <= 1
    assert "agree" not in ties
    if exchanges:
        for stats in terms["diagnostics"]["types"].values():
            assert stats["cider_zero"] is None and stats["agree"] is None
    diagnosed = rl_loss(cfg, policy, captioner, cider, batch, clips, seed=3, retention=0.3,
                        full_tokens=targets, diagnose=True)
    assert calls and diagnosed["loss"].item() == pytest.approx(terms["loss"].item(), rel=1e-6)
    ties = diagnosed["reward_diagnostics"]
    assert 0 <= ties["cider_tied"] <= 1 and ties["cider_mean"] >= 0
    assert ties["agree"] is None or 0 <= ties["agree"] <= 1
    if exchanges:
        assert any(s["cider_zero"] is not None for s in diagnosed["diagnostics"]["types"].values())
    with pytest.raises(ValueError, match="reward 'fidelity' needs y_full's token ids"):
        rl_loss(cfg, policy, captioner, cider, batch, clips, seed=3, retention=0.3)


def test_anchor_and_exchange_statistics():
    rewards = torch.tensor([[1.0, 1.0, 1.0], [1.0, 2.0, 1.0]])
    cider = torch.tensor([[5.0, 5.0, 5.0], [0.0, 3.0, 1.0]])
    dense = torch.tensor([[-1.0, -2.0, -3.0], [-5.0, -1.0, -4.0]])
    got = anchor_statistics(rewards, 0.2, 8, cider=cider, dense=dense)
    # pairs of row 1 whose CIDEr differs: (0,1) -3 vs -4: agree; (0,2) -1 vs -1: agree;
    # (1,2) 2 vs 3: agree; row 0: none
    assert got == {"retention": 0.2, "k": 8, "groups": 2, "tied": 0.5, "cider_tied": 0.5,
                   "cider_mean": pytest.approx(19 / 6), "pairs": 3, "agree": 1.0}
    flipped = anchor_statistics(rewards, 0.2, 8, cider=cider, dense=-dense)
    assert flipped["agree"] == 0.0
    assert anchor_statistics(rewards[:, :1], 0.5, 4)["tied"] is None   # one anchor: no group
    delta = torch.tensor([[0.5, 0.0, -1.0, 2.0]])
    stats = exchange_statistics(delta, torch.zeros(1, 4), torch.tensor([[True] * 4]),
                                torch.full((1, 4), 2), torch.tensor([8]), ["vv", "vv", "aa", "aa"],
                                cider_delta=torch.tensor([[1.0, 0.0, 0.0, -3.0]]),
                                dense_delta=delta)
    assert (stats["vv"]["cider_zero"], stats["vv"]["agree"]) == (0.5, 1.0)
    assert (stats["aa"]["cider_zero"], stats["aa"]["agree"]) == (0.5, 0.0)


# ----------------------------------------------------------------------------------------------
# Training with the fidelity reward
# ----------------------------------------------------------------------------------------------

def tiny_args(root, run_dir, *extra):
    return ["--benchmark-preset", "tiny", "--captioner-preset", "tiny", "--cache-dir", str(root),
            "--run-dir", str(run_dir), "--batch-size", "8", "--micro-batch-size", "4",
            "--epochs", "0.5", "--warmup-epochs", "0.5", "--no-progress", "--seed", "3", *extra]


def test_fidelity_run_calibrates_w_on_its_own_scale_and_reports_its_ties(tiny, tmp_path):
    """--reward fidelity with the exchange term: w saturates at the median non-zero |dR|
    measured at the start of RL; every RL line logs its groups' ties; the report plots them."""
    root, _, _ = tiny
    run = tmp_path / "run"
    main(tiny_args(root, run, "--reward", "fidelity", "--fidelity-form", "margin",
                   "--exchanges", "--diagnostics-every", "2", "--no-evaluate"))
    calibration = json.loads((run / "exchange_calibration.json").read_text())
    assert (calibration["reward"], calibration["fidelity_form"], calibration["percentile"]) == \
        ("fidelity", "margin", 50)
    assert calibration["saturation"] > 0 and calibration["nonzero"] <= calibration["exchanges"]
    rl = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    rl = [r for r in rl if r["phase"] == "rl"]
    assert rl and all(len(r["reward_diagnostics"]) == 2 for r in rl)
    assert all(r["reward"] <= 0 for r in rl)   # the margin form: 0 at best
    diagnostic = [m for r in rl if r["step"] % 2 == 0 for m in r["reward_diagnostics"]]
    assert all("cider_tied" in m for m in diagnostic)
    assert not any("cider_tied" in m for r in rl if r["step"] % 2 for m in r["reward_diagnostics"])
    summary = json.loads((run / "exchange_diagnostics.json").read_text())
    assert set(summary) == {"vv", "aa", "va", "av", "total", "anchors"}
    assert summary["anchors"]["all"]["micro_batches"] == 2 * len(rl)
    assert (run / "exchange_diagnostics.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((run / "config.json").read_text())["reward"] == "fidelity"
    with pytest.raises(SystemExit):   # a run's reward is its own: resuming with another
        main(tiny_args(root, run, "--resume", "--reward", "cider"))


def label_free_cache(cache, root, bare=("train", "test")) -> FeatureCache:
    """The tiny benchmark's train and test clips with the references of the ``bare`` splits
    dropped."""
    with CacheWriter(root, dim=cache.meta.dim, n_frames=cache.meta.n_frames) as writer:
        for split, count in (("train", 16), ("test", 4)):
            for clip in clips_of(cache, split, count):
                writer.add(clip.clip_id, split, clip.visual, clip.audio,
                           refs_av=[] if split in bare else clip.refs_av,
                           prompt_prefix_ids=clip.prompt_prefix_ids,
                           prompt_suffix_ids=clip.prompt_suffix_ids)
    return FeatureCache(root)


def test_label_free_cache_trains_on_fidelity_and_is_refused_cider(tiny, tiny_captioner, tmp_path,
                                                                  capsys):
    """A cache without references: --reward cider (and cider+fidelity) is refused before any
    work, naming the setting; --reward fidelity trains and the table reports fidelity."""
    root, cache, _ = tiny
    data = tmp_path / "label-free"
    assert label_free_cache(cache, data).split("train").references() == [[]] * 16
    common = ["--data", str(data), "--captioner", str(tiny_captioner), "--cache-dir",
              str(tmp_path / "cache"), "--batch-size", "8", "--micro-batch-size", "4",
              "--epochs", "0.5", "--warmup-epochs", "0.5", "--no-progress", "--anchors", "2"]
    for reward in ("cider", "cider+fidelity"):
        with pytest.raises(SystemExit) as stop:
            main([*common, "--run-dir", str(tmp_path / reward), "--reward", reward])
        assert stop.value.code == 2
        assert f"reward = {reward!r} scores captions against reference captions, but 16 of 16 " \
               "train clips" in capsys.readouterr().err
        assert not (tmp_path / reward).exists()
    # CaCoVID-AV trains with CIDEr whatever the run's reward: asked for by name, refused
    # before any work; in the default rows, left out with a note
    with pytest.raises(SystemExit) as stop:
        main([*common, "--run-dir", str(tmp_path / "asked"), "--eval-methods", "random,cacovid"])
    assert stop.value.code == 2
    assert ("eval_methods = ['random', 'cacovid']: CaCoVID-AV trains with its own reward, CIDEr "
            "against reference captions, but 16 of 16 train clips") in capsys.readouterr().err
    assert not (tmp_path / "asked").exists()
    results = main([*common, "--run-dir", str(tmp_path / "run"), "--reward", "fidelity",
                    "--eval-retentions", "0.4"])
    assert "note: the table leaves CaCoVID-AV out: CaCoVID-AV trains with its own reward" in \
        capsys.readouterr().out
    assert json.loads((tmp_path / "run" / "config.json").read_text())["eval_methods"] == \
        ["random", "attention"]
    rows = {r["method"]: r for r in results["rows"]}
    assert set(rows) == {"Full tokens", "Random", "Attention-AV (balanced; privileged reference)",
                         "warmup only",
                         "AVEX, L_RL (RLOO), fidelity reward, set-aware selection, dropped "
                         "tokens merged from cosine 0.8 (this run)"}
    assert rows["Full tokens"]["exact"] == 100.0 and rows["Full tokens"]["log_prob"] < 0
    for row in rows.values():
        assert 0 <= row["exact"] <= 100 and row["log_prob"] <= 0
    assert "y_full exact (%)" in results["table"] and "C_av" not in results["table"]


def test_evaluate_refuses_a_label_free_split_before_captioning(tiny, tiny_captioner, tmp_path,
                                                               capsys):
    """python -m avex.evaluate scores C_av, so clips without references are refused by name
    before any caption is written, pointing to the training table that scores them; the
    command prints it as a usage error, without a traceback."""
    from avex.evaluate.__main__ import cli
    from avex.evaluate.__main__ import main as evaluate_main
    root, cache, _ = tiny
    data = tmp_path / "label-free"
    label_free_cache(cache, data)
    for command in ("sweep", "ablation"):
        out = tmp_path / command
        with pytest.raises(ValueError, match=r"test split of .*label-free: 4 of 4 clips have no "
                           r"reference captions \(e\.g\. clip 'test-00000'\), and python -m "
                           r"avex\.evaluate scores C_av against them\. A label-free cache is "
                           r"scored by python -m avex\.train's own table"):
            evaluate_main([command, "--data", str(data), "--captioner", str(tiny_captioner),
                           "--cache-dir", str(tmp_path / "cache"), "--retentions", "0.4",
                           "--seeds", "0", "--out", str(out), "--no-progress",
                           *(["--methods", "random", "--transfer-split", "none"]
                             if command == "sweep" else ["--variants", "A"])])
        assert not out.exists()
    capsys.readouterr()
    assert cli(["sweep", "--data", str(data), "--captioner", str(tiny_captioner), "--cache-dir",
                str(tmp_path / "cache"), "--methods", "random", "--transfer-split", "none",
                "--out", str(tmp_path / "cli"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "python -m avex.evaluate: error: test split of " in err
    assert "Traceback" not in err and not (tmp_path / "cli").exists()


def test_evaluate_refuses_training_cider_on_train_clips_without_references(tiny, tiny_captioner,
                                                                           tmp_path):
    """Test clips with references, train clips without: a method or variant that would train
    with CIDEr is refused by name before any run starts, as python -m avex.train refuses it."""
    from avex.evaluate.__main__ import main as evaluate_main
    root, cache, _ = tiny
    data = tmp_path / "train-label-free"
    label_free_cache(cache, data, bare=("train",))
    common = ["--data", str(data), "--captioner", str(tiny_captioner), "--cache-dir",
              str(tmp_path / "cache"), "--retentions", "0.4", "--seeds", "0", "--no-progress"]
    cases = [(["sweep", "--methods", "random,avex,cacovid", "--transfer-split", "none"],
              r"--methods cacovid: reward = 'cider' scores captions against reference captions, "
              r"but 16 of 16 train clips"),
             (["ablation", "--variants", "Dc-fid,Cc"],
              r"variant Cc \(seed 0\): reward = 'cider' scores captions against reference "
              r"captions, but 16 of 16 train clips")]
    for argv, match in cases:
        out = tmp_path / argv[0]
        with pytest.raises(ValueError, match=match):
            evaluate_main([*argv, *common, "--out", str(out)])
        assert not out.exists()


def test_reward_settings_are_checked_before_any_work(tiny, tmp_path, capsys):
    root, _, _ = tiny
    with pytest.raises(ValueError, match=r"reward must be one of \['cider', 'cider\+fidelity', "
                                         r"'fidelity'\], got 'bleu'"):
        TrainConfig(reward="bleu").validate()
    with pytest.raises(ValueError, match="fidelity_form must be one of"):
        TrainConfig(reward="fidelity", fidelity_form="hinge").validate()
    with pytest.raises(SystemExit):
        main(tiny_args(root, tmp_path / "run", "--fidelity-form", "margin", "--reward", "cider"))
    assert "fidelity_form = 'margin' has no effect with reward 'cider'" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    assert dataclasses.replace(TrainConfig(), reward="cider+fidelity").validate().reward == \
        "cider+fidelity"


def test_caption_cli_shows_a_label_free_clip_without_a_reference(tiny, tiny_captioner, tmp_path,
                                                                 capsys):
    """python -m avex.captioner caption on a cache exported without captions prints each
    clip's caption and says it has no reference (it read the first reference, an IndexError);
    --no-progress draws no bar."""
    from avex.captioner.__main__ import main as captioner_cli
    root, cache, _ = tiny
    data = tmp_path / "label-free"
    label_free_cache(cache, data)
    assert captioner_cli(["caption", "--captioner", str(tiny_captioner), "--data", str(data),
                          "-n", "2", "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert out.count("reference: none (a label-free clip)") == 2
    assert out.count("test-0000") == 2 and "Loading weights" not in err
