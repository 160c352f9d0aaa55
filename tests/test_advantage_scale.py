"""RLOO's advantage scale (TrainConfig.advantage_scale): a given scale in the loss, the running
scale's arithmetic, and a run that keeps it in its checkpoints and refuses it where it would
do nothing."""
import re
import shutil

import pytest
import torch
from run_weights import final_weights, train_tiny

from avex.run_files import read_state
from avex.training.averaging import RunningScale
from avex.training.losses import leave_one_out_advantages, leave_one_out_loss


def test_a_given_scale_divides_the_advantages_instead_of_their_deviation():
    """The by-hand RLOO advantages of test_losses, divided by 7.5 instead of their batch
    deviation; the gradient follows."""
    log_prob = torch.tensor([[-4.0, -8.0, -2.0], [-6.0, -6.0, -6.0]], requires_grad=True)
    rewards = torch.tensor([[30.0, 60.0, 30.0], [10.0, 10.0, 40.0]])
    k = torch.tensor([2, 3])
    adv = torch.tensor([[-15.0, 30.0, -15.0], [-15.0, -15.0, 30.0]])
    torch.testing.assert_close(leave_one_out_advantages(rewards), adv)
    loss = leave_one_out_loss(log_prob, rewards, k, scale=7.5)
    torch.testing.assert_close(loss, -(adv / 7.5 * log_prob.detach() / k[:, None]).mean(1))
    loss.sum().backward()
    torch.testing.assert_close(log_prob.grad, -adv / 7.5 / k[:, None] / 3)
    # a tensor scale is read as its number; None is the batch deviation, as before
    torch.testing.assert_close(leave_one_out_loss(log_prob, rewards, k, scale=torch.tensor(7.5)),
                               loss)
    torch.testing.assert_close(leave_one_out_loss(log_prob, rewards, k, scale=None),
                               leave_one_out_loss(log_prob, rewards, k,
                                                  scale=float(adv.std(unbiased=False))))


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf"), True, "1"])
def test_a_scale_that_is_not_a_positive_number_is_refused(scale):
    with pytest.raises(ValueError, match=r"scale must be a finite number > 0 or None, got"):
        leave_one_out_loss(torch.zeros(1, 2), torch.tensor([[1.0, 2.0]]), torch.tensor([1]),
                           scale=scale)


def test_the_running_scale_starts_at_its_first_value_and_skips_ties():
    scale = RunningScale(0.9)
    assert scale.value is None
    scale.update(0.0)            # every anchor tied: nothing measured
    assert scale.value is None
    scale.update(2.0)
    assert scale.value == 2.0
    scale.update(12.0)
    assert scale.value == pytest.approx(0.9 * 2.0 + 0.1 * 12.0)
    scale.update(-1.0)
    assert scale.value == pytest.approx(3.0)
    for decay in (0.0, 1.0):
        with pytest.raises(ValueError, match=rf"decay must be in \(0, 1\), got {decay}"):
            RunningScale(decay)


# ------------------------------------------------------------------------------------------------
# Training with --advantage-scale running (the tiny benchmark of tests/conftest.py)
# ------------------------------------------------------------------------------------------------

def test_a_running_scale_run_keeps_it_in_its_checkpoints_and_resumes_to_the_same_policy(
        tiny_cache_dir, tmp_path):
    """From the same warmup and seed, the running scale trains another policy than the
    micro-batch's; its RL checkpoints hold the scale, and a run resumed from the one before
    the last ends with the weights of the run that never stopped."""
    train_tiny(tiny_cache_dir, tmp_path / "plain")
    flags = ("--advantage-scale", "running", "--checkpoint-every", "1",
             "--warmup-from", str(tmp_path / "plain"))
    train_tiny(tiny_cache_dir, tmp_path / "whole", *flags)
    plain, whole = final_weights(tmp_path / "plain"), final_weights(tmp_path / "whole")
    assert any(not torch.equal(plain[n], whole[n]) for n in plain)
    checkpoints = tmp_path / "whole" / "checkpoints"
    steps = sorted((p.name for p in checkpoints.iterdir() if p.name.startswith("step-")),
                   key=lambda name: int(name.split("-")[1]))
    states = [read_state(checkpoints / s) for s in steps]
    scales = [s.get("advantage_scale") for s in states if s["phase"] == "rl" and s["step"] > 0]
    assert scales and all(s is not None and s > 0 for s in scales)
    shutil.copytree(tmp_path / "whole", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / steps[-1])
    (tmp_path / "resumed" / "checkpoints" / "latest").write_text(steps[-2] + "\n")
    train_tiny(tiny_cache_dir, tmp_path / "resumed", *flags, "--resume")
    resumed = final_weights(tmp_path / "resumed")
    for name in whole:
        assert torch.equal(whole[name], resumed[name]), name


@pytest.mark.parametrize("flags, message", [
    (["--advantage-scale", "batch"], r"advantage_scale must be one of"),
    (["--advantage-scale", "running", "--rl-estimator", "group"],
     r"advantage_scale = 'running' has no effect with rl_estimator 'group'"),
    (["--advantage-scale", "running", "--exchange-search"],
     r"advantage_scale = 'running' has no effect with the exchange search"),
    (["--advantage-scale", "running", "--warmup-only"],
     r"advantage_scale = 'running' has no effect in a warmup-only run"),
])
def test_a_bad_or_idle_advantage_scale_is_refused_before_any_work(tiny_cache_dir, tmp_path,
                                                                  capsys, flags, message):
    with pytest.raises(SystemExit):
        train_tiny(tiny_cache_dir, tmp_path / "run", *flags)
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "run").exists()
