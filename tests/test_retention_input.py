"""The policy's retention input (PolicyConfig.retention_input): zero at the start, so a policy
built with it scores as one without; once learned, scores depend on rho; every path that
serves a policy passes rho, and scoring without it is refused."""
import json
import re

import pytest
import torch
from run_weights import final_weights, saved_weights

from avex.policy import AVEXPolicy, PolicyConfig, TrainedOn
from avex.pruning import AUDIO, PAD, TEXT, VISUAL


def config(**changes):
    return PolicyConfig(input_size=32, hidden_size=32, num_heads=4, **changes)


def built(seed=0, **changes):
    torch.manual_seed(seed)
    return AVEXPolicy(config(**changes)).eval()


def learned(seed=0, **changes):
    """A policy with the input whose projection is no longer zero."""
    policy = built(seed, retention_input=True, **changes)
    with torch.no_grad():
        policy.retention_in.copy_(torch.randn_like(policy.retention_in))
    return policy


def ragged(seed, rows=4, width=32):
    """Rows of text, visual and audio tokens of different lengths, left-padded."""
    g = torch.Generator().manual_seed(seed)
    length = 20
    modality = torch.full((rows, length), PAD)
    for r in range(rows):
        n_text, n_vis, n_aud = 2 + r % 2, 5 + 2 * r, 3 + r % 3
        codes = [TEXT] * n_text + [VISUAL] * n_vis + [AUDIO] * n_aud + [TEXT]
        modality[r, length - len(codes):] = torch.tensor(codes)
    return torch.randn(rows, length, width, generator=g), modality


def is_av(modality):
    return (modality == VISUAL) | (modality == AUDIO)


def test_a_new_retention_input_scores_as_the_policy_without_it_at_every_retention():
    plain, with_input = built(3), built(3, retention_input=True)
    assert torch.equal(with_input.retention_in, torch.zeros(32, 2))
    shared = plain.state_dict()
    assert set(with_input.state_dict()) - set(shared) == {"retention_in"}
    for name, value in shared.items():   # the zero input draws no random numbers
        assert torch.equal(with_input.state_dict()[name], value), name
    embeds, modality = ragged(0)
    for rho in (1.0, 0.5, 0.2, 0.1):
        assert torch.equal(with_input.score(embeds, modality, retention=rho),
                           plain.score(embeds, modality))


def test_a_learned_retention_input_changes_scores_but_not_hidden_states():
    policy = learned()
    embeds, modality = ragged(1)
    s10, h10 = policy.score(embeds, modality, retention=0.1, with_hidden=True)
    s50, h50 = policy.score(embeds, modality, retention=0.5, with_hidden=True)
    av = is_av(modality)
    assert (s10[~av] == float("-inf")).all() and torch.isfinite(s10[av]).all()
    assert not torch.allclose(s10[av], s50[av])
    assert torch.equal(h10, h50)   # set-aware selection compares tokens without rho


def test_gathered_scores_equal_forward_with_the_retention():
    policy = learned(2)
    embeds, modality = ragged(2, rows=5)
    av = is_av(modality)
    rho = [0.1, 0.25, 0.5, 1.0, 0.3]
    with torch.no_grad():
        full = policy(embeds, modality, retention=rho)
    gathered = policy.score(embeds, modality, retention=torch.tensor(rho))
    torch.testing.assert_close(gathered[av], full[av], rtol=0, atol=1e-5)


def test_per_row_retentions_score_each_row_as_alone():
    policy = learned(4)
    embeds, modality = ragged(4, rows=4)
    rho = [0.1, 0.5, 0.2, 1.0]
    together = policy.score(embeds, modality, retention=rho)
    for row in range(4):
        present = modality[row] != PAD
        alone = policy.score(embeds[row, present][None], modality[row, present][None],
                             retention=rho[row])
        torch.testing.assert_close(alone[0], together[row, present], rtol=0, atol=1e-5)


def test_the_projection_gets_a_gradient_from_rl_and_none_from_the_warmup():
    policy = learned(5).train()
    embeds, modality = ragged(5)
    av = is_av(modality)
    policy(embeds, modality)[av].sum().backward()          # the warmup's call: no retention
    assert policy.retention_in.grad is None
    policy(embeds, modality, retention=0.2)[av].sum().backward()
    assert policy.retention_in.grad is not None and bool(policy.retention_in.grad.any())


def test_gradient_of_the_retention_term_matches_finite_differences():
    """Through a float64 policy (the scores come out as float32, hence the step and tolerance)."""
    policy = learned(6).double()
    embeds, modality = ragged(6, rows=2)
    av = is_av(modality)
    weights = torch.randn(int(av.sum()), dtype=torch.float64)

    def loss(w):
        with torch.no_grad():
            policy.retention_in.copy_(w)
        return (policy(embeds.double(), modality, retention=[0.15, 0.6])[av] * weights).sum()

    w = policy.retention_in.detach().clone()
    policy.zero_grad()
    loss(w).backward()
    grad = policy.retention_in.grad.clone()
    step = 1e-3
    for i, j in [(0, 0), (5, 1), (31, 0)]:
        up, down = w.clone(), w.clone()
        up[i, j] += step
        down[i, j] -= step
        with torch.no_grad():
            numeric = (loss(up) - loss(down)) / (2 * step)
        torch.testing.assert_close(grad[i, j], numeric, rtol=1e-2, atol=1e-4)


@pytest.mark.parametrize("retention, message", [
    (None, r"retention is required: this policy takes the retention as an input"),
    (0.0, r"retention must be in \(0, 1\], got 0.0"),
    (1.5, r"retention must be in \(0, 1\], got 1.5"),
    ([0.2, 0.3], r"retention holds 2 values but the batch has 4 rows"),
    ([0.2, 0.3, 2.0, 0.1], r"retention\[2\] must be in \(0, 1\], got 2.0"),
    (torch.ones(2, 2), r"retention must be a number in \(0, 1\] or a 1-D tensor"),
])
def test_bad_retentions_are_refused_naming_it(retention, message):
    embeds, modality = ragged(7)
    with pytest.raises(ValueError, match=message):
        learned().score(embeds, modality, retention=retention)


def test_a_policy_without_the_input_checks_a_retention_it_is_given_and_ignores_it():
    policy = built()
    embeds, modality = ragged(8)
    assert torch.equal(policy.score(embeds, modality, retention=0.1),
                       policy.score(embeds, modality))
    with pytest.raises(ValueError, match=r"retention must be in \(0, 1\], got 0.0"):
        policy.score(embeds, modality, retention=0.0)


def test_the_saved_policy_keeps_the_input_and_a_plain_record_does_not_name_it(tmp_path):
    for name, policy in (("plain", built()), ("rho", learned())):
        policy.trained_on = TrainedOn("qwen2", 32, "visual-then-audio", [0.1, 0.5])
        policy.save_pretrained(tmp_path / name)
    plain = json.loads((tmp_path / "plain" / "config.json").read_text())["policy"]
    rho = json.loads((tmp_path / "rho" / "config.json").read_text())["policy"]
    assert "retention_input" not in plain and rho["retention_input"] is True
    loaded = AVEXPolicy.from_pretrained(tmp_path / "rho")
    assert loaded.config.retention_input
    embeds, modality = ragged(9)
    assert torch.equal(loaded.score(embeds, modality, retention=0.3),
                       learned().score(embeds, modality, retention=0.3))


def test_prune_and_the_learned_selector_pass_the_retention():
    """prune_inputs(policy=), per row and per item, and the evaluation's selector keep what
    the policy's scores at each row's retention keep."""
    from avex.methods.learned import policy_selector
    from avex.pruning import prune_inputs
    from avex.selection import AVLayout

    for selection in ({}, {"selection": "set-aware", "redundancy": 4.0}):
        policy = learned(10, **selection)
        embeds, modality = ragged(10)
        rho = [0.1, 0.5, 0.3, 0.2]
        served = prune_inputs(embeds, modality, policy=policy, retention=rho)
        for row in range(4):
            present = modality[row] != PAD
            e, m = embeds[row, present][None], modality[row, present][None]
            if policy.set_aware:
                layout = AVLayout.of(m)
                s, h = policy.score(e, m, retention=rho[row], with_hidden=True)
                picks, _ = policy.select(layout.gather(s), layout.gather_vectors(h),
                                         layout.budget(rho[row]))
                alone = prune_inputs(e, m, keep=_keep(picks, m))
            else:
                alone = prune_inputs(e, m, scores=policy.score(e, m, retention=rho[row]),
                                     retention=rho[row])
            assert torch.equal(served.keep[row, 0, present], alone.keep[0, 0]), (selection, row)
        per_item = prune_inputs(embeds, modality, policy=policy, retention=rho, per_item=True)
        from avex.pruning import num_kept
        for row in range(4):   # each item (the video, the audio) keeps round(rho N) of its own
            for code in (VISUAL, AUDIO):
                own = modality[row] == code
                assert int(per_item.keep[row, 0, own].sum()) == \
                    int(num_kept(rho[row], own.sum())), (selection, row, code)
        # the selector of the evaluation: at 10% it keeps what the policy's 10% scores rank
        batch = type("Batch", (), {"inputs_embeds": embeds, "modality": modality})()
        keep10 = policy_selector(policy)(batch, AVLayout.of(modality), 0.1)
        keep50 = policy_selector(policy)(batch, AVLayout.of(modality), 0.5)
        assert keep10.sum() < keep50.sum()


def _keep(picks, modality):
    from avex.pruning import expand_av_keep
    from avex.selection import AVLayout, indices_to_keep
    layout = AVLayout.of(modality)
    return expand_av_keep(indices_to_keep(picks, layout.positions.shape[1]), modality)


# ------------------------------------------------------------------------------------------------
# Training with --retention-input (the tiny benchmark of tests/conftest.py)
# ------------------------------------------------------------------------------------------------

def _train(cache_dir, run_dir, *extra):
    from avex.train import main
    # a run given --warmup-from trains no warmup, and refuses warmup settings
    warmup = [] if "--warmup-from" in extra else ["--warmup-epochs", "0.5"]
    return main(["--benchmark-preset", "tiny", "--captioner-preset", "tiny",
                 "--cache-dir", str(cache_dir), "--run-dir", str(run_dir), "--batch-size", "8",
                 "--micro-batch-size", "4", "--epochs", "0.5", *warmup,
                 "--no-progress", "--no-evaluate", "--seed", "3", *extra])


def test_training_learns_the_input_in_rl_from_the_same_warmup(tiny_cache_dir, tmp_path):
    """The warmup of a run with the input is the warmup without it, bit for bit (its projection
    stays zero); RL moves the projection; the saved policy needs the retention."""
    import avex

    _train(tiny_cache_dir, tmp_path / "plain")
    _train(tiny_cache_dir, tmp_path / "rho", "--retention-input")
    plain = saved_weights(tmp_path / "plain" / "warmup_policy.safetensors")
    rho = saved_weights(tmp_path / "rho" / "warmup_policy.safetensors")
    assert set(rho) - set(plain) == {"retention_in"}
    assert not bool(rho["retention_in"].any())
    for name, value in plain.items():
        assert torch.equal(rho[name], value), name
    assert bool(final_weights(tmp_path / "rho")["retention_in"].any())
    policy = avex.load_policy(tmp_path / "rho")
    assert policy.config.retention_input
    saved = json.loads((tmp_path / "rho" / "config.json").read_text())
    assert saved["retention_input"] is True
    # a later run may start from either warmup, with or without the input
    _train(tiny_cache_dir, tmp_path / "from-plain", "--retention-input",
           "--warmup-from", str(tmp_path / "plain"))
    _train(tiny_cache_dir, tmp_path / "from-rho", "--warmup-from", str(tmp_path / "rho"))
    assert torch.equal(final_weights(tmp_path / "from-plain")["retention_in"],
                       final_weights(tmp_path / "rho")["retention_in"])


def test_a_warmup_that_reads_the_retention_is_refused_by_a_run_without_the_input(tmp_path):
    from avex.training.loop import load_warmup

    weights = learned().state_dict()
    with pytest.raises(ValueError, match=r"warmup_from: its warmup policy reads the retention "
                                         r".* --retention-input"):
        load_warmup(built(), weights)


def test_a_run_from_before_the_setting_resumes_without_the_input():
    from avex.training.config import SETTINGS_BEFORE_THEY_EXISTED, TrainConfig
    assert SETTINGS_BEFORE_THEY_EXISTED["retention_input"] is False
    assert TrainConfig().retention_input is False


def test_retention_lr_without_the_input_is_refused_before_any_work(tiny_cache_dir, tmp_path,
                                                                    capsys):
    for flags, message in ((["--retention-lr", "1e-3"], r"retention_lr = 0.001 has no effect "
                            r"without the retention input; add --retention-input"),
                           (["--retention-input", "--retention-lr", "-1"],
                            r"retention_lr must be .*got -1")):
        with pytest.raises(SystemExit):
            _train(tiny_cache_dir, tmp_path / "run", *flags)
        assert re.search(message, capsys.readouterr().err)
        assert not (tmp_path / "run").exists()


def test_the_projection_learns_at_its_own_lr(tiny_cache_dir, tmp_path):
    """RL's optimiser gives W --retention-lr and every other weight --lr; a larger W lr moves
    W further."""
    _train(tiny_cache_dir, tmp_path / "slow", "--retention-input", "--retention-lr", "1e-4")
    _train(tiny_cache_dir, tmp_path / "fast", "--retention-input", "--retention-lr", "1e-2")
    slow = final_weights(tmp_path / "slow")["retention_in"].abs().max()
    fast = final_weights(tmp_path / "fast")["retention_in"].abs().max()
    assert fast > 10 * slow > 0


def test_a_run_with_the_input_resumes_to_the_same_policy(tiny_cache_dir, tmp_path):
    """RL's two parameter groups come back from a checkpoint: a run resumed from an RL
    checkpoint before its last ends with the weights of the run that never stopped."""
    import shutil

    flags = ("--retention-input", "--checkpoint-every", "1", "--epochs", "1")
    _train(tiny_cache_dir, tmp_path / "whole", *flags)
    checkpoints = tmp_path / "whole" / "checkpoints"
    steps = sorted(p.name for p in checkpoints.iterdir() if p.name.startswith("step-"))
    middle = steps[-2]   # the run keeps its last two checkpoints: resume from the older
    assert int(middle.split("-")[1]) > 0
    shutil.copytree(tmp_path / "whole", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / steps[-1])
    (tmp_path / "resumed" / "checkpoints" / "latest").write_text(middle + "\n")
    _train(tiny_cache_dir, tmp_path / "resumed", *flags, "--resume")
    whole, resumed = final_weights(tmp_path / "whole"), final_weights(tmp_path / "resumed")
    assert bool(whole["retention_in"].any())
    for name in whole:
        assert torch.equal(whole[name], resumed[name]), name


def test_a_run_saved_before_the_input_existed_is_reused_by_an_experiment(tmp_path):
    """Its config.json lacks retention_input and retention_lr: an ablation or sweep that asks
    for today's defaults reuses it instead of refusing it as trained otherwise, and a resume
    keeps it without the input."""
    from avex.training.config import TrainConfig
    from avex.training.run_records import check_reusable, resumed_config

    run = tmp_path / "old"
    run.mkdir()
    saved = TrainConfig(run_dir=str(run)).to_dict()
    for name in ("retention_input", "retention_lr"):
        del saved[name]
    (run / "config.json").write_text(json.dumps(saved))
    check_reusable(TrainConfig(run_dir=str(run)))
    assert resumed_config(TrainConfig(run_dir=str(run))).retention_input is False
    with pytest.raises(ValueError, match=r"retention_input=True \(the run has False\)"):
        check_reusable(TrainConfig(run_dir=str(run), retention_input=True))


def test_the_retention_lr_of_runs_without_the_input_is_not_compared(tmp_path):
    """It has no effect there, so a run without the input is reused whatever lr it recorded
    (a later default would otherwise refuse every older run); with the input it must match."""
    from avex.training.config import TrainConfig
    from avex.training.run_records import check_reusable

    run = tmp_path / "plain"
    run.mkdir()
    saved = TrainConfig(run_dir=str(run)).to_dict()
    (run / "config.json").write_text(json.dumps({**saved, "retention_lr": 3e-3}))
    check_reusable(TrainConfig(run_dir=str(run)))
    (run / "config.json").write_text(json.dumps({**saved, "retention_input": True,
                                                 "retention_lr": 3e-3}))
    with pytest.raises(ValueError, match=r"retention_lr=0.01 \(the run has 0.003\)"):
        check_reusable(TrainConfig(run_dir=str(run), retention_input=True))

