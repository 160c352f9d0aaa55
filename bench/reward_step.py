"""The RL step's time under each reward (issue #36), measured in one process.

    OMP_NUM_THREADS=1 python bench/reward_step.py --out bench/results/reward-step-cpu.md

One micro-batch of the default recipe (16 clips of the default embedded benchmark's train
split, 8 Gumbel-Top-K anchors each, RLOO; with ``--exchanges`` also one exchange per anchor:
16 sets a clip) with the shipped captioner: the policy's scores, the sets, their rewards, the
loss and its backward (``avex.training.steps.rl_loss``), as ``python -m avex.train`` runs them,
without the optimiser step (so every reward scores the same sets). The rewards:

* ``cider``: the captions of every set in one batched greedy generation (24 new tokens),
  CIDEr-D against the AV references;
* ``fidelity``: one teacher-forced forward of y_full per set, no generation;
* ``fidelity, diagnostic step``: the same, plus the CIDEr of a ``cider`` step, compared with
  it (every ``diagnostics_every`` steps of a fidelity run);
* ``cider+fidelity``: both.

Each round runs every reward once, in an order that alternates between rounds (forward, then
backward), at the retention training would draw for that round (the same for every reward);
the table holds the medians over rounds, with the interquartile range, and the median time
inside generation (``generate_tokens``) and teacher forcing (``teacher_forced``). The policy
is the freshly initialised one (no warmup): the sets differ from a trained policy's, their
number and sizes do not. y_full of the train split is generated once before, into a
temporary folder (its time is reported: a training run pays it once per captioner, benchmark
and decoding).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from avex.cache_and_captioner import resolve_asset_paths
from avex.fidelity import full_captions, full_captions_path
from avex.reward import CiderD
from avex.tables import markdown_table
from avex.training.config import TrainConfig
from avex.training.loop import load_run_inputs
from avex.training.steps import draw_retention, rl_loss, sample_seed
from first_light import Stopwatch, sync

REWARDS = (("cider", False), ("fidelity", False), ("fidelity", True), ("cider+fidelity", False))


def reward_name(reward: str, diagnose: bool) -> str:
    return f"{reward}, diagnostic step" if diagnose else reward


def machine() -> str:
    cpu = platform.processor()
    if Path("/proc/cpuinfo").exists():
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                    if line.startswith("model name")), cpu)
    gpu = f"{torch.cuda.get_device_name()}; " if torch.cuda.is_available() else ""
    return (f"{gpu}{cpu}, {os.cpu_count()} cores, python {platform.python_version()}, torch "
            f"{torch.__version__}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}"
            f" (torch threads {torch.get_num_threads()})")


def commit() -> str:
    if os.environ.get("AVEX_COMMIT"):   # a device machine's copy carries stale git metadata
        return os.environ["AVEX_COMMIT"][:7]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" (uncommitted changes)" if dirty else " (clean tree)")


@dataclasses.dataclass
class StepInputs:
    """What one RL micro-batch of ``cfg`` needs, as ``python -m avex.train`` loads it: the
    benchmark (built first if missing) and its captioner, a freshly initialised policy, the
    train split's clips, CIDEr-D over their AV references, and the micro-batch's clips."""
    data_path: Path
    captioner_path: Path
    cache: object
    captioner: object
    policy: torch.nn.Module
    clips: list
    cider: CiderD
    batch_clips: list


def step_inputs(cfg: TrainConfig, progress: bool = False) -> StepInputs:
    """:class:`StepInputs` on this machine's device (CUDA where there is one)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data_path, captioner_path = resolve_asset_paths(cfg.data, cfg.captioner,
                                                    cache_dir=cfg.cache_dir, progress=progress)
    cache, captioner, policy = load_run_inputs(cfg, data_path, captioner_path, device)
    train = cache.split("train")
    clips = [train[i] for i in range(len(train))]
    cider = CiderD(corpus_references=[c.refs_av for c in clips], tokenize=True)
    return StepInputs(data_path, captioner_path, cache, captioner, policy, clips, cider,
                      clips[:cfg.micro_batch_size])


def measure(cfg: TrainConfig, rounds: int, progress: bool,
            full_captions_dir: str) -> tuple[list[dict], dict]:
    """Rows (one per reward) and the set-up's facts; y_full is generated into (or read from)
    ``full_captions_dir``, and timed."""
    inputs = step_inputs(cfg, progress)
    cache, captioner, policy = inputs.cache, inputs.captioner, inputs.policy
    clips, cider, batch_clips = inputs.clips, inputs.cider, inputs.batch_clips
    decoding = dict(num_beams=cfg.num_beams, max_new_tokens=cfg.max_new_tokens,
                    cache_dir=full_captions_dir)
    cached = full_captions_path(captioner, cache, "train", **decoding).is_file()
    sync()
    t0 = time.perf_counter()
    full = full_captions(captioner, cache, "train", progress=progress, **decoding)
    sync()
    setup = {"full_captions_s": time.perf_counter() - t0, "full_captions_cached": cached,
             "train_clips": len(clips), "benchmark": inputs.data_path.name,
             "captioner": inputs.captioner_path.name}
    targets = full.targets(batch_clips)
    generation = Stopwatch(captioner, "generate_tokens")
    forcing = Stopwatch(captioner, "teacher_forced")

    def step(reward: str, diagnose: bool, seed: int) -> dict:
        run_cfg = dataclasses.replace(cfg, reward=reward)
        policy.zero_grad(set_to_none=True)
        generation.seconds = forcing.seconds = 0.0
        sync()
        start = time.perf_counter()
        batch = captioner.embed(batch_clips)
        terms = rl_loss(run_cfg, policy, captioner, cider, batch, batch_clips, seed,
                        draw_retention(cfg, seed), full_tokens=targets, diagnose=diagnose)
        terms["loss"].backward()
        sync()
        return {"step": time.perf_counter() - start, "generation": generation.seconds,
                "forcing": forcing.seconds}

    step("cider", False, sample_seed(cfg.seed, 0, 0))      # warm-up: allocator, first calls
    step("fidelity", False, sample_seed(cfg.seed, 0, 0))
    times = {name: [] for name in REWARDS}
    for r in range(rounds):
        seed = sample_seed(cfg.seed, r + 1, 0)
        for name in (REWARDS if r % 2 == 0 else REWARDS[::-1]):
            times[name].append(step(*name, seed))
        if progress:
            print(f"round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    rows = []
    for (reward, diagnose), got in times.items():
        ratios = [t["step"] / c["step"] for t, c in zip(got, times[("cider", False)])]
        rows.append({"reward": reward_name(reward, diagnose),
                     "step_ms": 1e3 * statistics.median(t["step"] for t in got),
                     "iqr_ms": 1e3 * iqr([t["step"] for t in got]),
                     "generation_ms": 1e3 * statistics.median(t["generation"] for t in got),
                     "forcing_ms": 1e3 * statistics.median(t["forcing"] for t in got),
                     "ratio": statistics.median(ratios), "ratio_iqr": iqr(ratios)})
    return rows, setup


def iqr(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    quartiles = statistics.quantiles(values, n=4)
    return quartiles[2] - quartiles[0]


def table(rows: list[dict], exchanges: bool) -> str:
    sets = "8 anchors + 8 exchanges (16 sets) a clip" if exchanges else "8 anchors a clip"
    return f"**{sets}**\n\n" + markdown_table(
        ["reward", "median step", "IQR", "generation", "teacher forcing",
         "step / cider's step (same round)"],
        [[r["reward"], f"{r['step_ms']:.0f} ms", f"{r['iqr_ms']:.0f} ms",
          f"{r['generation_ms']:.0f} ms", f"{r['forcing_ms']:.0f} ms",
          f"{r['ratio']:.2f} (IQR {r['ratio_iqr']:.2f})"] for r in rows])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--cache-dir", default=None, help="the avex cache root (default: "
                        "$AVEX_CACHE or ~/.cache/avex); the default benchmark is built if missing")
    parser.add_argument("--out", default=None, help="write the Markdown report here")
    parser.add_argument("--progress", action="store_true")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    if args.out is not None and not Path(args.out).parent.is_dir():
        parser.error(f"--out: no folder {str(Path(args.out).parent)!r}")
    load = os.getloadavg()
    sections, setup = [], None
    with tempfile.TemporaryDirectory() as scratch:   # y_full generated here, timed, once
        for exchanges in (False, True):
            cfg = TrainConfig(cache_dir=args.cache_dir, exchanges=exchanges, progress=False,
                              normalize_exchange=False, exchange_saturation=5.0,
                              selection="topk")   # the rewards compared on one selection
            rows, facts = measure(cfg, args.rounds, args.progress, scratch)
            setup = setup or facts
            sections.append(table(rows, exchanges))
    load_after = os.getloadavg()
    report = "\n".join([
        f"# RL step time by reward ({'CUDA' if torch.cuda.is_available() else 'CPU'})", "",
        f"- date: {datetime.date.today()}",
        f"- machine: {machine()}; load average {load[0]:.1f} before, {load_after[0]:.1f} after",
        f"- commit: {commit()}",
        f"- command: `OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')} python "
        f"bench/reward_step.py --rounds {args.rounds}`",
        f"- size: one micro-batch of the default recipe: 16 clips of `{setup['benchmark']}`'s "
        f"train split, the shipped captioner `{setup['captioner']}`, greedy decoding of 24 new "
        "tokens, RLOO, the retention drawn per round as training draws it; a freshly "
        "initialised policy; policy scores + sets + rewards + loss + backward, no optimiser "
        "step; with exchanges, w's saturation fixed at 5 and L_ex unnormalised (the "
        "normalisation's two extra gradient norms cost the same under every reward)",
        f"- medians of {args.rounds} rounds, the rewards alternating within each round (order "
        "reversed every other round); the IQR of the step mostly reflects the retention, which "
        "changes between rounds; the last column is the median of the per-round ratios to the "
        "cider step of the same round (same retention, same sets); \"generation\" and "
        "\"teacher forcing\": the median time inside `generate_tokens` and `teacher_forced`",
        f"- once per captioner, benchmark and decoding (before RL, then cached): y_full of the "
        f"{setup['train_clips']} train clips took {setup['full_captions_s']:.1f} s here "
        f"({'read from the cache' if setup['full_captions_cached'] else 'generated'}, batches "
        "of 64)", "", *[s + "\n" for s in sections]])
    print(report)
    if args.out is not None:
        Path(args.out).write_text(report, encoding="utf-8")


if __name__ == "__main__":
    main()
