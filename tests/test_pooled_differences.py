"""scripts/pooled_differences.py: X − Y per benchmark and pooled, on synthetic ablation files
whose arms differ by known shifts, two arms of a benchmark in separate files."""
import json
import re
from pathlib import Path

import numpy as np
import pytest

from avex.intervals import compact_per_clip, planned_interval, variance_components
from file_module import load_file

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "pooled_differences.py"
RETENTIONS = [0.4, 0.1]


@pytest.fixture(scope="module")
def pooled():
    return load_file(SCRIPT)


def write(path: Path, benchmark: str, arm: str, shift: float, *, clips=50, sha="aa",
          full_shift=0.0, noise=None) -> Path:
    """One arm's ablation.json on ``benchmark``: every clip's C_av is a fixed base + ``shift``
    (+ ``noise[seed]``, [clips], where given), seeds 0-2."""
    base = np.linspace(300, 500, clips)
    scores = [base + shift + (0 if noise is None else noise[seed]) for seed in (0, 1, 2)]
    rows = [{"variant": arm, "seed": seed, "retention": r, "C_av": float(scores[seed].mean()),
             "per_clip": compact_per_clip({"C_av": scores[seed]})}
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


def test_a_plan_gives_each_sizes_interval_from_the_benchmarks_variances(pooled, tmp_path,
                                                                         capsys):
    rng = np.random.default_rng(0)
    noise = {b: rng.normal(0, 10, (3, 50)) + rng.normal(0, 2, (3, 1)) for b in ("b0", "b1")}
    files = [write(tmp_path / "x0.json", "b0", "X", 2.0, noise=noise["b0"]),
             write(tmp_path / "y0.json", "b0", "Y", 0.0),
             write(tmp_path / "x1.json", "b1", "X", 4.0, noise=noise["b1"]),
             write(tmp_path / "y1.json", "b1", "Y", 0.0)]
    pooled.main([*map(str, files), "--pairs", "X:Y", "--plan", "1000x3,1000x10"])
    out = capsys.readouterr().out
    diffs = [np.round(np.linspace(300, 500, 50) + shift + noise[b], 2)
             - np.round(np.linspace(300, 500, 50), 2) for b, shift in (("b0", 2.0), ("b1", 4.0))]
    components = np.mean([variance_components(d) for d in diffs], axis=0)
    gap = float(np.mean([d.mean() for d in diffs]))
    header = f"| X − Y | 40%: {gap:+.1f} | 10%: {gap:+.1f} |"
    assert header in out
    for clips, seeds in ((1000, 3), (1000, 10)):
        half, chance = planned_interval(components, gap, clips, seeds)
        cell = f"±{half:.1f} ({chance:.0%})"
        assert f"| {clips} clips, {seeds} seeds | {cell} | {cell} |" in out
    three, ten = (planned_interval(components, gap, 1000, s)[0] for s in (3, 10))
    assert ten < three


def test_a_plan_needs_several_seeds_and_a_well_formed_size(pooled, tmp_path, capsys):
    files = [write(tmp_path / "x.json", "b0", "X", 1.0), write(tmp_path / "y.json", "b0", "Y", 0.0)]
    with pytest.raises(SystemExit):
        pooled.main([*map(str, files), "--pairs", "X:Y", "--plan", "1000by3"])
    assert "--plan must be CLIPSxSEEDS[,...] with positive integers, got '1000by3'" in \
        capsys.readouterr().err
    for path in files:   # one training seed: no seed variance to plan with
        data = json.loads(path.read_text())
        data["rows"] = [row for row in data["rows"] if row["seed"] == 0]
        path.write_text(json.dumps(data))
    with pytest.raises(SystemExit):
        pooled.main([*map(str, files), "--pairs", "X:Y", "--plan", "1000x3"])
    assert "--plan needs >= 2 training seeds of X and Y on every benchmark" in \
        capsys.readouterr().err
