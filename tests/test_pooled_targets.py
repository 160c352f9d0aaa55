"""scripts/pooled_targets.py: the "every efficient method" target pooled over deciding
benchmarks, on synthetic decide_default_recipe.py --json outputs with known means."""
import json
from pathlib import Path

import pytest

from file_module import load_file

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "pooled_targets.py"
DEFAULT = "Dc-fid+merge0.8"


@pytest.fixture(scope="module")
def pooled():
    return load_file(SCRIPT)


def targets(benchmark: str, mine: dict, controls: dict, others: dict, *, default=DEFAULT):
    """A targets file: the default's means ``mine`` (retention -> C_av), the controls' and the
    sweep's methods' (name -> retention -> C_av)."""
    means = {f"{default}@{r:g}": v for r, v in mine.items()}
    means.update({f"{c}@{r:g}": v for c, by_r in controls.items() for r, v in by_r.items()})
    return {"benchmark": benchmark, "default": default, "controls": list(controls),
            "retentions": list(mine), "means": means,
            "others": {m: {f"{r:g}": v for r, v in by_r.items()} for m, by_r in others.items()}}


def write(tmp_path: Path, name: str, data: dict) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_pools_each_benchmark_equally_and_leaves_out_the_privileged_reference(pooled, tmp_path,
                                                                             capsys):
    # seed 7: the control 1 above the default at 40%; seed 8: 3 below it there. Pooled: +1.0.
    a = targets("seed7", {0.4: 470.0, 0.1: 400.0}, {"Cc-fid": {0.4: 471.0, 0.1: 380.0}},
                {"tome": {0.4: 444.0, 0.1: 283.0}, "attention": {0.4: 500.0, 0.1: 500.0}})
    b = targets("seed8", {0.4: 468.0, 0.1: 390.0}, {"Cc-fid": {0.4: 465.0, 0.1: 392.0}},
                {"tome": {0.4: 440.0, 0.1: 280.0}, "attention": {0.4: 500.0, 0.1: 500.0}})
    got = pooled.pool([a, b])
    assert got["Cc-fid"] == pytest.approx({"0.4": 1.0, "0.1": 9.0})
    assert got["ToMe-AV"] == pytest.approx({"0.4": 27.0, "0.1": 113.5})
    assert not any("Attention" in m for m in got)
    pooled.main([write(tmp_path, "a", a), write(tmp_path, "b", b)])
    out = capsys.readouterr().out
    assert "| Cc-fid | **pooled** | **+1.0** | **+9.0** |" in out
    assert "at or above every efficient method's at 40%, 10%; below one at none." in out


def test_a_pooled_difference_below_zero_fails_that_retention_only(pooled, tmp_path, capsys):
    a = targets("seed7", {0.5: 473.0, 0.2: 448.0}, {"Cc-fid": {0.5: 474.0, 0.2: 446.0}}, {})
    b = targets("seed8", {0.5: 472.0, 0.2: 450.0}, {"Cc-fid": {0.5: 472.5, 0.2: 445.0}}, {})
    pooled.main([write(tmp_path, "a", a), write(tmp_path, "b", b)])
    assert "at or above every efficient method's at 20%; below one at 50%." in \
        capsys.readouterr().out


@pytest.mark.parametrize("change, message", [
    (lambda b: b.update(default="Dc-fid"), "different defaults"),
    (lambda b: b.update(benchmark="seed7"), "given twice"),
    (lambda b: b["others"].pop("tome"), "does not hold the same methods"),
    (lambda b: b.pop("means"), "not a decide_default_recipe.py --json output"),
])
def test_refuses_files_that_cannot_be_pooled_by_name(pooled, tmp_path, capsys, change, message):
    a = targets("seed7", {0.4: 470.0}, {"Cc-fid": {0.4: 471.0}}, {"tome": {0.4: 444.0}})
    b = targets("seed8", {0.4: 468.0}, {"Cc-fid": {0.4: 465.0}}, {"tome": {0.4: 440.0}})
    change(b)
    with pytest.raises(SystemExit):
        pooled.main([write(tmp_path, "a", a), write(tmp_path, "b", b)])
    assert message in capsys.readouterr().err


def test_one_file_is_refused(pooled, tmp_path, capsys):
    a = targets("seed7", {0.4: 470.0}, {"Cc-fid": {0.4: 471.0}}, {})
    with pytest.raises(SystemExit):
        pooled.main([write(tmp_path, "a", a)])
    assert "two or more targets files" in capsys.readouterr().err
