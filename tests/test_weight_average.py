"""RL's weight average (TrainConfig.ema): the running average's arithmetic, and a run that saves
it, resumes it and refuses it where it would do nothing."""
import re
import shutil

import pytest
import torch
from run_weights import final_weights, saved_weights, train_tiny

from avex.training.averaging import WeightAverage


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 2).double()
        self.register_buffer("count", torch.tensor(7))   # not floating point: not averaged


def test_the_average_is_the_closed_form_of_its_updates():
    torch.manual_seed(0)
    model, decay = Tiny(), 0.8
    start = {n: v.clone() for n, v in model.state_dict().items()}
    average = WeightAverage(model, decay)
    assert set(average.weights) == {"linear.weight", "linear.bias"}
    seen = []
    for _ in range(5):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        seen.append({n: v.clone() for n, v in model.state_dict().items()})
        average.update(model)
    for name in average.weights:
        expected = decay ** 5 * start[name]
        for i, weights in enumerate(seen):
            expected = expected + (1 - decay) * decay ** (4 - i) * weights[name]
        torch.testing.assert_close(average.weights[name], expected, rtol=1e-12, atol=1e-12)


def test_copy_to_loads_the_average_and_leaves_other_entries():
    torch.manual_seed(1)
    model = Tiny()
    average = WeightAverage(model, 0.5)
    with torch.no_grad():
        model.linear.weight.add_(2.0)
        model.count.fill_(9)
    average.update(model)
    expected = average.weights["linear.weight"].clone()
    average.copy_to(model)
    assert torch.equal(model.linear.weight, expected)
    assert int(model.count) == 9


def test_the_state_round_trips_and_another_decay_is_refused():
    torch.manual_seed(2)
    model = Tiny()
    average = WeightAverage(model, 0.9)
    with torch.no_grad():
        model.linear.bias.add_(1.0)
    average.update(model)
    restored = WeightAverage(Tiny(), 0.9)
    restored.load_state_dict(average.state_dict())
    for name, value in average.weights.items():
        assert torch.equal(restored.weights[name], value)
    with pytest.raises(ValueError, match=r"decay 0.9\) does not match this run's \(decay 0.5\)"):
        WeightAverage(Tiny(), 0.5).load_state_dict(average.state_dict())


@pytest.mark.parametrize("decay", [0.0, 1.0, -0.1, 1.5])
def test_a_decay_outside_the_open_interval_is_refused(decay):
    with pytest.raises(ValueError, match=rf"decay must be in \(0, 1\), got {decay}"):
        WeightAverage(Tiny(), decay)


# ------------------------------------------------------------------------------------------------
# Training with --ema (the tiny benchmark of tests/conftest.py)
# ------------------------------------------------------------------------------------------------

def test_a_run_saves_the_average_of_its_rl_weights(tiny_cache_dir, tmp_path):
    """From the same warmup and seed, the run with --ema saves weights that moved from the
    warmup's, but less far than the last RL step's (the average keeps part of its start); the
    artifact is that average."""
    import avex

    train_tiny(tiny_cache_dir, tmp_path / "plain")
    train_tiny(tiny_cache_dir, tmp_path / "ema", "--ema", "0.9",
               "--warmup-from", str(tmp_path / "plain"))
    warmup = saved_weights(tmp_path / "plain" / "warmup_policy.safetensors")
    last, averaged = final_weights(tmp_path / "plain"), final_weights(tmp_path / "ema")
    moved_last = sum(float((last[n] - warmup[n]).norm()) for n in warmup)
    moved_average = sum(float((averaged[n] - warmup[n]).norm()) for n in warmup)
    assert 0 < moved_average < moved_last
    # the artifact is the averaged policy
    saved = avex.load_policy(tmp_path / "ema").state_dict()
    for name, value in averaged.items():
        assert torch.equal(saved[name].cpu(), value), name


def test_a_run_with_the_average_resumes_to_the_same_policy(tiny_cache_dir, tmp_path):
    """The average is in the RL checkpoints: resumed from one before the last, the run ends
    with the weights of the run that never stopped."""
    flags = ("--ema", "0.8", "--checkpoint-every", "1")
    train_tiny(tiny_cache_dir, tmp_path / "whole", *flags)
    checkpoints = tmp_path / "whole" / "checkpoints"
    steps = sorted(p.name for p in checkpoints.iterdir() if p.name.startswith("step-"))
    middle = steps[-2]
    shutil.copytree(tmp_path / "whole", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / steps[-1])
    (tmp_path / "resumed" / "checkpoints" / "latest").write_text(middle + "\n")
    train_tiny(tiny_cache_dir, tmp_path / "resumed", *flags, "--resume")
    whole, resumed = final_weights(tmp_path / "whole"), final_weights(tmp_path / "resumed")
    for name in whole:
        assert torch.equal(whole[name], resumed[name]), name


@pytest.mark.parametrize("flags, message", [
    (["--ema", "1"], r"ema must be a finite number in \[0, 1\), got 1.0"),
    (["--ema", "-0.5"], r"ema must be a finite number in \[0, 1\), got -0.5"),
    (["--ema", "0.9", "--warmup-only"], r"ema .* warmup-only"),
])
def test_bad_or_idle_ema_is_refused_before_any_work(tiny_cache_dir, tmp_path, capsys, flags,
                                                    message):
    with pytest.raises(SystemExit):
        train_tiny(tiny_cache_dir, tmp_path / "run", *flags)
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "run").exists()
