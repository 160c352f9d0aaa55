"""The matched-budget comparison of issue #25 over several benchmarks, and its decision.

    python scripts/matched_budget_report.py --deciding 3 \
        0=CMP/b0/ablation.json 1=CMP/b1/ablation.json 2=CMP/b2/ablation.json \
        3=CMP/b3/ablation.json --out results/matched-budget

Each ``SEED=FILE`` is the ablation.json that ``python -m avex.evaluate ablation --variants
warmup,A,B,C,paper --seeds 0,1,2 --retentions 0.5,0.4,0.3,0.2,0.1`` wrote for that benchmark
seed. Writes ``OUT.md`` (per benchmark: C_av mean ± std and per training seed for every arm,
C_av / full tokens; the exchange term's diagnostics of arm B; the decision) and ``OUT.json``.

The rule (the issue's): on the deciding benchmark, B must beat A by more than the combined
std (std_A + std_B) at two or more retentions, and be no worse elsewhere (nowhere below A by
more than the combined std); then the exchange term becomes the default, else it is retired
from it.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
from pathlib import Path

import numpy as np

from avex.evaluate.ablation import ABLATIONS
from avex.exchange_diagnostics import summarize
from avex.tables import markdown_table

ARMS = ("warmup", "rloo", "A", "B", "C", "paper")  # rows absent from a file are skipped
STATS = ("zero", "disagree", "positive", "g_over_k", "grad_ratio")


def cells(rows, variant, retention):
    return [r["C_av"] for r in rows if r["variant"] == variant and r["retention"] == retention]


def fmt(values, digits=1):
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{np.mean(values):.{digits}f} ± {np.std(values):.{digits}f}"


def decide(rows, retentions) -> dict:
    """The issue's rule between A and B on one benchmark."""
    per = {}
    for r in retentions:
        a, b = cells(rows, "A", r), cells(rows, "B", r)
        margin = float(np.mean(b) - np.mean(a))
        combined = float(np.std(a) + np.std(b))
        per[f"{r:g}"] = {"A": float(np.mean(a)), "B": float(np.mean(b)), "margin": margin,
                         "combined_std": combined, "B_beats_A": margin > combined,
                         "B_worse": margin < -combined}
    wins = sum(v["B_beats_A"] for v in per.values())
    worse = [k for k, v in per.items() if v["B_worse"]]
    return {"per_retention": per, "wins": wins, "worse_at": worse,
            "exchange_term_becomes_default": wins >= 2 and not worse}


def diagnostics(rows) -> dict:
    """Arm B's exchange diagnostics, averaged over its runs (type -> key -> statistic)."""
    runs = sorted({r["run"] for r in rows if r["variant"] == "B"})
    summaries = [summarize(Path(run) / "metrics.jsonl") for run in runs]
    out = {}
    for name in ("vv", "aa", "va", "av", "total"):
        out[name] = {}
        for key in ("all", "0.5", "0.4", "0.3", "0.2", "0.1"):
            values = {}
            for stat in (*STATS, "unscaled", "valid"):
                got = [s[name][key][stat] for s in summaries
                       if key in s.get(name, {}) and s[name][key].get(stat) is not None]
                values[stat] = float(np.mean(got)) if got else None
            out[name][key] = values
    return {"runs": runs, "means": out}


def provenance(files) -> str:
    """Where and from what this report was written (each ablation.json says how it ran)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor()) \
        if Path("/proc/cpuinfo").exists() else platform.processor()
    return (f"Written {datetime.date.today()} at commit {commit} on {cpu} from "
            + ", ".join(f"`{f.partition('=')[2]}`" for f in files)
            + " (`python -m avex.evaluate ablation --variants warmup,A,B,C,paper --seeds 0,1,2 "
            "--retentions 0.5,0.4,0.3,0.2,0.1`, each with its benchmark's `--data` and shipped "
            "`--captioner`; test split, 200 clips, greedy decoding, 24 new tokens).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", metavar="SEED=FILE")
    parser.add_argument("--deciding", type=int, required=True, help="the deciding benchmark seed")
    parser.add_argument("--out", required=True, help="output path without extension")
    args = parser.parse_args()
    benchmarks = {}
    for item in args.files:
        seed, _, path = item.partition("=")
        if not seed.isdigit() or not Path(path).is_file():
            parser.error(f"each file must be SEED=PATH to an existing ablation.json, got {item!r}")
        benchmarks[int(seed)] = json.loads(Path(path).read_text())
    if args.deciding not in benchmarks:
        parser.error(f"--deciding must be one of the given benchmark seeds {sorted(benchmarks)}, "
                     f"got {args.deciding}")
    lines, report = [], {"benchmarks": {}, "deciding": args.deciding}
    for seed, data in sorted(benchmarks.items()):
        rows, retentions, full = data["rows"], data["retentions"], data["full"]["C_av"]
        header = ["arm", *(f"{r:.0%}" for r in retentions)]
        mean_lines, ratio_lines, seed_lines = [], [], []
        for arm in ARMS:
            if not any(r["variant"] == arm for r in rows):
                continue
            label = ABLATIONS[arm][0]
            mean_lines.append([label, *(fmt(cells(rows, arm, r)) for r in retentions)])
            ratio_lines.append([label, *(fmt([v / full for v in cells(rows, arm, r)], 3)
                                         for r in retentions)])
            for train_seed in sorted({r["seed"] for r in rows if r["variant"] == arm}):
                seed_lines.append([f"{arm}, seed {train_seed}", *(
                    fmt([x["C_av"] for x in rows if x["variant"] == arm and x["retention"] == r
                         and x["seed"] == train_seed]) for r in retentions)])
        verdict = decide(rows, retentions)
        diag = diagnostics(rows)
        report["benchmarks"][seed] = {"full": full, "judge": data.get("judge"),
                                      "decision": verdict, "diagnostics": diag}
        judge = data.get("judge") or {}
        lines += [f"## Benchmark seed {seed}" + (" (deciding)" if seed == args.deciding else ""),
                  "", f"Full tokens: {full:.1f}. Judge: benchmark sha256 "
                  f"`{judge.get('benchmark', {}).get('sha256', '?')[:16]}`, captioner sha256 "
                  f"`{(judge.get('captioner', {}).get('sha256') or '?')[:16]}`.", "",
                  "C_av, mean ± std over training seeds 0, 1, 2:", "",
                  markdown_table(header, mean_lines), "", "C_av / full tokens:", "",
                  markdown_table(header, ratio_lines), "", "Per training seed (C_av):", "",
                  markdown_table(header, seed_lines), "",
                  "B against A (margin = B - A; combined std = std_A + std_B): " + "; ".join(
                      f"{k}: {v['margin']:+.1f} vs {v['combined_std']:.1f}"
                      for k, v in verdict["per_retention"].items()), ""]
        diag_lines = []
        for name in ("vv", "aa", "va", "av"):
            for key in ("0.5", "0.4", "0.3", "0.2", "0.1"):
                d = diag["means"][name][key]
                if d["zero"] is None:
                    continue
                diag_lines.append([f"{name[0].upper()}>{name[1].upper()}", f"{float(key):.0%}",
                                   *(f"{100 * d[s]:.0f}%" for s in ("zero", "disagree",
                                                                    "positive")),
                                   f"{d['g_over_k']:.3f}", f"{100 * d['valid']:.0f}%",
                                   "n/a" if d["grad_ratio"] is None else f"{d['grad_ratio']:.3f}"])
        total = diag["means"]["total"]["all"]
        lines += ["Arm B's exchange diagnostics (means over its runs' RL micro-batches):", "",
                  markdown_table(["type", "retention", "dR = 0", "sign disagrees", "dR > 0",
                                  "g / K", "built", "grad ratio"], diag_lines), "",
                  f"Whole term: ||grad lambda L_ex|| / ||grad L_RL|| = "
                  f"{total['grad_ratio']:.3f} (before normalisation, at lambda 1: "
                  f"{total['unscaled']:.2f}).", ""]
    decision = report["benchmarks"][args.deciding]["decision"]
    lines += ["## Decision", "",
              f"On the deciding benchmark (seed {args.deciding}) B beats A by more than the "
              f"combined std at {decision['wins']} retention(s) and is worse by more than it at "
              f"{', '.join(decision['worse_at']) or 'none'}: the exchange term "
              + ("becomes the default." if decision["exchange_term_becomes_default"] else
                 "is retired from the default (it stays behind --exchanges and --preset paper).")]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".md").write_text("# Matched-budget comparison (issue #25)\n\n"
                                      + provenance(args.files) + "\n\n"
                                      + "\n".join(lines) + "\n")
    Path(args.out + ".json").write_text(json.dumps(report, indent=1) + "\n")
    print("\n".join(lines[-3:]))


if __name__ == "__main__":
    main()
