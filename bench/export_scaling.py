"""Export throughput from 1 and 2 processes, in one run: clips/s of ``python -m avex.data
export`` and of ``torchrun --nproc-per-node 2 -m avex.data export`` on the same media and the
same tiny random Qwen2.5-VL (examples/train_once_prune_anywhere.py's), one after the other.

    python bench/export_scaling.py --workdir /tmp/avex-export-bench --clips 64 --rounds 3

Each process runs on one thread (OMP_NUM_THREADS=1), so 2 processes use 2 cores where 1 uses
one. Two figures per run: the export's own time (from the command's "in X s": the probe pass,
the clips, packing, the merge and the verification; the interpreter's start and the model's
load excluded) and the whole command's wall time. Rounds alternate 1 and 2 processes; the
table reports each round and the medians, with the load average before each run. Writes
markdown to stdout.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_once_prune_anywhere.py"


def example():
    spec = importlib.util.spec_from_file_location("train_once_prune_anywhere", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def prepare(workdir: Path, clips: int) -> tuple[Path, Path]:
    ex = example()
    media = workdir / "media"
    media.mkdir(parents=True)
    rows = []
    for i in range(clips):   # 8 s, 96x96 at 8 fps with an AAC track: 16 frames sampled at 2 fps
        ex.write_video(media / f"clip{i}.mp4", i, seconds=8.0, size=96)
        rows.append({"file": f"clip{i}.mp4", "captions": ["a dog barks"],
                     "split": "test" if i % 8 == 7 else "train"})
    (media / "captions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ex.save_model(ex.build_model("qwen2_5_vl"), ex.build_processor("qwen2_5_vl"),
                  workdir / "model")
    return media, workdir / "model"


def run(media: Path, model: Path, out: Path, processes: int) -> tuple[float, float]:
    shutil.rmtree(out, ignore_errors=True)
    export = ["-m", "avex.data", "export", "--media", str(media), "--captions",
              str(media / "captions.jsonl"), "--model", str(model), "--out", str(out),
              "--no-progress", "--device", "cpu"]
    command = [sys.executable, *export] if processes == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
         str(processes), *export]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    inside = float(re.search(r" in ([0-9.]+) s, verified", done.stdout).group(1))
    return inside, wall


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True, help="a new folder for the media and model")
    parser.add_argument("--clips", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    workdir = Path(args.workdir)
    media, model = prepare(workdir, args.clips)
    results = {1: [], 2: []}
    lines = []
    for round_ in range(args.rounds):
        for processes in (1, 2):
            load = os.getloadavg()[0]
            inside, wall = run(media, model, workdir / f"cache{processes}", processes)
            results[processes].append((inside, wall))
            lines.append(f"| {round_ + 1} | {processes} | {load:.2f} | {inside:.2f} | "
                         f"{args.clips / inside:.1f} | {wall:.1f} | {args.clips / wall:.2f} |")
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=REPO).stdout.strip()
    print(f"- machine: {cpu}, {os.cpu_count()} cores; python {platform.python_version()}")
    print(f"- commit: {commit}; {args.clips} clips, {args.rounds} rounds\n")
    print("| round | processes | load before | export s | clips/s | command s | clips/s |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(lines))
    print()
    for processes, runs in results.items():
        inside = statistics.median(r[0] for r in runs)
        wall = statistics.median(r[1] for r in runs)
        print(f"- {processes} process(es): median export {inside:.2f} s = "
              f"{args.clips / inside:.1f} clips/s; median command {wall:.1f} s = "
              f"{args.clips / wall:.2f} clips/s")
    ratio = statistics.median(r[0] for r in results[1]) / \
        statistics.median(r[0] for r in results[2])
    print(f"- 2 processes / 1 process, export's own time: {ratio:.2f}x")


if __name__ == "__main__":
    main()
