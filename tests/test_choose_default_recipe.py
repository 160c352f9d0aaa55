"""scripts/choose_default_recipe.py: stage 1 of issue #36's choice of the default recipe, on
synthetic val results of several benchmarks whose arms differ by known shifts."""
import json
from pathlib import Path

import numpy as np
import pytest

from avex.intervals import compact_per_clip
from file_module import load_file

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "choose_default_recipe.py"
RETENTIONS = [0.5, 0.3, 0.2, 0.1]


@pytest.fixture(scope="module")
def chooser():
    return load_file(SCRIPT)


def write_results(folder: Path, shifts: dict, *, benchmarks=2, split="val", clips=300,
                  noise=15.0, first=0, name="b"):
    """One ablation.json per benchmark (numbered from ``first``): arm X = A +
    shifts[X][retention] on every clip, plus ``noise`` points of noise per clip; 3 seeds."""
    rng = np.random.default_rng(1 + first)
    paths = []
    for b in range(first, first + benchmarks):
        base = rng.normal(450, 80, clips)
        rows = []
        for seed in (0, 1, 2):
            for r in RETENTIONS:
                a = base - 200 * (0.5 - r) + rng.normal(0, 3, clips)
                for name, shift in {"A": {}, **shifts}.items():
                    scores = a + shift.get(r, 0.0) + (rng.normal(0, noise, clips) if shift else 0)
                    rows.append({"variant": name, "seed": seed, "retention": r,
                                 "C_av": float(scores.mean()),
                                 "per_clip": compact_per_clip({"C_av": scores})})
        path = folder / f"{name}{b}.json"
        path.write_text(json.dumps({
            "rows": rows, "retentions": RETENTIONS, "split": split, "clips": clips,
            "judge": {"benchmark": {"name": f"embedded-default-seed{b}", "sha256": f"b{b}"},
                      "captioner": {"sha256": f"c{b}"}}}))
        paths.append(path)
    return paths


def decide(chooser, paths, candidates=("A", "A-fid", "B-fid")):
    results = chooser.load_results(paths)
    return chooser.choose(results, list(candidates), set(chooser.EXCHANGE_ARMS))


def test_a_candidate_ahead_at_low_retention_is_chosen_and_a_level_exchange_arm_is_not(
        chooser, tmp_path):
    fid = {0.2: 6.0, 0.1: 10.0}
    paths = write_results(tmp_path, {"A-fid": fid, "B-fid": {0.2: 6.5, 0.1: 10.5}})
    decision = decide(chooser, paths)
    assert decision["chosen"] == "A-fid"
    assert decision["eligible"] == ["A", "A-fid"]
    assert any(step.startswith("B-fid is out: an exchange arm") for step in decision["steps"])
    assert decision["against_incumbent"][("A-fid", 0.1)].low > 0
    assert "**Stage 1 chooses A-fid.**" in chooser.report(chooser.load_results(paths),
                                                          decision, ["A", "A-fid", "B-fid"])


def test_a_candidate_worse_than_a_anywhere_is_out(chooser, tmp_path):
    paths = write_results(tmp_path, {"A-fid": {0.5: -5.0, 0.2: 8.0, 0.1: 12.0},
                                     "B-fid": {0.5: -5.0, 0.2: 8.0, 0.1: 12.0}})
    decision = decide(chooser, paths)
    assert decision["chosen"] == "A"
    assert decision["eligible"] == ["A"]
    assert "A-fid is out: worse than A at 50%" in decision["steps"]


def test_an_exchange_arm_that_beats_a_fid_twice_and_loses_nowhere_can_win(chooser, tmp_path):
    paths = write_results(tmp_path, {"A-fid": {0.2: 5.0, 0.1: 8.0},
                                     "B-fid": {0.3: 4.0, 0.2: 10.0, 0.1: 14.0}})
    assert decide(chooser, paths)["chosen"] == "B-fid"


def test_the_highest_mean_loses_to_a_simpler_arm_it_is_not_ahead_of(chooser, tmp_path):
    """A-fid's mean over 20/10% is higher than A's by 0.4, within the noise: not ahead by
    the rule anywhere."""
    paths = write_results(tmp_path, {"A-fid": {0.2: 0.4, 0.1: 0.4}}, clips=200)
    decision = decide(chooser, paths, ("A", "A-fid"))
    assert decision["score"]["A-fid"] > decision["score"]["A"]
    assert decision["chosen"] == "A"
    assert "A-fid is ahead of the simpler A at no retention: A takes its place" in \
        decision["steps"]


def test_the_test_split_is_refused(chooser, tmp_path):
    paths = write_results(tmp_path, {"A-fid": {}}, split="test")
    with pytest.raises(ValueError, match=r"scored on split 'test'; stage 1 chooses on val "
                                         r"splits only"):
        chooser.load_results(paths)


def test_pooling_weights_benchmarks_equally(chooser, tmp_path):
    """A-fid + 10 on benchmark 0 only: the pooled difference is 5, its interval around 5."""
    paths = write_results(tmp_path, {"A-fid": {0.2: 10.0}}, benchmarks=1, noise=2.0)
    paths += write_results(tmp_path, {"A-fid": {0.2: 0.0}}, benchmarks=1, first=1, noise=2.0)
    results = chooser.load_results(paths)
    interval = chooser.pooled(results, "A-fid", "A", 0.2)
    assert interval.difference == pytest.approx(5.0, abs=0.3)
    assert interval.low < 5.0 < interval.high and interval.high - interval.low < 1.0


def test_arms_scored_apart_on_one_benchmark_are_merged(chooser, tmp_path):
    """D-fid scored later, in its own file, joins A and A-fid of the same benchmark; a file of
    the same benchmark under another captioner, or an arm given twice, is refused."""
    paths = write_results(tmp_path, {"A-fid": {0.1: 8.0}}, benchmarks=1)
    later = write_results(tmp_path, {"D-fid": {0.1: 15.0}}, benchmarks=1, name="later")
    data = json.loads(later[0].read_text())
    data["rows"] = [row for row in data["rows"] if row["variant"] == "D-fid"]
    later[0].write_text(json.dumps(data))
    results = chooser.load_results(paths + later)
    assert len(results) == 1
    assert {row["variant"] for row in results[0]["rows"]} == {"A", "A-fid", "D-fid"}
    assert chooser.choose(results, ["A", "A-fid", "D-fid"], set())["chosen"] == "D-fid"
    with pytest.raises(ValueError, match=r"both score \['A', 'A-fid'\]"):
        chooser.load_results(paths + paths)
    data["judge"]["captioner"]["sha256"] = "another"
    later[0].write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"differ in judge"):
        chooser.load_results(paths + later)


def test_a_later_round_compares_with_its_incumbent(chooser, tmp_path):
    """Round 2: D-fid is the incumbent. A candidate ahead of A but level with D-fid stays
    out of the default; one ahead of D-fid at 10% and worse nowhere is chosen; one worse than
    D-fid at 50% is out whatever it gains at 10%."""
    paths = write_results(tmp_path, {"D-fid": {0.2: 5.0, 0.1: 15.0},
                                     "E-fid": {0.2: 5.0, 0.1: 30.0},
                                     "D8-fid": {0.5: -12.0, 0.2: 5.0, 0.1: 40.0}})
    decision = decide(chooser, paths, ("D-fid", "E-fid", "D8-fid"))
    assert decision["eligible"] == ["D-fid", "E-fid"]
    assert "D8-fid is out: worse than D-fid at 50%" in decision["steps"]
    assert decision["chosen"] == "E-fid"
    assert decision["against_incumbent"][("E-fid", 0.1)].difference == pytest.approx(15, abs=3)
    text = chooser.report(chooser.load_results(paths), decision, ["D-fid", "E-fid", "D8-fid"])
    assert "| arm − D-fid |" in text and "**Stage 1 chooses E-fid.**" in text
    level = write_results(tmp_path, {"D-fid": {0.1: 15.0}, "E-fid": {0.1: 15.4}}, name="lvl",
                          clips=200)
    assert decide(chooser, level, ("D-fid", "E-fid"))["chosen"] == "D-fid"


def test_candidates_must_name_an_incumbent_and_a_challenger(chooser, tmp_path):
    paths = write_results(tmp_path, {"A-fid": {}})
    for bad in (["A"], ["A", "A-fid", "A"]):
        with pytest.raises(ValueError, match="--candidates must name the incumbent"):
            decide(chooser, paths, bad)
