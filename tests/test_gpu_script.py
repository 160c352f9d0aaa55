"""bench/gpu.sh --dry-run: every stage's own logic (wheel install, stages, logs, tables, the
file count that comes back) runs on a CPU, so a typo can't waste a lent GPU's minutes.

The dry run skips only what needs CUDA and runs small sizes: the argument-check tests of the CUDA
suites and the profiling and on-device-baseline suites whole, the CPU reward benchmark with one
round, a tiny training run, a 2-layer profile and its FLOPs."""
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from avex.profiling.flops import fvcore_missing

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu.sh"


def run_stage(stage, out, *extra, env=None):
    environ = {**os.environ, "OUT": str(out), "PYTHON": sys.executable,
               "AVEX_SCRATCH": str(out.parent / f"scratch-{stage}"), **(env or {})}
    environ.pop("TRITON_INTERPRET", None)  # the script sets up its own processes
    return subprocess.run(["bash", str(SCRIPT), stage, *extra], env=environ,
                          capture_output=True, text=True, timeout=600)


def make_wheel(folder: Path) -> Path:
    """A minimal pure-Python wheel, standing in for the carried fvcore & co."""
    folder.mkdir()
    wheel = folder / "avex_carried_probe-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("avex_carried_probe/__init__.py", "VALUE = 7\n")
        info = "avex_carried_probe-0.1.dist-info"
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: avex-carried-probe\n"
                   "Version: 0.1\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: "
                   "true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return wheel


def test_usage_and_a_machine_without_cuda_are_refused(tmp_path):
    bad = run_stage("benchmarks", tmp_path / "out")
    assert bad.returncode == 2 and \
        "usage: bash bench/gpu.sh {first-light|tests|bench|train|profile|flops|session}" in \
        bad.stderr
    no_gpu = run_stage("bench", tmp_path / "out")
    assert no_gpu.returncode == 1 and "no CUDA device here" in no_gpu.stdout


@pytest.mark.slow
def test_first_light_runs_every_part_and_writes_one_table(tmp_path, tiny_cache_dir):
    """The call that comes first on a lent GPU: the kernel suites, P1, P2, P9 and P1 under
    torch.compile, each bounded, then first-light.md; at most 8 files come back."""
    out = tmp_path / "out"
    done = run_stage("first-light", out, "--dry-run", env={"AVEX_CACHE": str(tiny_cache_dir)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "first-light.jsonl", "first-light.log", "first-light.md", "machine.txt", "tests.log",
        "tests.xml"]
    rows = [json.loads(line) for line in (out / "first-light.jsonl").read_text().splitlines()]
    exits = {r["part"]: r["exit"] for r in rows if "exit" in r}
    assert exits == {"tests": 0, "P1": 0, "P2": 0, "P9": 0, "P1-compile": 0}
    md = (out / "first-light.md").read_text()
    assert "stage: first-light (dry run on a CPU)" in md
    for heading in ("## Tests:", "## P1:", "## P2:", "## P9:"):
        assert heading in md
    tests = md.split("## Tests:")[1].split("## P1:")[0]
    total = next(line for line in tests.splitlines() if line.startswith("| **total** |"))
    passed, failed = (int(c) for c in total.strip("|").split("|")[1:3])
    assert passed > 20 and failed == 0
    # the baselines are timed, the Triton rows say why they are not, the checks ran
    assert re.search(r"\| torch reference, eager \(baseline\) \| [\d.]+ (ms|us) \|", md)
    assert re.search(r"\| bool-index \+ pad_sequence \(baseline\) \| [\d.]+ (ms|us) \|", md)
    assert "| triton kernels only | - | - | - | - | needs CUDA" in md
    assert "- check: ok at B=4 M=40 K=16: indices equal" in md
    assert "- check: ok at (2, 400, 8), 5 sets" in md
    p9 = [r for r in rows if r["part"] == "P9" and "step_ms" in r]
    assert [r["retention"] for r in p9] == [0.4, 0.1]
    assert all(0 < r["generation_share"] < 1 and r["step_ms"] > 0 for r in p9)
    assert "| AVEX step at 40% | 2 |" in md


def test_first_light_table_says_which_part_did_not_finish(tmp_path):
    """A part stopped at its time limit keeps the rows it wrote, and the table says so."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from first_light import build_table
    finally:
        sys.path.remove(str(ROOT / "bench"))
    rows = tmp_path / "rows.jsonl"
    lines = [{"part": "P1", "impl": "torch reference, eager (baseline)", "baseline": True,
              "median_ms": 5.0, "p25_ms": 4.9, "p75_ms": 5.3, "rounds": 20, "case": "c"},
             {"part": "P1", "impl": "triton kernels only", "baseline": False,
              "median_ms": 0.08, "p25_ms": 0.078, "p75_ms": 0.083, "rounds": 20, "case": "c"},
             {"part": "P1", "exit": 0, "seconds": 13},
             {"part": "P1-compile", "exit": 124, "seconds": 122}]
    rows.write_text("".join(json.dumps(r) + "\n" for r in lines))
    md = build_table(str(rows), None, None, "t")
    assert "| triton kernels only | 80 us | 78 us - 83 us | 20 | 62.50x |" in md
    assert "**P1-compile did not finish: stopped at its time limit after 122 s**" in md
    assert "No test report was written." in md and md.count("No rows were written.") == 2


@pytest.mark.slow
def test_bench_stage_installs_wheels_writes_its_table_and_counts_files(tmp_path):
    wheels, site, out = tmp_path / "whl", tmp_path / "site", tmp_path / "out"
    make_wheel(wheels)
    done = run_stage("bench", out, "--dry-run",
                     env={"AVEX_WHEEL_DIR": str(wheels), "AVEX_SITE": str(site)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (site / "avex_carried_probe" / "__init__.py").is_file()
    machine = (out / "machine.txt").read_text()
    assert "stage: bench (dry run on a CPU)" in machine
    assert "carried wheels: avex_carried_probe-0.1-py3-none-any.whl" in machine
    table = (out / "bench-gpu.md").read_text()
    assert "| cider-d 64 clips x 5 candidates x 5 refs | CiderD, fixed corpus df |" in table
    assert sorted(p.name for p in out.iterdir()) == ["bench-gpu.md", "bench.json", "bench.log",
                                                     "machine.txt"]
    # more than 8 files would not come back from the GPU machine: the stage says so and fails
    for i in range(6):
        (out / f"extra{i}.txt").write_text("x")
    crowded = run_stage("bench", out, "--dry-run")
    assert crowded.returncode == 1 and "at most 8 come back" in crowded.stdout


@pytest.mark.slow
def test_tests_stage_runs_the_cuda_suites_argument_checks(tmp_path):
    out = tmp_path / "out"
    done = run_stage("tests", out, "--dry-run")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = (out / "tests-gpu.md").read_text()
    rows = {cells[0]: [int(c) for c in cells[1:]] for cells in
            ([c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()
             if line.startswith("| test_"))}
    # every suite of the stage has tests that ran (passed), not only skips; the profiling and
    # on-device-baseline suites run whole (their fvcore parts skip, saying why, without fvcore)
    for module in ("test_gumbel_topk", "test_exchange", "test_pruning", "test_profiling",
                   "test_methods_on_device"):
        passed, failed, _ = rows[module]
        assert passed > 0 and failed == 0, (module, rows[module])
    assert rows["test_methods_on_device"][2] == 0
    assert rows["test_profiling"][0] >= 15
    assert "| **total** |" in table and "Failures" not in table
    assert "skipped (needs CUDA): CUDA C++ library build" in (out / "machine.txt").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("exchanges", ["0", "1"])
def test_train_stage_trains_evaluates_and_tabulates(tmp_path, tiny_cache_dir, exchanges):
    out = tmp_path / "out"
    done = run_stage("train", out, "--dry-run", env={"AVEX_CACHE": str(tiny_cache_dir),
                                                    "AVEX_TRAIN_EXCHANGES": exchanges})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    table = (out / "train-gpu.md").read_text()
    assert "| warmup |" in table and "| rl |" in table
    assert "| Full tokens | 100% |" in table
    assert ("AVEX, L_RL (RLOO) + L_ex" in table) == (exchanges == "1")


@pytest.mark.slow
def test_profile_stage_writes_the_profiling_table(tmp_path):
    """The timed table with FLOPs by hand, its rounds bounded by the stage's budget."""
    out = tmp_path / "out"
    done = run_stage("profile", out, "--dry-run")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    names = sorted(p.name for p in out.iterdir())
    assert names == ["machine.txt", "profile.log", "profiling-tiny-qwen2-r0.4-cpu.json",
                     "profiling-tiny-qwen2-r0.4-cpu.md", "profiling-tiny-qwen2-r0.4-cpu.png"]
    md = (out / "profiling-tiny-qwen2-r0.4-cpu.md").read_text()
    assert "| AVEX-Prune |" in md and "Prefill (ms)" in md
    assert "**Counted by hand, not by fvcore**: the hand count was asked for" in md
    data = json.loads((out / "profiling-tiny-qwen2-r0.4-cpu.json").read_text())
    # the budget (480 s) less set-up, less 60 s for what follows the rounds
    assert 30 <= data["settings"]["max_seconds"] <= 420
    assert data["latency"]["runs"] == 2


@pytest.mark.slow
def test_flops_stage_counts_with_fvcore_where_installed(tmp_path):
    out = tmp_path / "out"
    done = run_stage("flops", out, "--dry-run")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    names = sorted(p.name for p in out.iterdir())
    assert names == ["flops.log", "machine.txt", "profiling-tiny-qwen2-r0.4-flops.json",
                     "profiling-tiny-qwen2-r0.4-flops.md", "profiling-tiny-qwen2-r0.4-flops.png"]
    md = (out / "profiling-tiny-qwen2-r0.4-flops.md").read_text()
    assert "| AVEX-Prune |" in md and "Prefill (ms)" not in md   # FLOPs only
    if fvcore_missing():   # the GPU image's stack without the carried wheels
        assert "**Counted by hand, not by fvcore**: fvcore is not installed" in md
    else:
        assert "fvcore vs the analytic count" in md


@pytest.mark.parametrize("stage", ["tests", "bench", "train", "profile|flops"])
def test_every_stage_has_a_time_budget(stage):
    """Each stage ends inside a device call's 10 minutes: a budget below 600 s, enforced by
    timeout around the stage's main command."""
    text = SCRIPT.read_text()
    assert "BUDGET=${AVEX_STAGE_SECONDS:-480}" in text
    body = text.split(f"\n{stage})\n", 1)[1].split("\n    ;;", 1)[0]
    assert "run_budgeted " in body


def test_first_light_bounds_every_part():
    """first-light runs its parts through part(), each under timeout, the stage's budget kept."""
    body = SCRIPT.read_text().split("\nfirst-light)\n", 1)[1].split("\n    ;;", 1)[0]
    assert 'timeout --signal=INT --kill-after=15 "$limit" "$@"' in body
    launched = re.findall(r"^    part (\S+) (\d+) (\d+) ", body, flags=re.M)
    assert [name for name, _, _ in launched] == ["tests", "P1", "P2", "P9", "P1-compile"]
    assert sum(int(cap) for _, cap, _ in launched) <= 600


def test_summary_names_the_commit_it_is_given(tmp_path):
    """A device machine's copy of the tree carries stale git metadata, so pytest-benchmark's
    record of the commit is wrong there; gpu.sh hands summarize.py the right one."""
    data = {"datetime": "2026-11-27T16:00:00", "commit_info": {"id": "a" * 40, "dirty": True},
            "machine_info": {"cpu": {"brand_raw": "probe", "count": 2}, "python_version": "3"},
            "benchmarks": [{"name": "t", "group": "g", "extra_info": {"impl": "x (baseline)",
                                                                         "baseline": True},
                            "stats": {"median": 1e-3, "iqr": 1e-4, "rounds": 3}}]}
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    script = [sys.executable, str(ROOT / "bench" / "summarize.py"), str(path)]
    given = subprocess.run(script + ["--commit", "b" * 40], capture_output=True, text=True,
                           check=True).stdout
    assert "- commit: bbbbbbbbbbbb (given; the JSON's git record says aaaaaaaaaaaa)" in given
    plain = subprocess.run(script, capture_output=True, text=True, check=True).stdout
    assert "- commit: aaaaaaaaaaaa (dirty: True)" in plain


@pytest.mark.slow
def test_session_runs_its_stages_in_one_call_and_packs_them(tmp_path):
    """One call, several stages, each with its budget: one archive comes back with every
    stage's files; the selections for bench and profile reach their commands; a stage the
    plan misnames is reported and fails the call without stopping the others."""
    import tarfile

    out = tmp_path / "out"
    done = run_stage("session", out, "--dry-run", env={
        "AVEX_SESSION_STAGES": "bench:200 nope:10 profile:200",
        "AVEX_BENCH_K": "fixed", "AVEX_PROFILE_ARGS": "--methods full,avex"})
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "AVEX_SESSION_STAGES: unknown stage 'nope'" in done.stdout
    assert sorted(p.name for p in out.iterdir()) == ["gpu-session.tgz", "machine.txt",
                                                     "session.md"]
    session = (out / "session.md").read_text()
    assert re.search(r"^\| bench \| 0 \| \d+ \| 200 \|$", session, flags=re.M)
    assert re.search(r"^\| profile \| 0 \| \d+ \| 200 \|$", session, flags=re.M)
    with tarfile.open(out / "gpu-session.tgz") as tar:
        names = {Path(n).as_posix().lstrip("./") for n in tar.getnames()}
        table = tar.extractfile("./bench/bench-gpu.md").read().decode()
        profile = tar.extractfile("./profile/profiling-tiny-qwen2-r0.4-cpu.md").read().decode()
    assert {"bench.log", "bench/bench-gpu.md", "profile.log",
            "profile/profiling-tiny-qwen2-r0.4-cpu.md"} <= names
    assert "CiderD, fixed corpus df" in table and "per-call df" not in table   # -k fixed
    assert "| AVEX-Prune |" in profile and "FastV-AV" not in profile           # two methods
