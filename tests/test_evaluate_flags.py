"""python -m avex.evaluate's flags that used to be accepted and then misread, ignored or refused
late: each is now taken as meant, or refused as a usage error (exit status 2, naming the flag
and its value, no traceback) before anything is captioned, trained or written."""
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from avex.evaluate.__main__ import main, parse_args
from avex.evaluate.common import check_run_captioner
from avex.policy.config import PolicyConfig
from avex.policy.saved import TrainedOn, policy_record
from badinput import exits_with_usage_error

# the message without CUDA, or on a machine with fewer than ten GPUs
NO_CUDA_9 = (r"--train-args: device is 'cuda:9' but (CUDA is not available|this machine has "
             r"\d+ CUDA device)")


def tiny(cache_dir, out, *extra):
    return ["--benchmark-preset", "tiny", "--captioner-preset", "tiny", "--cache-dir",
            str(cache_dir), "--out", str(out), "--no-progress", *extra]


def fake_run(path: Path, hidden_size: int, model_type: str = "qwen2") -> Path:
    """A finished ``python -m avex.train`` run as far as the checks before any work read it:
    its settings, policy record (trained with a captioner of ``hidden_size``), a checkpoint
    and a warmup policy, and a metrics file."""
    step = path / "checkpoints" / "step-00000002"
    step.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({
        "benchmark_preset": "tiny", "captioner_preset": "wide", "seed": 0}))
    trained_on = TrainedOn(model_type, hidden_size, "visual-then-audio", (0.1, 0.5))
    (path / "policy.json").write_text(json.dumps(policy_record(
        PolicyConfig(input_size=hidden_size, hidden_size=16, num_heads=2), trained_on)))
    (path / "checkpoints" / "latest").write_text("step-00000002")
    weights = {"w": torch.zeros(2)}
    save_file(weights, str(step / "policy.safetensors"))
    save_file(weights, str(path / "warmup_policy.safetensors"))
    torch.save({"phase": "done", "step": 2, "optimizer": {}, "rng": {}, "config": {}},
               step / "state.pt")
    (path / "metrics.jsonl").write_text("")
    return path


def test_a_single_flag_is_taken_as_the_value_of_train_args(tiny_cache_dir, tmp_path):
    """argparse took a lone ``--retention-input`` for a flag of its own ("expected one
    argument"); now it is python -m avex.train's, as ``--train-args=--retention-input`` is."""
    for argv in (["--train-args", "--retention-input"], ["--train-args=--retention-input"]):
        _, settings = parse_args(["sweep", *tiny(tiny_cache_dir, tmp_path / "out",
                                                 "--methods", "random,avex", *argv)])
        assert settings.train.retention_input is True
    _, settings = parse_args(["sweep", *tiny(tiny_cache_dir, tmp_path / "out", "--methods",
                                             "random,avex", "--train-args", "--epochs 0.5")])
    assert settings.train.epochs == 0.5 and not settings.train.retention_input
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flags,match", [
    (["sweep", "--methods", "random,random"], r"methods has duplicates: \['random', 'random'\]"),
    (["ablation", "--variants", "A,A"], r"variants has duplicates: \['A', 'A'\]"),
    (["sweep", "--methods", "random,avex", "--train-args", "--device cuda:9"], NO_CUDA_9),
    (["ablation", "--variants", "A", "--train-args", "--device cuda:9"], NO_CUDA_9),
    (["sweep", "--methods", "random", "--avex-run", "/no/run"],
     r"--avex-run '/no/run' would have no effect: avex is not in --methods \(random\)"),
    (["sweep", "--methods", "random,avex", "--cacovid-run", "/no/run"],
     r"--cacovid-run '/no/run' would have no effect: cacovid is not in --methods "
     r"\(random,avex\)"),
    (["sweep", "--methods", "random,tome", "--fastv-layer", "1"],
     r"--fastv-layer 1 would have no effect: fastv is not in --methods \(random,tome\)"),
    (["sweep", "--methods", "random,avex", "--allow-unfinished"],
     r"--allow-unfinished would have no effect: it applies to a given run"),
    (["sweep", "--methods", "random,tome", "--train-args", "--epochs 2"],
     r"--train-args would have no effect: no method of --methods \(random,tome\) is trained"),
    # a flag at its default value can't be told from one not given, but its text can
    (["sweep", "--methods", "random", "--train-args", "--epochs 3"],
     r"--train-args '--epochs 3' would have no effect: no method of --methods \(random\)"),
    (["motivation", "--train-args", "--epochs 2"],
     r"--train-args would have no effect: motivation trains no policy"),
    (["ablation", "--variants", "A", "--run", "A=/no/a", "--run", "A=/no/b"],
     r"--run A= is given twice \(/no/a and /no/b\)"),
    (["ablation", "--variants", "A", "--run", "g4=/no/run"],
     r"--run g4=/no/run would have no effect: 'g4' is not in --variants \(A\)"),
    (["ablation", "--variants", "warmup-capattn", "--run", "warmup=/no/run"],
     r"--run warmup=/no/run would have no effect: warmup is not in --variants "
     r"\(warmup-capattn\) and no variant trained here starts from the shared warmup"),
    (["gates", "--benchmark", "/no/cache", "--seed", "3"],
     r"--seed 3 would have no effect with --benchmark /no/cache"),
    (["gates", "--benchmark", "/no/cache", "--preset", "tiny", "--seed", "0"],
     r"--preset tiny and --seed 0 would have no effect with --benchmark /no/cache"),
], ids=["sweep duplicate methods", "ablation duplicate variants", "sweep train device",
        "ablation train device", "avex-run without avex", "cacovid-run without cacovid",
        "fastv-layer without fastv", "allow-unfinished without a given run",
        "train-args without a trained method", "train-args at its default, nothing trained",
        "motivation train-args", "ablation run given twice", "ablation run of another variant",
        "ablation warmup run nothing starts from", "gates benchmark and seed",
        "gates benchmark and preset"])
def test_a_flag_without_effect_is_a_usage_error_before_any_work(tiny_cache_dir, tmp_path,
                                                                capsys, flags, match):
    out = tmp_path / "out" / ("gates.md" if flags[0] == "gates" else "")
    common = ["--out", str(out), "--cache-dir", str(tiny_cache_dir)] if flags[0] == "gates" \
        else tiny(tiny_cache_dir, out)
    exits_with_usage_error(main, [*flags, *common], match, capsys)
    assert not (tmp_path / "out").exists()


def test_diagnose_refuses_train_args(tiny_cache_dir, tmp_path, capsys):
    run = fake_run(tmp_path / "run", hidden_size=32)
    exits_with_usage_error(main, ["diagnose", *tiny(tiny_cache_dir, tmp_path / "out", "--run",
                                                    str(run), "--train-args", "--epochs 2")],
                           r"--train-args would have no effect: diagnose trains no policy",
                           capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flags", [
    ["sweep", "--methods", "random,avex", "--avex-run", "{run}"],
    ["sweep", "--methods", "cacovid", "--cacovid-run", "{run}"],
    ["ablation", "--variants", "A", "--run", "A={run}"],
    ["ablation", "--variants", "warmup,A", "--run", "warmup={run}"],
    ["diagnose", "--run", "{run}"],
], ids=["sweep --avex-run", "sweep --cacovid-run", "ablation --run", "ablation --run warmup",
        "diagnose --run"])
def test_a_run_of_another_captioner_width_is_refused_before_any_work(tiny_cache_dir, tmp_path,
                                                                     capsys, flags):
    """The tiny captioner is 32 wide; a policy trained with a 128-wide one used to fail only
    once the splits were captioned, with a traceback."""
    run = fake_run(tmp_path / "run", hidden_size=128)
    argv = [f.format(run=run) for f in flags]
    exits_with_usage_error(main, [*argv, *tiny(tiny_cache_dir, tmp_path / "out")],
                           r"run.*'s policy was trained with another captioner "
                           r"\(`embedded-tiny-seed0-wide`\): the captioner given here, "
                           r".*embedded-tiny-seed0-tiny, has hidden size 32 \(the run's: 128\)",
                           capsys)
    assert not (tmp_path / "out").exists()


def test_a_run_of_the_same_captioner_passes_and_a_given_warmup_may_be_started_from(
        tiny_cache_dir, tmp_path):
    run = fake_run(tmp_path / "run", hidden_size=32)
    model = {"model_type": "qwen2", "hidden_size": 32, "path": tmp_path}
    check_run_captioner(run, {}, "--avex-run", model)      # nothing to refuse
    with pytest.raises(ValueError, match=r"model type 'llama' \(the run's: 'qwen2'\)"):
        check_run_captioner(run, {}, "--avex-run", {**model, "model_type": "llama"})
    # A starts from the shared warmup, so a given one is read: accepted, not refused
    _, settings = parse_args(["ablation", *tiny(tiny_cache_dir, tmp_path / "out", "--variants",
                                                "A", "--run", f"warmup={run}")])
    assert settings.runs == {"warmup": str(run)} and settings.variants == ["A"]
    assert not (tmp_path / "out").exists()
