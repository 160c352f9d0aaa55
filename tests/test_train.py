"""python -m avex.train on a tiny benchmark: end to end, bad configs, kill + resume, DDP."""
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from run_weights import final_weights

from avex import metrics
from avex.train import main
from avex.training.config import TrainConfig
from avex.training.run_records import resumed_config

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cache_dir(tiny_cache_dir):
    """The session's tiny benchmark and captioner (tests/conftest.py)."""
    return tiny_cache_dir


def tiny_args(cache_dir, run_dir, *extra):
    return ["--benchmark-preset", "tiny", "--captioner-preset", "tiny",
            "--cache-dir", str(cache_dir), "--run-dir", str(run_dir), "--batch-size", "8",
            "--micro-batch-size", "4", "--epochs", "1", "--warmup-epochs", "0.5",
            "--no-progress", "--seed", "3", *extra]


@pytest.mark.slow
def test_tiny_end_to_end_run(cache_dir, tmp_path):
    results = main(tiny_args(cache_dir, tmp_path / "run", "--eval-retentions", "0.4"))
    methods = [(row["method"], row["retention"]) for row in results["rows"]]
    assert methods == [("Full tokens", 1.0), ("Random", 0.4),
                       ("Attention-AV (balanced; privileged reference)", 0.4),
                       ("CaCoVID-AV", 0.4), ("warmup only", 0.4),
                       ("AVEX, L_RL (RLOO), fidelity reward, set-aware selection, dropped tokens "
                        "merged from cosine 0.8 (this run)",
                        0.4)]
    assert results["rows"][0]["C_av"] > 0  # the captioner says something sensible
    log = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    rl = [r for r in log if r["phase"] == "rl"]
    assert rl and not any("valid_exchanges" in r for r in rl)   # the default: no exchanges
    # the default reward: 100 x the mean log p of y_full, finite and below 0
    assert all(math.isfinite(r["reward"]) and r["reward"] < 0 for r in rl)
    assert (tmp_path / "run" / "results.md").read_text().startswith("Results on the test split")
    # the table is followed by this run minus every other row, paired over the scored clips
    ours = results["rows"][-1]
    saved = json.loads((tmp_path / "run" / "results.json").read_text())
    assert [(d["other"], d["retention"]) for d in saved["differences"]] == \
        [(name, 0.4) for name, _ in methods[1:-1]]
    for d, row in zip(saved["differences"], results["rows"][1:-1]):
        assert len(row["per_clip"]["C_av"]) == len(ours["per_clip"]["C_av"]) > 1
        mean_gap = (sum(ours["per_clip"]["C_av"]) - sum(row["per_clip"]["C_av"])) \
            / len(row["per_clip"]["C_av"])
        assert d["difference"] == pytest.approx(mean_gap, abs=1e-3)
        assert d["difference"] == pytest.approx(ours["C_av"] - row["C_av"], abs=1e-3)
        assert d["low"] <= d["difference"] <= d["high"] and d["clips"] == len(row["per_clip"]["C_av"])
    text = (tmp_path / "run" / "results.md").read_text()
    assert "paired 95% bootstrap interval over these" in text
    assert f"| CaCoVID-AV | {saved['differences'][2]['difference']:+.1f} [" in text
    assert json.loads((tmp_path / "run" / "config.json").read_text())["g"] == 8
    # every RL micro-batch draws its retention from train_retentions; each captions
    # its 4 anchors per clip in one call
    # (the log holds each step's mean over its micro-batches)
    drawn = {round(r["retention"], 6) for r in rl}
    assert len(drawn) > 1 and all(0.1 <= r <= 0.5 for r in drawn)
    assert all(r["reward_spread"] >= 0 for r in rl)
    # CaCoVID-AV: its own run from this run's warmup policy, set-level reward at the matched
    # budget (8 samples per clip, group-normalised advantage)
    cacovid = json.loads((tmp_path / "run" / "cacovid" / "config.json").read_text())
    assert (cacovid["exchanges"], cacovid["anchors"], cacovid["rl_estimator"]) == \
        (False, 8, "group")
    # its own reward and selection whatever the run's, and the table says so
    assert (cacovid["reward"], cacovid["selection"]) == ("cider", "topk")
    assert "CaCoVID-AV is trained for this table from this run's warmup and seed, with its " \
           "own reward (CIDEr against the references) and Top-K selection" in text
    assert cacovid["warmup_from"] == str(tmp_path / "run")
    warm = load_file(str(tmp_path / "run" / "warmup_policy.safetensors"))
    warm_c = load_file(str(tmp_path / "run" / "cacovid" / "warmup_policy.safetensors"))
    assert all(torch.equal(warm[k], warm_c[k]) for k in warm)


def test_exchange_run_logs_its_diagnostics_and_calibration(cache_dir, tmp_path):
    """--exchanges: w's saturation from the full-token reward, L_ex's gradient normalised to
    lambda_ex x L_RL's, and per-type diagnostics in metrics.jsonl, a JSON summary and a plot."""
    from avex.training.losses import saturation_for

    run = tmp_path / "run"
    main(tiny_args(cache_dir, run, "--exchanges", "--lambda-ex", "0.5", "--diagnostics-every",
                   "2", "--no-evaluate", "--reward", "cider"))
    calibration = json.loads((run / "exchange_calibration.json").read_text())
    assert calibration["saturation"] == pytest.approx(
        saturation_for(calibration["full_token_reward"]))
    rl = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    rl = [r for r in rl if r["phase"] == "rl"]
    micro = [m for r in rl for m in r["exchange_diagnostics"]]
    assert len(micro) == 2 * len(rl)  # one entry per micro-batch
    for m in micro:
        assert set(m["types"]) == {"vv", "aa", "va", "av"}   # one exchange per anchor, 4 anchors
        for stats in m["types"].values():
            assert 0 <= stats["valid"] <= 1
            if stats["zero"] is not None:
                assert 0 <= stats["zero"] <= 1 and 0 <= stats["disagree"] <= 1
                # g = max(2, K / 8)
                assert stats["g_over_k"] == pytest.approx(max(2, round(m["k"] / 8)) / m["k"])
        ratio = m["grad_ratio"]
        if ratio["unscaled"] is not None:   # None: every advantage was 0 (no L_RL gradient)
            assert ratio["total"] == pytest.approx(0.5 if m["exchange_scale"] > 0 else 0.0)
    assert any(r["total"] == pytest.approx(0.5) for r in (m["grad_ratio"] for m in micro))
    assert any(set(m["grad_ratio"]) > {"total", "unscaled"} for m in micro)  # every 2nd step
    summary = json.loads((run / "exchange_diagnostics.json").read_text())
    assert set(summary) == {"vv", "aa", "va", "av", "total", "anchors"}
    assert summary["total"]["all"]["micro_batches"] == len(micro)
    # the RL groups' ties (issue #33), logged under the cider reward too: CIDEr is the reward,
    # so no second CIDEr statistic and no agreement (there is no dense term)
    ties = [m for r in rl for m in r["reward_diagnostics"]]
    assert len(ties) == len(micro) and summary["anchors"]["all"]["micro_batches"] == len(ties)
    for m in ties:
        assert 0 <= m["tied"] <= 1 and m["groups"] == 4 and "cider_tied" not in m
    for m in micro:
        assert all(t["agree"] is None for t in m["types"].values())
    assert (run / "exchange_diagnostics.png").read_bytes()[:4] == b"\x89PNG"


def test_best_anchor_imitation_is_logged_and_moves_the_policy(cache_dir, tmp_path):
    """--lambda-best: a BCE pulling the scores toward each clip's best-rewarded anchor."""
    main(tiny_args(cache_dir, tmp_path / "a", "--no-evaluate", "--epochs", "0.5"))
    main(tiny_args(cache_dir, tmp_path / "b", "--no-evaluate", "--epochs", "0.5",
                   "--lambda-best", "1"))
    rl = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").open()]
    assert any(r.get("imitation", 0) > 0 for r in rl if r["phase"] == "rl")
    a, b = final_weights(tmp_path / "a"), final_weights(tmp_path / "b")
    assert any(not torch.equal(a[k], b[k]) for k in a)


def test_anchor_exchanges_around_first_each_and_all_anchors():
    from avex.training.config import TrainConfig
    from avex.kernels import build_exchanges, gumbel_topk
    from avex.training.steps import anchor_exchanges

    torch.manual_seed(0)
    scores = torch.randn(3, 20)
    modality = torch.tensor([0] * 14 + [1] * 6).repeat(3, 1)
    idx, _ = gumbel_topk(scores.repeat_interleave(4, 0), torch.full((12,), 8), seed=1)
    idx = idx.view(3, 4, -1)
    first = anchor_exchanges(TrainConfig(exchange_anchors="first"), scores, idx, modality, 0, 2)
    want = build_exchanges(scores, idx[:, 0], modality, g=2)
    assert torch.equal(first.keep, want.keep) and first.owner == [0, 0, 0, 0]
    each = anchor_exchanges(TrainConfig(exchange_anchors="each"), scores, idx, modality, 0, 2)
    assert each.owner == [0, 1, 2, 3] and each.types == ["vv", "aa", "va", "av"]
    for a, kind in enumerate(each.types):   # anchor a, exchange type a
        alone = build_exchanges(scores, idx[:, a], modality, g=2, types=(kind,))
        assert torch.equal(each.keep[:, a], alone.keep[:, 0])
        assert torch.equal(each.delta_f[:, a], alone.delta_f[:, 0])
    every = anchor_exchanges(TrainConfig(exchange_anchors="all"), scores, idx, modality, 0, 2)
    assert every.keep.shape == (3, 16, 20) and every.owner == [a for a in range(4) for _ in "1234"]


@pytest.mark.slow
def test_run_finishes_without_java_and_pycocoevalcap(cache_dir, tmp_path, monkeypatch):
    """The GPU image has neither: the reward needs neither, and the final table reports CIDEr
    (from CiderD) with BLEU-4 and METEOR as NaN instead of crashing after training."""
    for name in [m for m in sys.modules if m.startswith("pycocoevalcap")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pycocoevalcap", None)
    monkeypatch.setenv("PATH", str(tmp_path))  # and no java
    monkeypatch.setattr(metrics, "_warned", set())
    with pytest.warns(UserWarning, match="BLEU-4 and METEOR are reported as NaN"):
        results = main(tiny_args(cache_dir, tmp_path / "run", "--eval-retentions", "0.4",
                                 "--max-eval-clips", "8"))
    rows = results["rows"]
    assert rows and all(math.isnan(r["BLEU-4"]) and math.isnan(r["METEOR"]) for r in rows)
    assert all(math.isfinite(r["C_av"]) for r in rows) and rows[0]["C_av"] > 0
    text = (tmp_path / "run" / "results.md").read_text()
    assert "nan" in text
    assert "CIDEr points; avex.reward.CiderD" in text   # the caption names the fallback
    assert "pycocoevalcap" not in sys.modules or sys.modules["pycocoevalcap"] is None


@pytest.mark.parametrize("flags,match", [
    (["--retention", "1.5"], r"retention must be in \(0, 1\], got 1.5"),
    (["--g", "0"], "g must be >= 1, got 0"),
    (["--exchange-types", "vv,xa"], "exchange_types must be drawn from .* got 'xa'"),
    (["--captioner", "/no/such/model"], "captioner: no model directory"),
    (["--batch-size", "6"], r"batch_size \(6\) must be a multiple"),
    (["--benchmark-preset", "huge"], "benchmark_preset must be one of"),
    (["--rl-estimator", "ppo"], "rl_estimator must be one of .* got 'ppo'"),
    (["--anchors", "1"], r"anchors must be >= 2 with rl_estimator='rloo'"),
    (["--train-retentions", "0.2,1.5"], r"train_retentions must be in \(0, 1\], got 1.5"),
    (["--eval-methods", "random,avex"], "eval_methods must be one of .* got 'avex'"),
    (["--warmup-from", "/no/such/run"], "warmup_from: no warmup_policy"),
    (["--g-fraction", "2"], r"g_fraction must be in \[0, 1\], got 2"),
])
def test_bad_config_fails_before_any_work(cache_dir, tmp_path, capsys, flags, match):
    """A usage error (exit 2, no traceback) before the run directory exists; more cases in
    tests/test_bad_input_cli.py."""
    with pytest.raises(SystemExit) as stop:
        main(tiny_args(cache_dir, tmp_path / "run", *flags))
    assert stop.value.code == 2
    assert re.search(match, capsys.readouterr().err)
    assert not (tmp_path / "run").exists()


def test_config_file_and_flags_override_defaults(cache_dir, tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("exchanges: true\ng_fraction: 0\ng: 4\nexchange_types: [vv, av]\nlr: 0.002\n")
    main(tiny_args(cache_dir, tmp_path / "run", "--config", str(config), "--lr", "0.003",
                   "--no-evaluate", "--epochs", "0.2"))
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (saved["g"], saved["exchange_types"], saved["lr"]) == (4, ["vv", "av"], 0.003)
    config.write_text("gg: 4\n")
    with pytest.raises(SystemExit):
        main(tiny_args(cache_dir, tmp_path / "run2", "--config", str(config)))
    assert "unknown settings ['gg']" in capsys.readouterr().err


def _command(cache_dir, run_dir, *extra):
    return [sys.executable, "-m", "avex.train",
            *tiny_args(cache_dir, run_dir, "--no-evaluate", "--checkpoint-every", "1",
                       "--epochs", "2", *extra)]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_policy(cache_dir, tmp_path):
    subprocess.run(_command(cache_dir, tmp_path / "whole"), check=True, cwd=REPO, env=_env(),
                   capture_output=True)
    victim = subprocess.Popen(_command(cache_dir, tmp_path / "killed"), cwd=REPO, env=_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    latest = tmp_path / "killed" / "checkpoints" / "latest"
    deadline = time.time() + 300
    # kill -9 once the RL phase has written a checkpoint or two
    while time.time() < deadline and victim.poll() is None:
        if latest.exists() and int(latest.read_text().strip().split("-")[1]) >= 5:
            break
        time.sleep(0.05)
    assert victim.poll() is None, "the run finished before it could be killed"
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    killed_at = latest.read_text().strip()
    subprocess.run(_command(cache_dir, tmp_path / "killed") + ["--resume"], check=True, cwd=REPO,
                   env=_env(), capture_output=True)
    whole, resumed = final_weights(tmp_path / "whole"), final_weights(tmp_path / "killed")
    assert killed_at != (tmp_path / "killed" / "checkpoints" / "latest").read_text().strip()
    for name in whole:
        assert torch.equal(whole[name], resumed[name]), name


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_checkpoints_at_the_step_boundary_and_resume_logs_each_step_once(
        cache_dir, tmp_path, signum):
    """SIGINT / SIGTERM mid-RL: a checkpoint at the next step boundary, exit 130, the exact
    resume command on stderr; the resumed run logs every step once and ends where an
    uninterrupted run ends."""
    run_dir = tmp_path / "run"
    command = _command(cache_dir, run_dir, "--checkpoint-every", "1000")  # no periodic saves
    victim = subprocess.Popen(command, cwd=REPO, env=_env(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    log = run_dir / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and victim.poll() is None:   # the second RL step has run
        if log.exists() and sum('"phase": "rl"' in line for line in log.open()) >= 2:
            break
        time.sleep(0.05)
    assert victim.poll() is None, "the run finished before it could be stopped"
    victim.send_signal(signum)
    _, err = victim.communicate(timeout=300)
    assert victim.returncode == 130, err[-2000:]
    resume = f"python -m avex.train --resume --run-dir {run_dir}"
    assert resume in err and "Traceback" not in err, err[-2000:]
    stopped_at = int((run_dir / "checkpoints" / "latest").read_text().strip().split("-")[1])
    rl_logged = [json.loads(line)["step"] for line in log.open()
                 if json.loads(line)["phase"] == "rl"]
    warmup = sum(json.loads(line)["phase"] == "warmup" for line in log.open())
    assert stopped_at == warmup + max(rl_logged) + 1   # the boundary after the last step run

    # a step logged after the checkpoint (as a kill between the two would leave) is redone
    # once on resume, not logged twice
    with log.open("a") as handle:
        handle.write(json.dumps({"phase": "rl", "step": max(rl_logged) + 1, "reward": 0.0})
                     + "\n")
    subprocess.run([*command, "--resume"], check=True, cwd=REPO, env=_env(),
                   capture_output=True)
    records = [json.loads(line) for line in log.open()]
    for phase in ("warmup", "rl"):
        steps = [r["step"] for r in records if r["phase"] == phase]
        assert steps == list(range(len(steps))), (phase, steps)
    whole = tmp_path / "whole"
    subprocess.run(_command(cache_dir, whole, "--checkpoint-every", "1000"), check=True,
                   cwd=REPO, env=_env(), capture_output=True)
    assert len(records) == sum(1 for _ in (whole / "metrics.jsonl").open())
    reference, resumed = final_weights(whole), final_weights(run_dir)
    for name in reference:
        assert torch.equal(reference[name], resumed[name]), name


@pytest.mark.slow
def test_two_gloo_processes_match_one(cache_dir, tmp_path):
    extra = ["--epochs", "0.5"]
    subprocess.run(_command(cache_dir, tmp_path / "single", *extra), check=True, cwd=REPO,
                   env=_env(), capture_output=True)
    ddp = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           *_command(cache_dir, tmp_path / "ddp", *extra)[1:]]
    done = subprocess.run(ddp, cwd=REPO, env=_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    single, ddp_weights = final_weights(tmp_path / "single"), final_weights(tmp_path / "ddp")
    for name in single:
        torch.testing.assert_close(ddp_weights[name], single[name], rtol=1e-4, atol=1e-6,
                                   msg=name)
    assert any(not torch.equal(single[name], load_file(
        str(tmp_path / "single" / "warmup_policy.safetensors"))[name]) for name in single)


@pytest.mark.slow
def test_the_callable_trains_what_the_command_line_trains(cache_dir, tmp_path):
    """train(TrainConfig(...)) is python -m avex.train: the same settings give the same
    policy, byte for byte, and the same table, and it returns the run's rows."""
    from avex.training.config import TrainConfig
    from avex.train import train

    cli = main(tiny_args(cache_dir, tmp_path / "cli", "--eval-retentions", "0.4",
                         "--eval-methods", "random"))
    cfg = TrainConfig(benchmark_preset="tiny", captioner_preset="tiny", cache_dir=str(cache_dir),
                      run_dir=str(tmp_path / "api"), batch_size=8, micro_batch_size=4,
                      epochs=1, warmup_epochs=0.5, progress=False, seed=3,
                      eval_retentions=[0.4], eval_methods=["random"])
    asked = cfg.to_dict()
    api = train(cfg)
    # json text, so that a NaN metric (no pycocoevalcap) equals itself
    assert api["run_dir"] == str(tmp_path / "api")
    assert json.dumps(api["rows"]) == json.dumps(cli["rows"])
    assert [row["method"] for row in api["rows"]] == [
        "Full tokens", "Random", "warmup only",
        "AVEX, L_RL (RLOO), fidelity reward, set-aware selection, dropped tokens merged from "
        "cosine 0.8 (this run)"]
    for name in ("warmup_policy.safetensors", "policy/model.safetensors"):
        assert (tmp_path / "api" / name).read_bytes() == (tmp_path / "cli" / name).read_bytes()
    got, want = final_weights(tmp_path / "api"), final_weights(tmp_path / "cli")
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    assert cfg.to_dict() == asked   # the caller's settings are not changed


def test_a_run_saved_before_reward_and_selection_existed_resumes_with_cider_and_topk(tmp_path):
    """Its config.json lacks the settings, so it trained with CIDEr, Top-K and the prompt's
    attention as its warmup teacher: a resume keeps those, not today's defaults."""
    run = tmp_path / "old"
    run.mkdir()
    saved = TrainConfig(run_dir=str(run), reward="cider", selection="topk",
                        warmup_teacher="prompt-attention").to_dict()
    for name in ("reward", "selection", "redundancy", "warmup_teacher"):
        del saved[name]
    (run / "config.json").write_text(json.dumps(saved))
    cfg = resumed_config(TrainConfig(run_dir=str(run), warmup_teacher="fidelity-gain"))
    assert (cfg.reward, cfg.selection, cfg.redundancy, cfg.warmup_teacher) == \
        ("cider", "topk", 0.0, "prompt-attention")
    (run / "config.json").write_text(json.dumps({**saved, "reward": "fidelity",
                                                 "selection": "set-aware", "redundancy": 2.0}))
    cfg = resumed_config(TrainConfig(run_dir=str(run), selection="topk"))
    assert (cfg.reward, cfg.selection, cfg.redundancy) == ("fidelity", "set-aware", 2.0)


@pytest.mark.slow
def test_a_stop_while_the_table_is_made_names_this_runs_resume(cache_dir, tmp_path, capsys,
                                                              monkeypatch):
    """A stop while CaCoVID-AV trains for the table, or while the table is scored, exits 130
    with this run's resume command (a comparison's own run would resume without the table),
    never a traceback; the resumed run then writes the table."""
    from avex.training import loop
    from avex.training.stopping import TrainingInterrupted

    run_dir = tmp_path / "run"
    args = tiny_args(cache_dir, run_dir, "--eval-retentions", "0.4", "--max-eval-clips", "4")
    resume = f"python -m avex.train --resume --run-dir {run_dir}"

    def comparison_stopped(*_, **__):
        raise TrainingInterrupted(run_dir / "cacovid" / "checkpoints" / "step-00000002",
                                  f"python -m avex.train --resume --run-dir {run_dir}/cacovid")

    monkeypatch.setattr(loop, "train_variant", comparison_stopped)
    with pytest.raises(SystemExit) as stop:
        main(args)
    err = capsys.readouterr().err
    assert stop.value.code == 130 and f"{resume}\n" in err + "\n" and "/cacovid" not in \
        err.split("resume with:")[1], err
    assert "training a comparison method of the table stopped" in err

    def scoring_stopped(*_, **__):
        raise KeyboardInterrupt

    monkeypatch.undo()
    monkeypatch.setattr(loop, "score_run", scoring_stopped)
    with pytest.raises(SystemExit) as stop:
        main(["--resume", "--run-dir", str(run_dir), "--no-progress"])
    err = capsys.readouterr().err
    assert stop.value.code == 130 and "stopped while scoring the table" in err, err
    assert resume in err and "Traceback" not in err
    monkeypatch.undo()
    assert main(["--resume", "--run-dir", str(run_dir), "--no-progress"])["rows"]
    assert (run_dir / "results.md").exists()


@pytest.mark.slow
def test_each_rl_record_logs_the_rate_its_step_trained_at(cache_dir, tmp_path):
    """metrics.jsonl's lr is the schedule's factor at that step times --lr (it once logged the
    next step's, so the last step read 0 though it trained above 0)."""
    from avex.training.steps import cosine_with_warmup

    run_dir = tmp_path / "run"
    main(tiny_args(cache_dir, run_dir, "--no-evaluate"))
    cfg = json.loads((run_dir / "config.json").read_text())
    rl = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()
          if json.loads(line)["phase"] == "rl"]
    factor = cosine_with_warmup(len(rl), cfg["lr_warmup"])
    assert [r["lr"] for r in rl] == pytest.approx([cfg["lr"] * factor(r["step"]) for r in rl])
    assert rl[-1]["lr"] > 0


def test_a_run_from_another_warmup_draws_no_empty_warmup_bar(cache_dir, tmp_path, capfd):
    """--warmup-from trains no warmup step: its progress shows the RL bar only (a 0-step
    "warmup" bar was drawn before, once per such run: twice in make train)."""
    main(tiny_args(cache_dir, tmp_path / "first", "--no-evaluate"))
    capfd.readouterr()
    args = [a for a in tiny_args(cache_dir, tmp_path / "second", "--no-evaluate",
                                 "--warmup-from", str(tmp_path / "first"))
            if a not in ("--no-progress",)]
    args = [a for i, a in enumerate(args)
            if not (a == "--warmup-epochs" or (i and args[i - 1] == "--warmup-epochs"))]
    main(args + ["--progress"])
    err = capfd.readouterr().err
    assert "RL + AVEX" in err and "warmup:" not in err, err
