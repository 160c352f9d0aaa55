"""scripts/pooled_differences.py: X − Y per benchmark and pooled, on synthetic ablation files
whose arms differ by known shifts, two arms of a benchmark in separate files."""
import json
import re
from pathlib import Path

import numpy as np
import pytest

from avex.intervals import compact_per_clip
from file_module import load_file

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "pooled_differences.py"
RETENTIONS = [0.4, 0.1]


@pytest.fixture(scope="module")
def pooled():
    return load_file(SCRIPT)


def write(path: Path, benchmark: str, arm: str, shift: float, *, clips=50, sha="aa",
          full_shift=0.0) -> Path:
    """One arm's ablation.json on ``benchmark``: every clip's C_av is a fixed base + ``shift``,
    seeds 0-2."""
    base = np.linspace(300, 500, clips)
    rows = [{"variant": arm, "seed": seed, "retention": r, "C_av": float((base + shift).mean()),
             "per_clip": compact_per_clip({"C_av": base + shift})}
            for seed in (0, 1, 2) for r in RETENTIONS]
    path.write_text(json.dumps({
        "rows": rows, "split": "test", "clips": clips,
        "full": {"C_av": 500.0, "per_clip": compact_per_clip({"C_av": base + 50 + full_shift})},
        "judge": {"benchmark": {"name": benchmark, "sha256": sha},
                  "captioner": {"sha256": "cc"}}}))
    return path


def test_per_benchmark_and_pooled_differences_are_the_shifts(pooled, tmp_path, capsys):
    files = [write(tmp_path / "x0.json", "b0", "X", 2.0),
             write(tmp_path / "y0.json", "b0", "Y", 0.0),
             write(tmp_path / "x1.json", "b1", "X", 5.0),
             write(tmp_path / "y1.json", "b1", "Y", 1.0)]
    pooled.main([*map(str, files), "--pairs", "X:Y"])
    out = capsys.readouterr().out
    assert "Pooled over 2 benchmarks (b0, b1; test split)" in out
    assert "| b0 | +2.0 [+2.0, +2.0] | +2.0 [+2.0, +2.0] |" in out
    assert "| b1 | +4.0 [+4.0, +4.0] | +4.0 [+4.0, +4.0] |" in out
    assert "| **pooled** | +3.0 [+3.0, +3.0] | +3.0 [+3.0, +3.0] |" in out


@pytest.mark.parametrize("change, message", [
    ({"sha": "bb"}, r"both score b0 but differ in judge"),
    ({"clips": 40}, r"both score b0 but differ in clips"),
    ({"full_shift": 1.0}, r"both score b0 but differ in full tokens' per-clip scores"),
])
def test_files_of_one_benchmark_that_do_not_pair_are_refused(pooled, tmp_path, capsys, change,
                                                              message):
    files = [write(tmp_path / "x.json", "b0", "X", 1.0),
             write(tmp_path / "y.json", "b0", "Y", 0.0, **change)]
    with pytest.raises(SystemExit):
        pooled.main([*map(str, files), "--pairs", "X:Y"])
    assert re.search(message, capsys.readouterr().err)


def test_a_missing_arm_is_named(pooled, tmp_path, capsys):
    files = [write(tmp_path / "x.json", "b0", "X", 1.0)]
    with pytest.raises(SystemExit):
        pooled.main([*map(str, files), "--pairs", "X:Z"])
    assert "has no per-clip Z scores at 40%" in capsys.readouterr().err
