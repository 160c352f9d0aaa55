"""python -m avex.evaluate on the tiny benchmark: the sweep (training its policies, then reusing
given runs with several seeds), Rel. as the paper defines it, the motivation figure, bad
arguments."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from avex.evaluate import __main__ as evaluate_cli
from avex.evaluate.__main__ import cli, main
from avex.evaluate.sweep import relative_performance
from avex.methods import METHODS, SELECTORS
from avex.training.stopping import TrainingInterrupted
from badinput import exits_with_usage_error

TRAIN = "--batch-size 8 --micro-batch-size 4 --epochs 0.5 --warmup-epochs 0.5"


@pytest.fixture(scope="module")
def cache_dir(tiny_cache_dir):
    """The session's tiny benchmark and captioner (tests/conftest.py)."""
    return tiny_cache_dir


def tiny(cache_dir, out, *extra):
    return ["--benchmark-preset", "tiny", "--captioner-preset", "tiny", "--cache-dir",
            str(cache_dir), "--out", str(out), "--no-progress", "--max-new-tokens", "12", *extra]


@pytest.fixture(scope="module")
def trained_sweep(cache_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    result = main(["sweep", *tiny(cache_dir, out, "--retentions", "0.4,0.2",
                                  "--train-args", TRAIN, "--qualitative", "2")])
    return out, result


def test_relative_performance_is_the_papers_definition():
    full = {"C_av": 56.8, "C_v": 52.1, "C_a": 51.9, "C_T": 80.5}
    row = {"C_av": 55.3, "C_v": 50.7, "C_a": 50.5, "C_T": 78.3}  # the paper's AVEX at 20%
    assert relative_performance(row, full) == pytest.approx(97.3, abs=0.05)
    assert relative_performance(full, full) == pytest.approx(100.0)
    # without a transfer column: the mean of the three ratios
    assert relative_performance({"C_av": 10, "C_v": 20, "C_a": 30},
                                {"C_av": 20, "C_v": 20, "C_a": 20}) == pytest.approx(100.0)


@pytest.mark.slow
def test_sweep_writes_table_json_figure_and_examples(trained_sweep):
    out, result = trained_sweep
    saved = json.loads((out / "sweep.json").read_text())
    rows = saved["rows"]
    assert saved["settings"]["split"] == "test"    # what was scored, for readers of the file
    assert [r["method"] for r in rows[:1]] == ["full"] and rows[0]["Rel"] == 100.0
    assert len(rows) == 1 + len(SELECTORS) * 2
    assert {(r["method"], r["retention"]) for r in rows[1:]} == \
        {(m, r) for m in SELECTORS for r in (0.4, 0.2)}
    full = rows[0]
    assert full["C_av"] > 0 and full["C_T"] > 0
    for r in rows[1:]:
        assert r["Rel"] == pytest.approx(relative_performance(r, full))
        assert r["seed"] == 0
    assert all(r["run"].endswith(f"{r['method']}-seed0") for r in rows
               if r["method"] in ("avex", "cacovid"))
    cacovid = json.loads((out / "runs" / "cacovid-seed0" / "config.json").read_text())
    assert cacovid["exchanges"] is False
    md = (out / "sweep.md").read_text()
    assert "| method | retention | C_av | C_v | C_a | transfer C | C_av / full | Rel. | seeds |" \
        in md
    for r in rows[1:]:
        assert r["C_av_full"] == pytest.approx(r["C_av"] / full["C_av"])
    labels = {r["method"]: r["label"] for r in rows}
    assert labels == {"full": "Full tokens", **{m: METHODS[m].label for m in SELECTORS
                                                if m != "avex"},
                      "avex": "AVEX-Prune (RLOO over 8 anchors, no exchange term, fidelity "
                              "reward, set-aware selection (redundancy 4), dropped tokens merged "
                              "from cosine 0.8, caption-attention warmup)"}
    for method, label in labels.items():
        if method != "full":
            assert f"| {label} | 40% |" in md and f"| {label} | 20% |" in md
    assert "privileged reference" in labels["attention"]
    assert f"{METHODS['attention'].label}: it reads the frozen captioner's" in md  # the note
    # the table, the differences table and two qualitative clips
    assert md.count("| Full tokens |") == 1 + 1 + 2
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(result["qualitative"]) == 2 and set(SELECTORS) <= set(result["qualitative"][0])


@pytest.mark.slow
def test_a_sweep_into_a_folder_of_other_runs_is_refused_before_any_work(trained_sweep,
                                                                         cache_dir, capsys):
    """The sweep reuses the runs in its --out; runs trained with other settings are refused up
    front, not scored as the new settings' (its plan of runs is the one it trains)."""
    from avex.evaluate.__main__ import parse_args

    out, _ = trained_sweep
    _, same = parse_args(["sweep", *tiny(cache_dir, out, "--train-args", TRAIN)])
    planned = same.validate().planned_runs(out)
    assert [(Path(c.run_dir).name, c.warmup_from) for c in planned] == [
        ("avex-seed0", None), ("cacovid-seed0", str(out / "runs" / "avex-seed0"))]
    before = sorted(out.rglob("*"))
    exits_with_usage_error(main, ["sweep", *tiny(cache_dir, out, "--train-args",
                                                 TRAIN.replace("--epochs 0.5", "--epochs 1"))],
                           r"runs/avex-seed0 already holds a run trained with other settings "
                           r"than this one asks for: epochs=1\.0 \(the run has 0\.5\)", capsys)
    assert sorted(out.rglob("*")) == before


@pytest.mark.slow
def test_seeds_give_mean_and_std_and_given_runs_are_reused(trained_sweep, cache_dir, tmp_path):
    first, _ = trained_sweep
    result = main(["sweep", *tiny(cache_dir, tmp_path, "--retentions", "0.2", "--seeds", "0,1",
                                  "--avex-run", str(first / "runs" / "avex-seed0"),
                                  "--cacovid-run", str(first / "runs" / "cacovid-seed0"),
                                  "--methods", "random,tome,avex,cacovid", "--qualitative",
                                  "1")])
    assert not (tmp_path / "runs").exists()  # nothing trained
    rows = result["rows"]
    random_rows = [r for r in rows if r["method"] == "random"]
    assert [r["seed"] for r in random_rows] == [0, 1]
    assert random_rows[0]["C_av"] != random_rows[1]["C_av"] or \
        random_rows[0]["C_v"] != random_rows[1]["C_v"]
    tome = [r for r in rows if r["method"] == "tome"]
    assert tome[0]["C_av"] == tome[1]["C_av"]
    agg = {r["method"]: r for r in result["aggregate"]}
    assert agg["random"]["C_av_std"] > 0 or agg["random"]["C_v_std"] > 0
    assert agg["tome"]["C_av_std"] == 0
    assert " ± " in result["table"]
    # the same policy at the same retention gives the same numbers as in the first sweep
    before = {r["method"]: r for r in json.loads((first / "sweep.json").read_text())["rows"]
              if r["retention"] == 0.2}
    assert agg["avex"]["C_av"] == pytest.approx(before["avex"]["C_av"])


def test_motivation_writes_figure_and_numbers(cache_dir, tmp_path):
    numbers = main(["motivation", *tiny(cache_dir, tmp_path, "--clips", "4",
                                        "--base-sets", "2", "--base-retention", "0.05")])
    saved = json.loads((tmp_path / "motivation.json").read_text())
    assert saved["clips"] == 4
    rho = saved["spearman_attention_gain_pooled"]  # NaN when the tiny captioner's gains are flat
    assert rho != rho or -1 <= rho <= 1
    assert len(saved["pairs"]) == saved["non_additivity"]["clips"]
    assert saved["pairs"] and all(p["deviation"] == pytest.approx(
        p["d_av"] - p["d_v"] - p["d_a"]) for p in saved["pairs"])
    assert (tmp_path / "motivation.png").read_bytes()[:4] == b"\x89PNG"
    assert "Spearman" in (tmp_path / "motivation.md").read_text()
    assert numbers["non_additivity"]["group_size"] == 2


@pytest.mark.parametrize("flags,match", [
    (["--methods", "random,fastvv"], r"methods must be one of .* got .fastvv."),
    (["--retentions", "0.4,0"], r"retentions must be in \(0, 1\], got 0"),
    (["--avex-run", "/no/such/run"], "--avex-run: no run directory"),
    (["--retentions", "0.4,0.2,0.4"], r"retentions has duplicates: \[0.4, 0.2, 0.4\]"),
    (["--batch-size", "0"], "batch_size must be >= 1, got 0"),
])
def test_bad_arguments(cache_dir, tmp_path, flags, match, capsys):
    """Usage errors (exit 2) before any file is written; more in tests/test_bad_input_cli.py."""
    exits_with_usage_error(main, ["sweep", *tiny(cache_dir, tmp_path / "out", *flags)], match,
                           capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_ablation_trains_variants_and_reuses_given_runs(trained_sweep, cache_dir, tmp_path,
                                                       capsys):
    first, _ = trained_sweep
    result = main(["ablation", *tiny(cache_dir, tmp_path, "--variants", "warmup,random,full",
                                     "--train-args", TRAIN, "--run",
                                     f"full={first / 'runs' / 'avex-seed0'}")])
    assert [r["variant"] for r in result["rows"]] == ["warmup", "random", "full"]
    runs = tmp_path / "runs" / "seed0"
    assert not (runs / "full").exists()
    cfg = json.loads((runs / "random" / "config.json").read_text())
    assert (cfg["exchange_selection"], cfg["exchange_types"], cfg["retention"]) == \
        ("random", ["va", "av"], 0.2)
    assert cfg["warmup_from"] == str(runs / "warmup")   # the seed's one warmup
    assert json.loads((runs / "warmup" / "config.json").read_text())["warmup_only"]
    md = (tmp_path / "ablation.md").read_text()
    assert "| Random exchange | ✗ | ✗ | mixed | mixed |" in md
    assert "s (training of 2 run(s) included)." in md   # the warmup and random; full reused
    assert all(r["C_av"] >= 0 for r in result["rows"])
    exits_with_usage_error(main, ["ablation", *tiny(cache_dir, tmp_path / "x", "--run",
                                                    "nope=/tmp")], "--run must be VARIANT=DIR",
                           capsys)


@pytest.mark.slow
def test_ablation_over_seeds_reports_mean_and_std(trained_sweep, cache_dir, tmp_path):
    result = main(["ablation", *tiny(cache_dir, tmp_path, "--variants", "warmup,vv",
                                     "--train-args", TRAIN, "--seeds", "0,1")])
    assert [(r["variant"], r["seed"]) for r in result["rows"]] == \
        [("warmup", 0), ("vv", 0), ("warmup", 1), ("vv", 1)]
    for seed in (0, 1):
        cfg = json.loads((tmp_path / "runs" / f"seed{seed}" / "vv" / "config.json").read_text())
        assert (cfg["seed"], cfg["warmup_from"]) == \
            (seed, str(tmp_path / "runs" / f"seed{seed}" / "warmup"))
    vv = [r["C_av"] for r in result["rows"] if r["variant"] == "vv"]
    line = next(x for x in (tmp_path / "ablation.md").read_text().splitlines()
                if x.startswith("| V-to-V only"))
    assert f"{np.mean(vv):.1f} ± {np.std(vv):.1f}" in line and line.endswith("| 0,1 |")


def test_random_exchanges_keep_delta_f_on_the_policy_scores():
    import torch

    from avex.training.config import TrainConfig
    from avex.kernels import build_exchanges, gumbel_topk
    from avex.training.steps import random_exchanges

    torch.manual_seed(0)
    scores = torch.randn(3, 40, requires_grad=True)
    modality = torch.tensor([0] * 32 + [1] * 8).repeat(3, 1)
    idx, _ = gumbel_topk(scores.detach(), 8, sample=False)
    cfg = TrainConfig(g=2, exchange_types=["va", "av"])
    ex = random_exchanges(scores, idx, modality, cfg, seed=7)
    again = random_exchanges(scores, idx, modality, cfg, seed=7)
    assert torch.equal(ex.removed, again.removed)  # seeded
    ranked = build_exchanges(scores.detach(), idx, modality, g=2, types=("va", "av"))
    assert not torch.equal(ex.removed, ranked.removed)  # not the lowest-score groups
    s = scores.detach()
    for b in range(3):
        for t in range(2):
            rem = [i for i in ex.removed[b, t].tolist() if i >= 0]
            ins = [i for i in ex.inserted[b, t].tolist() if i >= 0]
            assert set(rem) <= set(idx[b].tolist()) and not set(ins) & set(idx[b].tolist())
            torch.testing.assert_close(ex.delta_f[b, t], s[b, rem].sum() - s[b, ins].sum())
    ex.delta_f.sum().backward()
    assert scores.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="exchange_selection must be one of"):
        TrainConfig(exchange_selection="greedy").validate()


@pytest.mark.slow
def test_matched_budget_arms_at_several_retentions_and_a_sweep_of_their_runs(
        trained_sweep, cache_dir, tmp_path):
    """The ablation machinery runs issue #25's arms from one warmup per seed and scores them at
    every retention; the sweep takes their runs per seed ({seed} in --avex-run)."""
    abl = tmp_path / "abl"
    result = main(["ablation", *tiny(cache_dir, abl, "--variants", "A,C",
                                     "--retentions", "0.4,0.2", "--train-args", TRAIN)])
    assert [(r["variant"], r["retention"]) for r in result["rows"]] == \
        [("A", 0.4), ("A", 0.2), ("C", 0.4), ("C", 0.2)]
    a = json.loads((abl / "runs" / "seed0" / "A" / "config.json").read_text())
    c = json.loads((abl / "runs" / "seed0" / "C" / "config.json").read_text())
    assert (a["anchors"], a["rl_estimator"], a["exchanges"]) == (8, "rloo", False)
    assert (c["anchors"], c["rl_estimator"]) == (8, "group")
    assert a["warmup_from"] == c["warmup_from"] == str(abl / "runs" / "seed0" / "warmup")
    md = (abl / "ablation.md").read_text()
    assert "| variant | 40% | 20% | seeds |" in md and "C_av / full tokens:" in md
    assert "s (training of 3 run(s) included)." in md   # the warmup, A and C
    saved = json.loads((abl / "ablation.json").read_text())
    assert saved["runs_trained"] == 3
    # the same call again finds its runs finished in its own folder: scoring only
    main(["ablation", *tiny(cache_dir, abl, "--variants", "A,C", "--retentions", "0.4,0.2",
                            "--train-args", TRAIN)])
    assert "s (scoring only: every run was reused)." in (abl / "ablation.md").read_text()
    assert json.loads((abl / "ablation.json").read_text())["runs_trained"] == 0
    assert saved["full"]["C_av"] > 0 and saved["judge"]["benchmark"]["sha256"]
    ratio = result["rows"][0]["C_av"] / result["full"]["C_av"]
    assert f"{ratio:.3f}" in md
    sweep = main(["sweep", *tiny(cache_dir, tmp_path / "sweep", "--retentions", "0.2",
                                 "--methods", "avex,cacovid", "--qualitative", "0",
                                 "--avex-run", str(abl / "runs" / "seed{seed}" / "A"),
                                 "--cacovid-run", str(abl / "runs" / "seed{seed}" / "C"))])
    assert not (tmp_path / "sweep" / "runs").exists()   # nothing trained
    by_method = {r["method"]: r for r in sweep["rows"] if r["method"] != "full"}
    assert by_method["avex"]["run"] == "../abl/runs/seed0/A"   # relative to the sweep's out
    # a given CaCoVID-AV run may have trained otherwise than the sweep's own: its label says how
    assert by_method["cacovid"]["label"] == ("CaCoVID-AV (group-normalised advantage over 8 "
                                             "anchors, no exchange term)")
    assert by_method["avex"]["C_av"] == pytest.approx(
        next(r["C_av"] for r in result["rows"] if (r["variant"], r["retention"]) == ("A", 0.2)))


def test_the_command_line_builds_the_settings_the_functions_take(cache_dir, tmp_path):
    """python -m avex.evaluate is a thin layer: its flags become the settings dataclass that
    run_sweep takes from Python, and --train-args is split once, as a shell would, into the
    training settings both the check and the run use (a quoted path with a space works)."""
    from avex.training.config import TrainConfig
    from avex.evaluate.__main__ import parse_args
    from avex.evaluate.sweep import SweepSettings

    folder = tmp_path / "with space"
    folder.mkdir()
    (folder / "train.json").write_text('{"epochs": 0.5, "anchors": 3}')
    _, settings = parse_args(["sweep", *tiny(cache_dir, tmp_path / "out", "--seeds", "0,1",
                                              "--methods", "random,avex", "--train-args",
                                              f"--config '{folder / 'train.json'}' --lr 0.001")])
    by_hand = SweepSettings(benchmark_preset="tiny", captioner_preset="tiny",
                            cache_dir=str(cache_dir), out=str(tmp_path / "out"),
                            progress=False, max_new_tokens=12, seeds=[0, 1],
                            methods=["random", "avex"],
                            train=TrainConfig(epochs=0.5, anchors=3, lr=0.001)).validate()
    assert settings == by_hand and settings.validate() == settings   # run_sweep checks again
    assert settings.decoding_source == {"num_beams": "default", "max_new_tokens": "flag"}
    base = settings.base_train_config()
    assert (base.epochs, base.anchors, base.lr, base.evaluate) == (0.5, 3, 0.001, False)
    assert (base.benchmark_preset, base.cache_dir) == ("tiny", str(cache_dir))


@pytest.mark.slow
def test_results_record_no_machine_path(trained_sweep, cache_dir, tmp_path):
    """The sweep's and the ablation's files name their data and captioner relative to the cache
    root, and their runs relative to the files' folder: no string is an absolute path, none
    names the (temporary) folders this machine used."""
    from test_results_files import assert_portable

    out, _ = trained_sweep
    machine = Path(os.path.commonpath([out, cache_dir, tmp_path]))
    assert_portable(out, machine)
    run = out / "runs" / "avex-seed0"
    result = main(["ablation", *tiny(cache_dir, tmp_path / "abl", "--variants", "warmup,A",
                                     "--run", f"warmup={run}", "--run", f"A={run}")])
    assert not (tmp_path / "abl" / "runs").exists()   # both given: nothing trained
    assert_portable(tmp_path / "abl", machine)
    assert {r["run"] for r in result["rows"]} == {os.path.relpath(run, tmp_path / "abl")}
    md = (tmp_path / "abl" / "ablation.md").read_text()
    # the sweep's AVEX-Prune run stands for both, so each label says how it differs
    assert "| A − variant | 20% |" in md and "| Warmup only (the given run: " in md
    assert "reward fidelity" in next(line for line in md.splitlines() if "| Warmup only" in line)
    assert "s (scoring only: every run was reused)." in md


def test_the_ablation_intervals_keep_full_avex_apart_from_full_tokens():
    """Table 3's "full" variant (Full AVEX, g = 8) and full tokens each get their own line."""
    from avex.evaluate.ablation import ABLATIONS, arm_differences, differences_markdown
    from avex.intervals import compact_per_clip

    rng = np.random.default_rng(5)
    tokens = rng.normal(450, 100, 30)
    rows = [{"variant": name, "label": ABLATIONS[name][0], "retention": 0.2, "seed": seed,
             "per_clip": compact_per_clip({"C_av": tokens - shift + rng.normal(0, 3, 30)})}
            for name, shift in (("A", 20), ("full", 24), ("g4", 21)) for seed in (0, 1)]
    full = {"per_clip": compact_per_clip({"C_av": tokens})}
    intervals = arm_differences(rows, full, [0.2])
    assert set(intervals) == {("full", 0.2), ("g4", 0.2), ("full tokens", 0.2)}
    md = "\n".join(differences_markdown(intervals, rows, [0.2]))
    assert "| Full AVEX (g = 8) | +" in md and "| Full tokens | -" in md and "| g = 4 |" in md


def test_training_settings_an_experiment_would_override_are_refused_and_others_kept(tmp_path):
    """--train-args that a trained run would not keep (a variant's or method's own setting, the
    experiment's seed or retention) are refused before any work; the rest reach every run."""
    from avex.evaluate.ablation import AblationSettings
    from avex.evaluate.sweep import SweepSettings
    from avex.training.config import TrainConfig

    tiny_kw = dict(benchmark_preset="tiny", captioner_preset="tiny", out=str(tmp_path / "o"))
    kept = AblationSettings(**tiny_kw, variants=["Dc-fid", "D-fid"],
                            train=TrainConfig(fidelity_form="margin", lr=3e-4)).validate()
    assert kept.asked_training() == {"fidelity_form": "margin", "lr": 3e-4}
    assert (kept.base_train_config().fidelity_form, kept.base_train_config().lr) == ("margin", 3e-4)
    # a run whose settings would be refused when it trains is refused now (S, the exchange
    # search, draws no anchors for lambda_best to imitate)
    with pytest.raises(ValueError, match=r"--train-args with variant 'S': lambda_best = 0.5"):
        AblationSettings(**tiny_kw, variants=["A", "S"],
                         train=TrainConfig(lambda_best=0.5)).validate()
    # the variant's own setting would win: refused, naming the variant
    with pytest.raises(ValueError, match=r"redundancy=8.0 would be overridden: variant "
                                         r"'Dc-fid' is defined with redundancy=4.0"):
        AblationSettings(**tiny_kw, variants=["Dc-fid"],
                         train=TrainConfig(redundancy=8.0)).validate()
    # a variant given as a run trains nothing, so its definition doesn't matter
    given = AblationSettings(**tiny_kw, variants=["A"], runs={"A": str(tmp_path)},
                             train=TrainConfig(anchors=4))
    assert given.trained_definitions() == {}   # nothing trained, not even a shared warmup
    given.check_training_kept(given.trained_definitions(), "variant")
    assert list(AblationSettings(**tiny_kw, variants=["A", "Dc-fid"]).trained_definitions()) \
        == ["A", "Dc-fid", "warmup"]
    assert list(AblationSettings(**tiny_kw, variants=["Dc-fid"]).trained_definitions()) == \
        ["Dc-fid"]   # it trains a warmup of its own
    with pytest.raises(ValueError, match="anchors=4 would be overridden: variant 'A'"):
        AblationSettings(**tiny_kw, variants=["A"], train=TrainConfig(anchors=4)).check_training_kept(
            AblationSettings(**tiny_kw, variants=["A"]).trained_definitions(), "variant")
    # the sweep: CaCoVID-AV's definition counts only where the sweep trains it
    with pytest.raises(ValueError, match="redundancy=2.0 would be overridden: method 'CaCoVID-AV' is "
                                         "defined with redundancy=0.0"):
        SweepSettings(**tiny_kw, methods=["cacovid"],
                      train=TrainConfig(selection="set-aware", redundancy=2.0)).check()
    SweepSettings(**tiny_kw, methods=["avex"],
                  train=TrainConfig(selection="set-aware", redundancy=2.0)).check()


def test_decoding_note_names_each_given_flag_once_with_its_seeds():
    from avex.evaluate.common import runs_phrase

    flags = ["--avex-run (seed 0)", "--avex-run (seed 1)", "--avex-run (seed 2)",
             "--cacovid-run (seed 0)", "--warmup-run"]
    assert runs_phrase(flags) == ("--avex-run (seeds 0, 1, 2) and --cacovid-run (seed 0) and "
                                  "--warmup-run")
    from types import SimpleNamespace

    from avex.evaluate.sweep import decoding_note

    source = "run " + runs_phrase(flags)
    note = decoding_note(SimpleNamespace(num_beams=1, max_new_tokens=24, decoding_source={
        "num_beams": source, "max_new_tokens": source}))
    assert note == ("Decoding: 1 beam(s), at most 24 new tokens (num_beams and max_new_tokens "
                    f"from {source}).")


@pytest.mark.parametrize("stop, said", [
    (KeyboardInterrupt(), "interrupted: no results were written; the runs already trained"),
    (TrainingInterrupted(Path("R/checkpoints/step-00000003"), "python -m avex.train --resume"),
     "interrupted: a run stopped training at checkpoint R/checkpoints/step-00000003. No "
     "results were written; the same command resumes that run"),
])
def test_an_interrupted_command_says_what_is_kept_and_exits_130(cache_dir, tmp_path, capsys,
                                                                 monkeypatch, stop, said):
    def interrupted(settings):
        raise stop
    monkeypatch.setattr(evaluate_cli, "run_sweep", interrupted)
    assert cli(["sweep", *tiny(cache_dir, tmp_path / "out", "--methods", "random")]) == 130
    assert said in capsys.readouterr().err
    assert not (tmp_path / "out" / "sweep.json").exists()


def test_sigterm_while_scoring_ends_the_same_way_and_the_handler_is_restored(cache_dir,
                                                                            tmp_path, capsys,
                                                                            monkeypatch):
    def terminated(settings):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)   # the signal lands here
        raise AssertionError("SIGTERM did not interrupt")
    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(evaluate_cli, "run_sweep", terminated)
    assert cli(["sweep", *tiny(cache_dir, tmp_path / "out", "--methods", "random")]) == 130
    assert "interrupted: no results were written" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.slow
def test_ctrl_c_while_a_sweep_trains_stops_at_a_checkpoint_and_the_same_command_resumes(
        cache_dir, tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, "-m", "avex.evaluate", "sweep",
               *tiny(cache_dir, out, "--methods", "avex", "--retentions", "0.2",
                     "--train-args", "--batch-size 8 --micro-batch-size 4 --epochs 2 "
                                     "--warmup-epochs 0.5 --checkpoint-every 1")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    victim = subprocess.Popen(command, cwd=Path(__file__).resolve().parents[1], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log = out / "runs" / "avex-seed0" / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and victim.poll() is None:   # an RL step has run
        if log.exists() and any('"phase": "rl"' in line for line in log.open()):
            break
        time.sleep(0.05)
    assert victim.poll() is None, "the sweep finished before it could be stopped"
    victim.send_signal(signal.SIGINT)
    _, err = victim.communicate(timeout=300)
    assert victim.returncode == 130, err[-2000:]
    assert "interrupted: a run stopped training at checkpoint" in err, err[-2000:]
    assert "Traceback" not in err and not (out / "sweep.json").exists()
    again = subprocess.run(command, cwd=Path(__file__).resolve().parents[1], env=env,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resuming" in again.stdout + again.stderr and (out / "sweep.json").exists()


def test_more_qualitative_clips_than_the_split_holds_is_said(cache_dir, tmp_path, capsys):
    """--qualitative N beyond the clips scored (here --max-clips 3) is said in a note, and the
    report shows those there are (it showed them without a word)."""
    result = main(["sweep", *tiny(cache_dir, tmp_path / "out", "--methods", "random",
                                  "--retentions", "0.4", "--transfer-split", "none",
                                  "--max-clips", "3", "--qualitative", "5")])
    assert "note: qualitative = 5, but the test split has 3 clip(s) (max_clips = 3); the " \
           "report shows 3" in capsys.readouterr().out
    assert len(result["qualitative"]) == 3
