"""The matched-budget comparison of issue #25 over several benchmarks, and its decision.

    python scripts/matched_budget_report.py --deciding 3 \
        0=CMP/b0/ablation.json 1=CMP/b1/ablation.json 2=CMP/b2/ablation.json \
        3=CMP/b3/ablation.json --out results/matched-budget

Each ``SEED=FILE`` is the ablation.json that ``python -m avex.evaluate ablation --variants
warmup,A,B,C,paper --seeds 0,1,2 --retentions 0.5,0.4,0.3,0.2,0.1`` wrote for that benchmark
seed (issue #33's re-scoring adds C-fid and D-fid to the variants). Writes ``OUT.md`` (per
benchmark: C_av mean ± std and per training seed for every arm, C_av / full tokens, A − every
other arm with its paired bootstrap 95% interval, and the default recipe (D-fid) − every other
arm where a file scores it; the exchange term's diagnostics of arm B; the decision) and
``OUT.json``.

The rule (docs/evaluation.md, "Paired intervals"): arm X beats arm Y at a retention when the
95% paired bootstrap interval of X − Y (clips and training seeds resampled together,
``avex.intervals``) lies above 0, and is worse when it lies below 0. On the deciding
benchmark, B must beat A at two or more retentions and be worse nowhere; then the exchange term
becomes the default, else it stays off. An ablation.json written before rows recorded per-clip
scores gives no interval, and no decision, and the report says so.
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
from avex.evaluate.common import results_json
from avex.intervals import RULE, Interval, difference_table, differences
from avex.paths import portable_command
from avex.registry import label as method_label
from avex.tables import markdown_table
from avex.training.exchange_diagnostics import summarize

# rows absent from a file are skipped
ARMS = ("warmup", "rloo", "A", "B", "C", "paper", "S", "D", "A-fid", "B-fid", "C-fid", "S-fid",
        "D-fid")
#: the default recipe since issue #36: where a file scores it, the report also gives the
#: default − every other arm
DEFAULT_ARM = "D-fid"
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
    """The rule between B and A on one benchmark: B beats A at a retention when the paired
    95% interval of B − A lies above 0, is worse when it lies below 0. Without per-clip scores
    there is no interval, and ``exchange_term_becomes_default`` is None (no decision)."""
    intervals = differences(rows, "B", ["A"], retentions, "C_av", key="variant")
    per = {}
    for r in retentions:
        value = intervals[("A", r)]
        entry = {"A": float(np.mean(cells(rows, "A", r))),
                 "B": float(np.mean(cells(rows, "B", r)))}
        if isinstance(value, Interval):
            entry.update(margin=value.difference, low=value.low, high=value.high,
                         B_beats_A=value.above_zero, B_worse=value.below_zero)
        else:
            entry.update(margin=entry["B"] - entry["A"], none=value, B_beats_A=None,
                         B_worse=None)
        per[f"{r:g}"] = entry
    if any(v["B_beats_A"] is None for v in per.values()):
        return {"per_retention": per, "wins": None, "worse_at": None,
                "exchange_term_becomes_default": None,
                "why_none": next(v["none"] for v in per.values() if "none" in v)}
    wins = sum(v["B_beats_A"] for v in per.values())
    worse = [k for k, v in per.items() if v["B_worse"]]
    return {"per_retention": per, "wins": wins, "worse_at": worse,
            "exchange_term_becomes_default": wins >= 2 and not worse}


def arm_intervals(data, ours: str = "A") -> dict:
    """(arm, retention) -> ``ours`` − arm with its paired 95% interval (or why there is none),
    for every other arm of the file and full tokens; {} when the file lacks ``ours``."""
    present = [a for a in ARMS if any(r["variant"] == a for r in data["rows"])]
    if ours not in present:
        return {}
    return differences(data["rows"], ours, [a for a in present if a != ours] + ["full"],
                       data["retentions"], "C_av", key="variant", full=data.get("full"))


def interval_labels(intervals: dict) -> dict:
    """arm -> printed label, in the intervals' order, full tokens last."""
    labels = {a: ABLATIONS[a][0] for a in dict.fromkeys(a for a, _ in intervals) if a != "full"}
    return {**labels, "full": method_label("full")}


def run_path(run: str, source: Path) -> Path:
    """A row's run: relative to the folder of the ablation.json that records it (absolute in
    files written before results recorded no machine paths)."""
    return Path(run) if Path(run).is_absolute() else source.parent / run


def diagnostics(rows, source: Path) -> dict:
    """Arm B's exchange diagnostics, averaged over its runs (type -> key -> statistic)."""
    runs = sorted({r["run"] for r in rows if r["variant"] == "B"})
    summaries = [summarize(run_path(run, source) / "metrics.jsonl") for run in runs]
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


def provenance(files, benchmarks: dict) -> str:
    """Where and from what this report was written (each ablation.json says how it ran)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), platform.processor()) \
        if Path("/proc/cpuinfo").exists() else platform.processor()
    counts = sorted({clip_count(data) for data in benchmarks.values()}, key=str)
    splits = sorted({data.get("split", "test") for data in benchmarks.values()})
    variants = [a for a in ARMS if any(r["variant"] == a for data in benchmarks.values()
                                       for r in data["rows"])]
    return (f"Written {datetime.date.today()} at commit {commit} on {cpu} from "
            + ", ".join(f"`{portable_command([f.partition('=')[2]])}`" for f in files)
            + f" (`python -m avex.evaluate ablation --variants {','.join(variants)} --seeds "
            "0,1,2 --retentions 0.5,0.4,0.3,0.2,0.1`, each with its benchmark's `--data` and "
            f"shipped `--captioner`; {' / '.join(splits)} split, "
            f"{' / '.join(map(str, counts))} clips, greedy decoding, 24 new tokens).")


def clip_count(data) -> int | str:
    """The clips an ablation.json scored: recorded, else the length of its per-clip scores,
    else unknown."""
    if "clips" in data:
        return data["clips"]
    per_clip = (data["rows"][0].get("per_clip") or {}).get("C_av") if data["rows"] else None
    return len(per_clip) if per_clip else "an unrecorded number of"


def decision_line(verdict: dict) -> str:
    """B against A at each retention, as the report prints it."""
    def one(key, v):
        if v["B_beats_A"] is None:
            return f"{key}: {v['margin']:+.1f} ({v['none']})"
        return f"{key}: {v['margin']:+.1f} [{v['low']:+.1f}, {v['high']:+.1f}]"
    return ("B − A with its paired 95% interval: "
            + "; ".join(one(k, v) for k, v in verdict["per_retention"].items()))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", metavar="SEED=FILE")
    parser.add_argument("--deciding", type=int, required=True, help="the deciding benchmark seed")
    parser.add_argument("--out", required=True, help="output path without extension")
    args = parser.parse_args(argv)
    benchmarks, sources = {}, {}
    for item in args.files:
        seed, _, path = item.partition("=")
        if not seed.isdigit() or not Path(path).is_file():
            parser.error(f"each file must be SEED=PATH to an existing ablation.json, got {item!r}")
        benchmarks[int(seed)] = json.loads(Path(path).read_text())
        sources[int(seed)] = Path(path)
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
        intervals = arm_intervals(data)
        default_intervals = arm_intervals(data, DEFAULT_ARM)
        diag = diagnostics(rows, sources[seed])
        report["benchmarks"][seed] = {
            "full": full, "judge": data.get("judge"), "decision": verdict,
            "intervals": [{"ours": "A", "arm": arm, "retention": r, "metric": "C_av",
                           **(v.as_dict() if isinstance(v, Interval) else {"none": v})}
                          for (arm, r), v in intervals.items()],
            "default_intervals": [
                {"ours": DEFAULT_ARM, "arm": arm, "retention": r, "metric": "C_av",
                 **(v.as_dict() if isinstance(v, Interval) else {"none": v})}
                for (arm, r), v in default_intervals.items()],
            "diagnostics": diag}
        judge = data.get("judge") or {}
        lines += [f"## Benchmark seed {seed}" + (" (deciding)" if seed == args.deciding else ""),
                  "", f"Full tokens: {full:.1f}. Judge: benchmark sha256 "
                  f"`{judge.get('benchmark', {}).get('sha256', '?')[:16]}`, captioner sha256 "
                  f"`{(judge.get('captioner', {}).get('sha256') or '?')[:16]}`.", "",
                  "C_av, mean ± std over training seeds 0, 1, 2:", "",
                  markdown_table(header, mean_lines), "", "C_av / full tokens:", "",
                  markdown_table(header, ratio_lines), "", "Per training seed (C_av):", "",
                  markdown_table(header, seed_lines), "",
                  "A − arm, C_av, with its paired bootstrap 95% interval (clips and training "
                  "seeds resampled together):", "",
                  difference_table(intervals, "A", interval_labels(intervals), retentions,
                                   others="arm"), "",
                  decision_line(verdict), ""]
        if default_intervals:
            lines += [f"The default recipe ({DEFAULT_ARM}) − arm, C_av, with its paired "
                      "bootstrap 95% interval:", "",
                      difference_table(default_intervals, DEFAULT_ARM,
                                       interval_labels(default_intervals), retentions,
                                       others="arm"), ""]
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
    lines += ["## Decision", "", f"The rule: {RULE}. The exchange term becomes the default "
              "when, on the deciding benchmark, B beats A at two or more retentions and is "
              "worse nowhere.", ""]
    if decision["exchange_term_becomes_default"] is None:
        lines.append(f"No decision on the deciding benchmark (seed {args.deciding}): "
                     f"{decision['why_none']} (re-score the runs with this version of "
                     "`python -m avex.evaluate ablation`).")
    else:
        lines.append(
            f"On the deciding benchmark (seed {args.deciding}) B beats A at "
            f"{decision['wins']} retention(s) and is worse at "
            f"{', '.join(decision['worse_at']) or 'none'}: the exchange term "
            + ("becomes the default." if decision["exchange_term_becomes_default"] else
               "stays off by default (behind --exchanges and --preset paper)."))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".md").write_text("# Matched-budget comparison (issues #25 and #33)\n\n"
                                      + provenance(args.files, benchmarks) + "\n\n"
                                      + "\n".join(lines) + "\n")
    Path(args.out + ".json").write_text(results_json(report))
    print("\n".join(lines[-3:]))


if __name__ == "__main__":
    main()
