"""scripts/decide_default_recipe.py: stage 2 of issue #36's choice of the default recipe, on
synthetic test-split results of one deciding benchmark whose arms differ by known shifts."""
import json
from pathlib import Path

import numpy as np
import pytest

from avex.intervals import compact_per_clip
from file_module import load_file

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "decide_default_recipe.py"
RETENTIONS = [0.5, 0.3, 0.2, 0.1]
JUDGE = {"benchmark": {"name": "embedded-default-seed4", "sha256": "b4" * 32},
         "captioner": {"sha256": "c4" * 32}}


@pytest.fixture(scope="module")
def decider():
    return load_file(SCRIPT)


def write(folder: Path, shifts: dict, *, others=None, split="test", clips=400, judge=JUDGE):
    """ablation.json: arm X = A + shifts[X][retention] per clip (+ noise), 3 seeds; sweep.json:
    ``others`` (method -> shift) as seedless rows."""
    rng = np.random.default_rng(7)
    base = rng.normal(450, 80, clips)
    rows, sweep_rows = [], []
    arms = {"A": {}, "C": {}, "C-fid": {}, **shifts}
    for seed in (0, 1, 2):
        for r in RETENTIONS:
            a = base - 200 * (0.5 - r) + rng.normal(0, 3, clips)
            for name, shift in arms.items():
                scores = a + shift.get(r, 0.0) + rng.normal(0, 10, clips)
                rows.append({"variant": name, "seed": seed, "retention": r,
                             "C_av": float(scores.mean()),
                             "per_clip": compact_per_clip({"C_av": scores})})
            for method, shift in (others or {}).items():
                sweep_rows.append({"method": method, "seed": seed, "retention": r,
                                   "C_av": float((a + shift).mean())})
    ablation = folder / "ablation.json"
    ablation.write_text(json.dumps({"rows": rows, "retentions": RETENTIONS, "split": split,
                                    "clips": clips, "judge": judge,
                                    "full": {"C_av": float(base.mean())}}))
    sweep = folder / "sweep.json"
    sweep.write_text(json.dumps({"rows": sweep_rows,
                                 "settings": {"split": split, "judge": judge}}))
    return ablation, sweep


def run(decider, ablation, sweep, chosen="D-fid"):
    return decider.decide(decider.load(ablation, "ablation"), chosen,
                          decider.load(sweep, "sweep"))


def test_a_choice_worse_than_a_nowhere_becomes_the_default_and_targets_are_read(decider,
                                                                               tmp_path):
    ablation, sweep = write(tmp_path, {"D-fid": {0.5: 3.0, 0.3: 3.0, 0.2: 8.0, 0.1: 20.0},
                                      "C-fid": {0.1: 5.0}},
                            others={"random": -40.0, "attention": +30.0})
    d = run(decider, ablation, sweep)
    assert d["default"] == "D-fid" and d["worse"] == []
    assert d["stronger"][0.1] == "C-fid"
    assert d["vs_controls"][("C-fid", 0.1)].low > 0
    assert d["targets"]["significant"] == {0.2: True, 0.1: True}
    # Attention-AV is far ahead but privileged: it doesn't count against the default
    assert all(d["targets"]["every_efficient"].values())
    text = decider.report(decider.load(ablation, "ablation"), d, sweep)
    assert "**D-fid becomes the default.**" in text and "privileged reference" in text


def test_a_choice_worse_than_a_somewhere_leaves_a(decider, tmp_path):
    ablation, sweep = write(tmp_path, {"D-fid": {0.5: -15.0, 0.1: 20.0}})
    d = run(decider, ablation, sweep)
    assert d["worse"] == [0.5] and d["default"] == "A"
    # the controls are then read against A
    assert abs(d["vs_controls"][("C", 0.1)].difference) < 3


def test_an_efficient_method_ahead_fails_the_every_method_target(decider, tmp_path):
    ablation, sweep = write(tmp_path, {"D-fid": {0.1: 20.0}}, others={"tome": +25.0})
    d = run(decider, ablation, sweep)
    assert d["default"] == "D-fid"
    assert d["targets"]["every_efficient"][0.5] is False
    assert d["targets"]["every_efficient"][0.1] is False   # 20 ahead of A is not 25


def test_the_val_split_and_mismatched_judges_are_refused(decider, tmp_path):
    ablation, sweep = write(tmp_path, {"D-fid": {}}, split="val")
    with pytest.raises(ValueError, match="split 'val'"):
        decider.load(ablation, "ablation")
    ablation, _ = write(tmp_path, {"D-fid": {}})
    other = {**JUDGE, "captioner": {"sha256": "ff" * 32}}
    (tmp_path / "other").mkdir()
    _, sweep = write(tmp_path / "other", {"D-fid": {}}, judge=other)
    with pytest.raises(ValueError, match="different judges"):
        run(decider, ablation, sweep)


def test_a_missing_arm_is_named(decider, tmp_path):
    ablation, sweep = write(tmp_path, {})
    with pytest.raises(ValueError, match=r"lacks the arms \['D-fid'\]"):
        run(decider, ablation, sweep)


def test_a_sweep_without_a_recorded_split_is_read_by_its_command(decider, tmp_path):
    _, sweep = write(tmp_path, {"D-fid": {}})
    data = json.loads(sweep.read_text())
    del data["settings"]["split"]
    for command, ok in (("python -m avex.evaluate sweep --seeds 0,1,2", True),
                        ("python -m avex.evaluate sweep --split test", True),
                        ("python -m avex.evaluate sweep --split val --seeds 0", False)):
        sweep.write_text(json.dumps({**data, "command": command}))
        if ok:
            assert decider.load(sweep, "sweep")["kind"] == "sweep"
        else:
            with pytest.raises(ValueError, match="split 'val'"):
                decider.load(sweep, "sweep")


def test_round_two_reads_the_choice_against_its_incumbent_and_a_third_control(decider,
                                                                             tmp_path):
    """Round 2: E-fid against the incumbent D-fid (A may be absent), read against C, C-fid and
    C10-fid. E-fid +8 over D-fid at 10%, level elsewhere: it becomes the default; C10-fid, the
    strongest control at 10%, is the one its target is read against."""
    ablation, sweep = write(tmp_path, {"D-fid": {0.1: 10.0}, "E-fid": {0.1: 18.0},
                                       "C-fid": {0.1: 4.0}, "C10-fid": {0.1: 12.0}})
    data = json.loads(ablation.read_text())
    data["rows"] = [row for row in data["rows"] if row["variant"] != "A"]
    ablation.write_text(json.dumps(data))
    decision = decider.decide(decider.load(ablation, "ablation"), "E-fid",
                              decider.load(sweep, "sweep"), incumbent="D-fid",
                              controls=("C", "C-fid", "C10-fid"))
    assert decision["default"] == "E-fid" and decision["worse"] == []
    assert decision["vs_incumbent"][0.1].difference == pytest.approx(8, abs=1.5)
    assert decision["stronger"][0.1] == "C10-fid"
    assert decision["vs_controls"][("C10-fid", 0.1)].difference == pytest.approx(6, abs=1.5)
    text = decider.report(decider.load(ablation, "ablation"), decision, None)
    assert "E-fid − D-fid, paired 95% interval" in text
    assert "**E-fid becomes the default.**" in text and "| C10-fid |" in text
    assert decider.as_json(decision)["incumbent"] == "D-fid"
    # worse than the incumbent somewhere: the incumbent stays
    worse, _ = write(tmp_path, {"D-fid": {0.5: 6.0, 0.1: 10.0}, "E-fid": {0.1: 18.0},
                                "C10-fid": {}})
    kept = decider.decide(decider.load(worse, "ablation"), "E-fid", incumbent="D-fid",
                          controls=("C", "C-fid", "C10-fid"))
    assert kept["default"] == "D-fid" and kept["worse"] == [0.5]
    (tmp_path / "no-c10").mkdir()
    without, _ = write(tmp_path / "no-c10", {"D-fid": {}, "E-fid": {}})
    with pytest.raises(ValueError, match=r"lacks the arms \['C10-fid'\]"):
        decider.decide(decider.load(without, "ablation"), "E-fid", incumbent="D-fid",
                       controls=("C", "C10-fid"))
    with pytest.raises(ValueError, match="controls must be CaCoVID-AV arms other than"):
        decider.decide(decider.load(ablation, "ablation"), "E-fid", incumbent="D-fid",
                       controls=("D-fid",))


def test_with_adds_the_arms_of_another_file_of_the_same_judge_and_clips(decider, tmp_path,
                                                                        capsys):
    """Round 6: the merged arms come from score_merging.py's files, read beside the ablation
    with --with; a file of another judge is refused, naming it."""
    ablation, sweep = write(tmp_path, {"D-fid": {0.1: 20.0}, "M": {0.1: 30.0}})
    data = json.loads(ablation.read_text())
    data["full"]["per_clip"] = [1.0]
    main_rows = [r for r in data["rows"] if r["variant"] != "M"]
    merged = {**data, "rows": [r for r in data["rows"] if r["variant"] == "M"]}
    ablation.write_text(json.dumps({**data, "rows": main_rows}))
    extra = tmp_path / "merged.json"
    extra.write_text(json.dumps(merged))
    out = tmp_path / "d.json"
    decider.main(["--chosen", "M", "--incumbent", "D-fid", "--ablation", str(ablation),
                  "--with", str(extra), "--sweep", str(sweep), "--json", str(out)])
    assert "**M becomes the default.**" in capsys.readouterr().out
    assert json.loads(out.read_text())["default"] == "M"
    extra.write_text(json.dumps({**merged, "judge": {**JUDGE, "captioner": {"sha256": "ff" * 32}}}))
    with pytest.raises(SystemExit):
        decider.main(["--chosen", "M", "--incumbent", "D-fid", "--ablation", str(ablation),
                      "--with", str(extra)])
    assert f"--with {extra}: another captioner" in capsys.readouterr().err


def test_a_round_that_chooses_nothing_reads_the_targets_and_names_its_benchmark(decider,
                                                                                 tmp_path, capsys):
    """Round 7: --chosen equal to --incumbent compares nothing; the report says so, the
    targets are still read, and the JSON names the benchmark and judge (pooled_targets.py)."""
    ablation, sweep = write(tmp_path, {"D-fid": {0.5: -4.0, 0.3: 3.0, 0.2: 8.0, 0.1: 20.0}})
    out = tmp_path / "d.json"
    decider.main(["--chosen", "D-fid", "--incumbent", "D-fid", "--ablation", str(ablation),
                  "--sweep", str(sweep), "--json", str(out)])
    text = capsys.readouterr().out
    assert "Nothing is chosen in this round: **D-fid is the default.**" in text
    assert "D-fid − D-fid" not in text and "becomes the default" not in text
    assert "- mean at least 0 at 50%, 40%, 30%: 50% not met, 30% met" in text
    got = json.loads(out.read_text())
    assert got["default"] == "D-fid" and got["benchmark"] == JUDGE["benchmark"]["name"]
    assert got["judge"] == [JUDGE["benchmark"]["sha256"], JUDGE["captioner"]["sha256"]]
