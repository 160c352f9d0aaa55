"""The exchange search arm's RL step against arm A's (issue #36 item 4), in one process.

    OMP_NUM_THREADS=1 python bench/search_step.py --out bench/results/search-step-cpu.md

One micro-batch (16 clips of the default embedded benchmark's train split, the shipped
captioner) of each arm, as ``python -m avex.train`` runs it (``avex.training.steps.rl_loss``:
policy scores, sets, rewards, loss, backward; no optimiser step):

* ``A``: 8 Gumbel-Top-K anchors per clip, RLOO (the default recipe): 8 sets a clip, one
  reward call;
* ``S``: the exchange search (``--exchange-search --search-rounds 2 --search-candidates 7``):
  the Top-K set and 7 candidates a clip (8 sets), in 2 reward calls, then the pairwise and
  distillation losses.

Each round runs both arms under each reward asked for (``--rewards``), in an order that
alternates between rounds, at the retention training would draw for that round; the table
holds the medians over rounds, the interquartile range, the time inside the reward's
captioner calls, and the per-round ratio to arm A's step under the same reward. The policy is
the freshly initialised one: its sets differ from a trained policy's, their number and sizes
do not (the search's accepted swaps do, but not what it evaluates).
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from avex.fidelity import full_captions
from avex.tables import markdown_table
from avex.training.config import REWARDS, TrainConfig
from avex.training.steps import draw_retention, rl_loss, sample_seed
from first_light import Stopwatch, sync
from reward_step import commit, iqr, machine, step_inputs

ARMS = {"A": {}, "S": {"exchange_search": True, "search_rounds": 2, "search_candidates": 7}}


def measure(cfg: TrainConfig, rewards: list[str], rounds: int, scratch: str) -> list[dict]:
    """One row per (reward, arm): median step, IQR, time in the captioner, ratio to A."""
    inputs = step_inputs(cfg)
    cache, captioner, policy = inputs.cache, inputs.captioner, inputs.policy
    cider, batch_clips = inputs.cider, inputs.batch_clips
    targets = None
    if any(r != "cider" for r in rewards):
        targets = full_captions(captioner, cache, "train", num_beams=cfg.num_beams,
                                max_new_tokens=cfg.max_new_tokens, cache_dir=scratch
                                ).targets(batch_clips)
    watches = [Stopwatch(captioner, "generate_tokens"), Stopwatch(captioner, "teacher_forced")]
    jobs = [(reward, arm) for reward in rewards for arm in ARMS]

    def step(reward: str, arm: str, seed: int) -> dict:
        run_cfg = dataclasses.replace(cfg, reward=reward, **ARMS[arm])
        policy.zero_grad(set_to_none=True)
        for watch in watches:
            watch.seconds = 0.0
        sync()
        start = time.perf_counter()
        batch = captioner.embed(batch_clips)
        terms = rl_loss(run_cfg, policy, captioner, cider, batch, batch_clips, seed,
                        draw_retention(cfg, seed), full_tokens=targets)
        terms["loss"].backward()
        sync()
        return {"step": time.perf_counter() - start,
                "captioner": sum(w.seconds for w in watches),
                "passes": float(terms.get("search_passes", cfg.anchors)),
                "calls": float(terms.get("search_calls", 1))}

    for job in jobs:                              # warm-up: allocator, first calls
        step(*job, sample_seed(cfg.seed, 0, 0))
    times = {job: [] for job in jobs}
    for r in range(rounds):
        seed = sample_seed(cfg.seed, r + 1, 0)
        for job in (jobs if r % 2 == 0 else jobs[::-1]):
            times[job].append(step(*job, seed))
        print(f"round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    rows = []
    for (reward, arm), got in times.items():
        ratios = [t["step"] / a["step"] for t, a in zip(got, times[(reward, "A")])]
        rows.append({"reward": reward, "arm": arm,
                     "step_ms": 1e3 * statistics.median(t["step"] for t in got),
                     "iqr_ms": 1e3 * iqr([t["step"] for t in got]),
                     "captioner_ms": 1e3 * statistics.median(t["captioner"] for t in got),
                     "passes": got[0]["passes"], "calls": got[0]["calls"],
                     "ratio": statistics.median(ratios), "ratio_iqr": iqr(ratios)})
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--rewards", default="cider,fidelity",
                        help=f"comma-separated, from {list(REWARDS)}")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--out", default=None, help="write the Markdown report here")
    args = parser.parse_args(argv)
    rewards = [r for r in args.rewards.split(",") if r]
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    if not rewards or any(r not in REWARDS for r in rewards):
        parser.error(f"--rewards must name rewards from {list(REWARDS)}, got {args.rewards!r}")
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch:
        rows = measure(TrainConfig(cache_dir=args.cache_dir, progress=False, selection="topk"),
                       rewards, args.rounds, scratch)
    load_after = os.getloadavg()
    table = markdown_table(
        ["reward", "arm", "sets rewarded a clip", "reward calls", "median step", "IQR",
         "in the captioner", "step / A's step (same round)"],
        [[r["reward"], r["arm"], f"{r['passes']:.0f}", f"{r['calls']:.0f}",
          f"{r['step_ms']:.0f} ms", f"{r['iqr_ms']:.0f} ms", f"{r['captioner_ms']:.0f} ms",
          f"{r['ratio']:.2f} (IQR {r['ratio_iqr']:.2f})"] for r in rows])
    report = "\n".join([
        "# RL step time: exchange search (S) against arm A (CPU)", "",
        f"- date: {datetime.date.today()}",
        f"- machine: {machine()}; load average {load[0]:.1f} before, {load_after[0]:.1f} after",
        f"- commit: {commit()}",
        f"- command: `OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')} python "
        f"bench/search_step.py --rounds {args.rounds} --rewards {','.join(rewards)}`",
        "- size: one micro-batch, 16 clips of the default embedded benchmark's train split, "
        "the shipped captioner, greedy decoding of 24 new tokens; a freshly initialised "
        "policy; scores + sets + rewards + loss + backward, no optimiser step. A: 8 anchors, "
        "RLOO. S: the Top-K set + 7 candidates over 2 rounds (4, then 3), w's saturation at "
        "its default of 5 points (no calibration here)",
        f"- medians of {args.rounds} rounds, arms and rewards alternating within each round "
        "(order reversed every other round); the last column is the median of the per-round "
        "ratios to A's step under the same reward (same retention); \"in the captioner\": "
        "time inside `generate_tokens` and `teacher_forced`", "", table, ""])
    print(report)
    if args.out is not None:
        Path(args.out).write_text(report, encoding="utf-8")


if __name__ == "__main__":
    main()
