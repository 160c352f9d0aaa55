"""Results files read the same on every machine: no absolute path in what the experiments write
or in what is committed, and a grown benchmark scored on its first clips gives the numbers the
smaller one gave."""
import json
import re
from pathlib import Path

import numpy as np
import pytest

from avex.data import build_benchmark
from avex.data.embedded import resolve_config
from avex.evaluate.sweep import SweepSettings, run_sweep
from avex.paths import cache_relative, portable_command, relative_path

ROOT = Path(__file__).resolve().parents[1]
#: a path from the file-system root: "/" then at least two components, not preceded by what
#: makes it part of a word, a relative path, a URL or a variable ("$AVEX_CACHE/benchmarks")
ABSOLUTE = re.compile(r"(?<![\w.~$:/}])/[\w.{}-]+(?:/[\w.{}-]+)+")
TEXT_SUFFIXES = {".md", ".json", ".csv", ".txt", ".jsonl"}


def absolute_paths(text: str) -> list[str]:
    return [m.group(0) for m in ABSOLUTE.finditer(text)]


def test_the_absolute_path_finder_finds_them():
    assert absolute_paths('"run": "/work/cache-25/cmp/b0/runs/seed0/A"') == \
        ["/work/cache-25/cmp/b0/runs/seed0/A"]
    assert absolute_paths("from `/tmp/prof` and (/root/out/x)") == ["/tmp/prof", "/root/out/x"]
    for fine in ("C_av / full", "results/profiling-*.md", "$AVEX_CACHE/benchmarks/x",
                 "../../cmp/b0/runs", "https://github.com/a/b", "1/4 of it", "V>A / A>V"):
        assert absolute_paths(fine) == [], fine


def test_committed_results_hold_no_absolute_path():
    found = []
    for folder in ("results", "bench/results"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in TEXT_SUFFIXES:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                found += [f"{path.relative_to(ROOT)}:{number}: {p}" for p in absolute_paths(line)]
    assert not found, "absolute paths in committed results:\n" + "\n".join(found[:20])


def test_paths_are_recorded_relative_to_their_root(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    assert cache_relative(cache / "benchmarks" / "b", cache) == "benchmarks/b"
    assert relative_path(tmp_path / "abl" / "runs" / "A", tmp_path / "sweep") == \
        "../abl/runs/A"
    monkeypatch.chdir(tmp_path)
    assert portable_command(["--data", str(cache / "benchmarks" / "b"), "--run",
                             f"A={tmp_path / 'abl' / 'A'}", "--out", str(tmp_path / "out"),
                             "--seeds", "0,1", "--train-args", "--epochs 1"], cache) == \
        "--data $AVEX_CACHE/benchmarks/b --run A=abl/A --out out --seeds 0,1 " \
        "--train-args '--epochs 1'"


def walk_strings(value):
    if isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from walk_strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from walk_strings(v)
    elif isinstance(value, str):
        yield value


def assert_portable(folder: Path, machine: Path) -> None:
    """No string of the folder's JSON starts with "/", and no file names ``machine``."""
    for path in sorted(folder.glob("*.json")) + sorted(folder.glob("*.md")):
        text = path.read_text()
        assert str(machine) not in text, f"{path.name} names {machine}"
        assert absolute_paths(text) == [], (path.name, absolute_paths(text))
        if path.suffix == ".json":
            starting = [s for s in walk_strings(json.loads(text)) if s.startswith("/")]
            assert starting == [], (path.name, starting)


@pytest.fixture(scope="module")
def grown_benchmark(tiny_benchmark, tmp_path_factory):
    """The tiny benchmark built with twice its test clips (the first 8 are the tiny one's)."""
    folder = tmp_path_factory.mktemp("grown")
    return build_benchmark(folder / tiny_benchmark.name, resolve_config("tiny", test=16),
                           preset="tiny", progress=False)


def sweep(data, captioner, cache_dir, out, **settings):
    return run_sweep(SweepSettings(
        data=str(data), captioner=str(captioner), cache_dir=str(cache_dir), out=str(out),
        methods=["random", "tome"], retentions=[0.4], qualitative=1, max_new_tokens=12,
        progress=False, **settings))


@pytest.mark.slow
def test_a_sweep_records_no_machine_path(tiny_cache_dir, tiny_benchmark, tiny_captioner,
                                         tmp_path):
    result = sweep(tiny_benchmark, tiny_captioner, tiny_cache_dir, tmp_path / "sweep")
    saved = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert saved["settings"]["data"] == "benchmarks/embedded-tiny-seed0"
    assert saved["settings"]["captioner"] == "captioners/embedded-tiny-seed0-tiny"
    assert saved["settings"]["judge"]["benchmark"]["path"] == "benchmarks/embedded-tiny-seed0"
    assert_portable(tmp_path / "sweep", tiny_cache_dir.parent)
    # every row carries its clips' scores, rounded, averaging to the row's corpus number
    for row in result["rows"]:
        assert len(row["per_clip"]["C_av"]) == 8 and len(row["per_clip"]["C_T"]) == 8
        assert abs(np.mean(row["per_clip"]["C_av"]) - row["C_av"]) <= 0.005
    # the sweep.json written keeps each clip's scores on one line
    assert len((tmp_path / "sweep" / "sweep.json").read_text().splitlines()) < 400


@pytest.mark.slow
def test_the_first_clips_of_a_grown_benchmark_score_as_the_smaller_one(
        tiny_cache_dir, tiny_benchmark, tiny_captioner, grown_benchmark, tmp_path):
    """CIDEr's document frequencies come from the scored clips' references, so scoring the
    grown benchmark's first 8 test clips (--max-clips 8) gives the tiny benchmark's numbers,
    cell for cell, and scoring all 16 does not give its first 8 clips the same scores."""
    before = sweep(tiny_benchmark, tiny_captioner, tiny_cache_dir, tmp_path / "before")
    first = sweep(grown_benchmark, tiny_captioner, tiny_cache_dir, tmp_path / "first",
                  max_clips=8)
    keys = ("method", "seed", "retention", "C_av", "C_v", "C_a", "C_T", "per_clip")
    assert [{k: r[k] for k in keys} for r in first["rows"]] == \
        [{k: r[k] for k in keys} for r in before["rows"]]
    every = sweep(grown_benchmark, tiny_captioner, tiny_cache_dir, tmp_path / "every",
                  transfer_split="none")
    full_before, full_every = before["rows"][0]["per_clip"], every["rows"][0]["per_clip"]
    assert len(full_every["C_av"]) == 16
    assert full_every["C_av"][:8] != full_before["C_av"]
