"""scripts/score_warmups.py: each run's warmup against the finished run, on a tiny ablation."""
import json
from pathlib import Path

import pytest

from avex.evaluate.__main__ import main as evaluate
from file_module import load_file

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "score_warmups.py"


@pytest.fixture(scope="module")
def ablation(tiny_cache_dir, tmp_path_factory):
    """A tiny ablation: the seed's warmup (served Top-K), A-fid (Top-K) and D-fid (set-aware),
    both from that warmup."""
    out = tmp_path_factory.mktemp("abl")
    evaluate(["ablation", "--benchmark-preset", "tiny", "--captioner-preset", "tiny",
              "--cache-dir", str(tiny_cache_dir), "--out", str(out), "--no-progress",
              "--max-new-tokens", "24", "--variants", "warmup,A-fid,D-fid",
              "--retentions", "0.4,0.2", "--train-args",
              "--batch-size 8 --micro-batch-size 4 --warmup-epochs 0.5 --epochs 0.5"])
    return out / "ablation.json"


@pytest.mark.slow
def test_a_runs_warmup_scores_as_the_warmup_row_clip_for_clip(ablation, tiny_cache_dir):
    script = load_file(SCRIPT)
    got = script.score_warmups(ablation, "A-fid", tiny_cache_dir, batch_size=4)
    result = json.loads(ablation.read_text())
    warmup = {r["retention"]: r for r in result["rows"] if r["variant"] == "warmup"}
    arm = {r["retention"]: r for r in result["rows"] if r["variant"] == "A-fid"}
    rows = got["json"]["rows"]
    assert [r["retention"] for r in rows] == [0.4, 0.2]
    for row in rows:   # A-fid serves Top-K, as the warmup row does: the very same captions
        assert row["selection"] == "topk"
        assert row["per_clip"] == warmup[row["retention"]]["per_clip"]
    assert [i["retention"] for i in got["json"]["intervals"]] == [0.4, 0.2]
    for interval in got["json"]["intervals"]:
        r = interval["retention"]
        assert interval["difference"] == pytest.approx(
            arm[r]["C_av"] - warmup[r]["C_av"], abs=1e-3)
        assert interval["low"] <= interval["difference"] <= interval["high"]
    assert "| A-fid − its warmup | 40% | 20% |" in got["text"]
    assert "no interval" not in got["text"]


@pytest.mark.slow
def test_a_set_aware_runs_warmup_is_served_set_aware(ablation, tiny_cache_dir, tmp_path):
    script = load_file(SCRIPT)
    out = tmp_path / "w"
    script.main([str(ablation), "--variant", "D-fid", "--out", str(out), "--cache-dir",
                 str(tiny_cache_dir), "--batch-size", "4"])
    saved = json.loads(out.with_suffix(".json").read_text())
    assert {(r["selection"], r["redundancy"]) for r in saved["rows"]} == {("set-aware", 4.0)}
    assert "D-fid against its warmup" in out.with_suffix(".md").read_text()


def test_bad_input_is_refused_before_any_scoring(ablation, tiny_cache_dir, tmp_path):
    script = load_file(SCRIPT)
    with pytest.raises(ValueError, match=r"--variant: .* has no 'Dc-fid' rows"):
        script.score_warmups(ablation, "Dc-fid", tiny_cache_dir, batch_size=4)
    bad = json.loads(ablation.read_text())
    bad["judge"]["captioner"]["sha256"] = "0" * 64
    (tmp_path / "ablation.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="captioner at .* has sha256"):
        script.score_warmups(tmp_path / "ablation.json", "A-fid", tiny_cache_dir, batch_size=4)
