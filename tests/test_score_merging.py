"""scripts/score_merging.py: trained runs served merged against the same runs unmerged."""
import json
from pathlib import Path

import pytest

from avex.evaluate.__main__ import main as evaluate
from file_module import load_file

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "score_merging.py"


@pytest.fixture(scope="module")
def ablations(tiny_cache_dir, tmp_path_factory):
    """Two tiny ablations of A-fid, training seeds 0 and 1 apart (as two stops score them)."""
    files = []
    for seed in (0, 1):
        out = tmp_path_factory.mktemp(f"abl{seed}")
        evaluate(["ablation", "--benchmark-preset", "tiny", "--captioner-preset", "tiny",
                  "--cache-dir", str(tiny_cache_dir), "--out", str(out), "--no-progress",
                  "--max-new-tokens", "24", "--variants", "A-fid", "--seeds", str(seed),
                  "--retentions", "0.4,0.2", "--train-args",
                  "--batch-size 8 --micro-batch-size 4 --warmup-epochs 0.5 --epochs 0.5"])
        files.append(out / "ablation.json")
    return files


@pytest.mark.slow
def test_merged_rows_pair_with_the_files_rows(ablations, tiny_cache_dir, tmp_path):
    script = load_file(SCRIPT)
    out = tmp_path / "m"
    script.main([*map(str, ablations), "--variant", "A-fid", "--thresholds", "1,-1",
                 "--out", str(out), "--cache-dir", str(tiny_cache_dir), "--batch-size", "4"])
    saved = json.loads(out.with_suffix(".json").read_text())
    rows = [r for f in ablations for r in json.loads(f.read_text())["rows"]]
    assert {r["variant"] for r in saved["rows"]} == {"A-fid+merge1", "A-fid+merge-1"}
    assert sorted({r["seed"] for r in saved["rows"]}) == [0, 1]
    # at T = 1 nothing differs enough to merge on random features: the files' very captions
    for row in (r for r in saved["rows"] if r["threshold"] == 1):
        same = next(r for r in rows if r["seed"] == row["seed"]
                    and r["retention"] == row["retention"])
        assert row["per_clip"] == same["per_clip"]
    # at T = -1 every dropped token merges: the captions change somewhere
    assert any(row["per_clip"] != next(r for r in rows if r["seed"] == row["seed"]
                                       and r["retention"] == row["retention"])["per_clip"]
               for row in saved["rows"] if row["threshold"] == -1)
    found = {(i["ours"], i["retention"]): i for i in saved["intervals"]}
    assert found[("A-fid+merge1", 0.4)]["difference"] == pytest.approx(0.0, abs=1e-9)
    assert saved["full"] == json.loads(ablations[0].read_text())["full"]
    for row in saved["rows"]:   # relative to the output's folder, as an ablation.json's
        assert (out.parent / row["run"] / "config.json").is_file()
        assert not Path(row["run"]).is_absolute()
    text = out.with_suffix(".md").read_text()
    assert "| A-fid+mergeT − A-fid | 40% | 20% |" in text and "| T = -1 |" in text


def test_bad_input_is_refused_before_any_scoring(ablations, tiny_cache_dir, tmp_path):
    script = load_file(SCRIPT)
    with pytest.raises(ValueError, match="--thresholds"):
        script.score_merging(ablations, "A-fid", [1.5], tiny_cache_dir, 4)
    with pytest.raises(ValueError, match="no 'D-fid' rows"):
        script.score_merging(ablations, "D-fid", [0.8], tiny_cache_dir, 4)
    with pytest.raises(ValueError, match="more than one file"):
        script.score_merging([ablations[0], ablations[0]], "A-fid", [0.8], tiny_cache_dir, 4)
    with pytest.raises(SystemExit):
        script.main([str(ablations[0]), "--variant", "A-fid", "--thresholds", "high",
                     "--out", str(tmp_path / "x")])
