"""scripts/matched_budget_report.py: A − every arm with its paired interval, the decision on the
intervals (not on a sum of standard deviations), and ablation.json files from before per-clip
scores were recorded."""
import json
from pathlib import Path

import numpy as np
import pytest

from avex.intervals import compact_per_clip
from file_module import load_file

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "matched_budget_report.py"
RETENTIONS = [0.4, 0.2]
DIAGNOSTICS = {"phase": "rl", "exchange_diagnostics": [{
    "retention": 0.4, "exchange_scale": 1.0,
    "types": {"vv": {"zero": 0.9, "disagree": 0.05, "positive": 0.05, "g_over_k": 0.125,
                     "valid": 1.0}},
    "grad_ratio": {"vv": 0.05, "total": 0.1, "unscaled": 2.0}}]}


@pytest.fixture(scope="module")
def report():
    return load_file(SCRIPT)


def ablation_json(folder: Path, b_gain: float, *, per_clip: bool = True, clips: int = 80,
                  default_gain: float | None = None):
    """An ablation.json of arms warmup, A, B, C over seeds 0-2: B = A + ``b_gain`` on every
    clip (plus noise); B's runs (relative to the file) hold a metrics.jsonl. With
    ``default_gain``, also the default recipe's arm D-fid = A + ``default_gain``."""
    rng = np.random.default_rng(0)
    base = rng.normal(450, 100, clips)
    rows = []
    for seed in (0, 1, 2):
        for retention in RETENTIONS:
            a = base - 100 * (0.5 - retention) + rng.normal(0, 5, clips)
            arms = {"warmup": a - 10 + rng.normal(0, 5, clips), "A": a,
                    "B": a + b_gain + rng.normal(0, 2, clips), "C": a + rng.normal(0, 5, clips)}
            if default_gain is not None:
                arms["D-fid"] = a + default_gain + rng.normal(0, 2, clips)
            for arm, values in arms.items():
                row = {"variant": arm, "seed": seed, "retention": retention,
                       "run": f"runs/seed{seed}/{arm}", "C_av": float(np.mean(values))}
                if per_clip:
                    row["per_clip"] = compact_per_clip({"C_av": values})
                rows.append(row)
    for seed in (0, 1, 2):
        run = folder / "runs" / f"seed{seed}" / "B"
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text(json.dumps(DIAGNOSTICS) + "\n")
    full = {"C_av": float(np.mean(base)),
            **({"per_clip": compact_per_clip({"C_av": base})} if per_clip else {})}
    path = folder / "ablation.json"
    path.write_text(json.dumps({"rows": rows, "retentions": RETENTIONS, "full": full,
                                "judge": {"benchmark": {"sha256": "ab" * 32},
                                          "captioner": {"sha256": "cd" * 32}}}))
    return path


def written_report(report, tmp_path, files, deciding):
    """Run the report on ``files`` (SEED=FILE) and return its Markdown and its JSON."""
    report.main([*files, "--deciding", str(deciding), "--out", str(tmp_path / "out")])
    return ((tmp_path / "out.md").read_text(),
            json.loads((tmp_path / "out.json").read_text()))


def test_b_beats_a_where_its_interval_lies_above_zero(report, tmp_path):
    files = [f"0={ablation_json(tmp_path / 'b0', 6.0)}",
             f"3={ablation_json(tmp_path / 'b3', 0.0)}"]
    md, saved = written_report(report, tmp_path, files, 0)
    decision = saved["benchmarks"]["0"]["decision"]
    assert decision["wins"] == 2 and decision["worse_at"] == []
    assert decision["exchange_term_becomes_default"] is True
    for value in decision["per_retention"].values():
        assert value["low"] > 0 and value["B_beats_A"] is True
    level = saved["benchmarks"]["3"]["decision"]
    assert level["wins"] == 0 and level["exchange_term_becomes_default"] is False
    assert "| A − arm | 40% | 20% |" in md
    assert "| B: RLOO over 4 anchors + calibrated L_ex on 4 exchange sets | -5.9 [-6." in md
    assert "X beats Y at a retention when the 95% paired bootstrap interval of X − Y lies " \
           "above 0" in md
    assert "B beats A at 2 retention(s) and is worse at none: the exchange term becomes the " \
           "default." in md
    assert "test split, 80 clips" in md
    # the runs are read relative to the ablation.json that names them
    assert saved["benchmarks"]["0"]["diagnostics"]["runs"] == [
        "runs/seed0/B", "runs/seed1/B", "runs/seed2/B"]
    intervals = saved["benchmarks"]["0"]["intervals"]
    assert {(i["arm"], i["retention"]) for i in intervals} == \
        {(arm, r) for arm in ("warmup", "B", "C", "full") for r in RETENTIONS}


def test_where_the_default_recipe_is_scored_it_is_compared_with_every_arm(report, tmp_path):
    """Issue #33's re-scoring adds D-fid (the default since issue #36): the report gives
    D-fid − every other arm beside A − arm, and names the variants it read."""
    files = [f"0={ablation_json(tmp_path / 'b0', 0.0, default_gain=8.0)}",
             f"1={ablation_json(tmp_path / 'b1', 0.0)}"]
    md, saved = written_report(report, tmp_path, files, 0)
    ours = saved["benchmarks"]["0"]["default_intervals"]
    assert {(i["arm"], i["retention"]) for i in ours} == \
        {(arm, r) for arm in ("warmup", "A", "B", "C", "full") for r in RETENTIONS}
    over_a = [i for i in ours if i["arm"] == "A"]
    assert all(i["ours"] == "D-fid" and i["low"] > 0 for i in over_a)
    assert "| D-fid − arm | 40% | 20% |" in md
    assert md.count("| D-fid − arm |") == 1   # benchmark 1 has no D-fid: no table, no error
    assert saved["benchmarks"]["1"]["default_intervals"] == []
    assert "--variants warmup,A,B,C,D-fid --seeds" in md


def test_files_without_per_clip_scores_give_no_interval_and_no_decision(report, tmp_path):
    old = ablation_json(tmp_path / "b3", 6.0, per_clip=False)
    md, saved = written_report(report, tmp_path, [f"3={old}"], 3)
    assert "no interval: per-clip scores not recorded" in md
    assert "No decision on the deciding benchmark (seed 3): no interval: per-clip scores not " \
           "recorded" in md
    decision = saved["benchmarks"]["3"]["decision"]
    assert decision["exchange_term_becomes_default"] is None
    assert "an unrecorded number of clips" in md


# --- scripts/arm_differences.py: X − Y for any two arms -----------------------------------------

@pytest.fixture(scope="module")
def arm_script():
    path = SCRIPT.with_name("arm_differences.py")
    return load_file(path)


def test_arm_differences_give_each_pair_its_interval_and_verdict(arm_script, tmp_path):
    """B = A + 6 on every clip: B − A is ahead at both retentions, A − B behind, C − A level."""
    path = ablation_json(tmp_path, 6.0)
    text = arm_script.main([str(path), "--pairs", "B:A,A:B,C:A"])
    assert "- B against A: 40% ahead, 20% ahead" in text
    assert "- A against B: 40% behind, 20% behind" in text
    assert "- C against A: 40% level, 20% level" in text
    assert "| B − arm | 40% | 20% |" in text


def test_arm_differences_refuse_an_arm_the_file_lacks(arm_script, tmp_path, capsys):
    path = ablation_json(tmp_path, 0.0)
    with pytest.raises(SystemExit):
        arm_script.main([str(path), "--pairs", "A-fid:A"])
    assert "--pairs names 'A-fid', which the file has no rows of" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        arm_script.main([str(path), "--pairs", "A"])
    assert "--pairs must be X:Y[,X:Y...], got 'A'" in capsys.readouterr().err


def test_arm_differences_take_missing_arms_from_another_file_of_the_same_judge(arm_script,
                                                                              tmp_path, capsys):
    """--with: B's rows read from a second file give what the whole file gives; a file whose
    full-token scores differ (another captioning) is refused."""
    whole = json.loads(ablation_json(tmp_path, 6.0).read_text())
    expected = arm_script.main([str(tmp_path / "ablation.json"), "--pairs", "B:A,C:A"])
    without_b = {**whole, "rows": [r for r in whole["rows"] if r["variant"] != "B"]}
    only_b = {**whole, "rows": [r for r in whole["rows"] if r["variant"] in ("B", "A")]}
    (tmp_path / "new.json").write_text(json.dumps(without_b))
    (tmp_path / "old.json").write_text(json.dumps(only_b))
    assert arm_script.main([str(tmp_path / "new.json"), "--with", str(tmp_path / "old.json"),
                            "--pairs", "B:A,C:A"]) == expected
    tagged = arm_script.main([str(tmp_path / "new.json"), "--with",
                              f"{tmp_path / 'old.json'}@old", "--pairs", "B@old:A@old,B@old:A"])
    assert "- B@old against A@old: 40% ahead, 20% ahead" in tagged
    assert "- B@old against A: 40% ahead, 20% ahead" in tagged
    other_full = {**only_b, "full": {**only_b["full"], "per_clip": {"C_av": [0.0]}}}
    (tmp_path / "other.json").write_text(json.dumps(other_full))
    with pytest.raises(SystemExit):
        arm_script.main([str(tmp_path / "new.json"), "--with", str(tmp_path / "other.json"),
                         "--pairs", "B:A"])
    assert "its full-token scores differ from the file's" in capsys.readouterr().err


def test_arm_differences_restricted_to_one_seed_pair_that_seed_alone(arm_script, tmp_path,
                                                                      capsys):
    """--seeds 1: the interval is seed 1's own B − A (one row a side), not the 3-seed one."""
    path = ablation_json(tmp_path, 6.0)
    data = json.loads(path.read_text())
    one = arm_script.only_seeds(data, "1")
    assert {r["seed"] for r in one["rows"]} == {1}
    text = arm_script.main([str(path), "--pairs", "B:A", "--seeds", "1"])
    b = [r for r in data["rows"] if r["variant"] == "B" and r["seed"] == 1
         and r["retention"] == 0.4][0]["C_av"]
    a = [r for r in data["rows"] if r["variant"] == "A" and r["seed"] == 1
         and r["retention"] == 0.4][0]["C_av"]
    assert f"{b - a:+.1f} [" in text
    with pytest.raises(SystemExit):
        arm_script.main([str(path), "--pairs", "B:A", "--seeds", "7"])
    assert "no row has those training seeds" in capsys.readouterr().err
