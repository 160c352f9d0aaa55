"""Paired differences between arms pooled over several benchmarks (issue #36's reports).

    python scripts/pooled_differences.py B0/ablation.json C0/ablation.json \
        B1/ablation.json C1/ablation.json --pairs Dc-fid:Cc-fid

The files are ablation.json files of ``python -m avex.evaluate ablation``. Those of one benchmark
(the judge's benchmark name), for example two arms scored apart, are merged. They must share the
judge (benchmark and captioner sha256), the split, the clips and full tokens' per-clip scores.
For each ``X:Y`` of ``--pairs`` it prints:

- each benchmark's X − Y with its paired 95% interval (clips and training seeds resampled
  together);
- the mean over benchmarks, each weighted equally, with the stratified interval. Each
  benchmark's clips and seeds are resampled on their own (``avex.intervals.pooled_interval``),
  as stage 1 of the default-recipe rule pools the val splits.

With ``--plan CLIPSxSEEDS[,...]`` it also prints, for each pair, what a deciding benchmark of
that size would resolve if the true difference were the pooled one: the half-width of X − Y's
95% interval and the chance that it excludes 0, from each benchmark's seed, clip and residual
variances (``avex.intervals.variance_components``, averaged over the benchmarks;
``planned_interval``, a normal approximation). It is for fixing a round's deciding benchmark
before it is built.

Any split may be given; choosing on test splits is for the rule's stage 2 alone
(docs/evaluation.md). Prints Markdown.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from avex.intervals import (arm_pairs, paired_interval, parse_plans, planned_interval,
                            pooled_interval, seed_rows, variance_components)
from avex.tables import markdown_table


def load(paths) -> dict:
    """benchmark name -> merged result (rows of every file of that benchmark)."""
    merged: dict[str, dict] = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        data["source"] = str(path)
        name = data["judge"]["benchmark"]["name"]
        if name not in merged:
            merged[name] = data
            continue
        first = merged[name]
        mine, theirs = _identity(data), _identity(first)
        for what in mine:
            if mine[what] != theirs[what]:
                raise ValueError(f"{path} and {first['source']} both score {name} but differ "
                                 f"in {what}")
        first["rows"] = first["rows"] + data["rows"]
        first["source"] += f" + {path}"
    return merged


def _identity(data: dict) -> dict:
    """What two files of one benchmark must share."""
    return {"judge": tuple(data["judge"][part]["sha256"] for part in ("benchmark", "captioner")),
            "split": data["split"], "clips": data["clips"],
            "full tokens' per-clip scores": data["full"]["per_clip"]}


def arm_scores(result: dict, name: str, retention: float) -> list:
    """[seeds, clips] per-clip C_av of arm ``name`` in one benchmark's result."""
    rows = seed_rows(result["rows"], name, retention, key="variant")
    if not rows:
        raise ValueError(f"{result['source']} has no per-clip {name} scores at {retention:.0%}")
    return [rows[s] for s in sorted(rows, key=str)]


def plan_table(merged: dict, ours: str, other: str, retentions, plans) -> list[str]:
    """Markdown lines: per planned (clips, seeds), X − Y's interval half-width and the chance
    it excludes 0 at each retention, if the true difference were the pooled one."""
    names = sorted(merged)
    cells = {}
    for r in retentions:
        diffs = [np.asarray(arm_scores(merged[n], ours, r))
                 - np.asarray(arm_scores(merged[n], other, r)) for n in names]
        if any(d.shape[0] < 2 for d in diffs):
            raise ValueError(f"--plan needs >= 2 training seeds of {ours} and {other} on every "
                             "benchmark: the seed variance is part of the plan")
        components = np.mean([variance_components(d) for d in diffs], axis=0)
        gap = float(np.mean([d.mean() for d in diffs]))
        cells[r] = (gap, [planned_interval(components, gap, c, s) for c, s in plans])
    rows = [[f"{c} clips, {s} seeds", *(f"±{cells[r][1][i][0]:.1f} ({cells[r][1][i][1]:.0%})"
                                        for r in retentions)]
            for i, (c, s) in enumerate(plans)]
    header = [f"{ours} − {other}", *(f"{r:.0%}: {cells[r][0]:+.1f}" for r in retentions)]
    return [f"A deciding benchmark of each size, if {ours} − {other} were the pooled "
            "difference (column heads): the 95% interval's half-width and, in brackets, the "
            "chance it excludes 0 on that difference's side (normal approximation from the "
            "seed, clip and residual variances, averaged over the benchmarks):", "",
            markdown_table(header, rows), ""]


def report(merged: dict, pairs, retentions, plans=()) -> str:
    names = sorted(merged)
    lines = [f"Pooled over {len(names)} benchmarks ({', '.join(names)}; "
             f"{merged[names[0]]['split']} split), each weighted equally.", ""]
    header = ["", *(f"{r:.0%}" for r in retentions)]
    for ours, other in pairs:
        table = []
        for name in names:
            cells = [paired_interval(arm_scores(merged[name], ours, r),
                                     arm_scores(merged[name], other, r)).text()
                     for r in retentions]
            table.append([name, *cells])
        pooled = [pooled_interval([(arm_scores(merged[n], ours, r), arm_scores(merged[n], other, r))
                                   for n in names]).text() for r in retentions]
        table.append(["**pooled**", *pooled])
        means = [[arm, *(f"{np.mean([np.mean(arm_scores(merged[n], arm, r)) for n in names]):.1f}"
                         for r in retentions)] for arm in (ours, other)]
        lines += ["Mean C_av over benchmarks and training seeds:", "",
                  markdown_table(["arm", *header[1:]], means), "",
                  f"{ours} − {other}, paired 95% intervals:", "",
                  markdown_table([f"{ours} − {other}", *header[1:]], table), ""]
        if plans:
            lines += plan_table(merged, ours, other, retentions, plans)
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="ablation.json files, one or more per benchmark")
    parser.add_argument("--pairs", type=arm_pairs, required=True, help="X:Y[,X:Y...]")
    parser.add_argument("--plan", type=parse_plans, default=[],
                        help="CLIPSxSEEDS[,...]: what a deciding benchmark of each size would "
                             "resolve (e.g. 1000x3,2000x10)")
    args = parser.parse_args(argv)
    try:
        merged = load(args.files)
        retentions = sorted({r["retention"] for m in merged.values() for r in m["rows"]},
                            reverse=True)
        text = report(merged, args.pairs, retentions, args.plan)
    except (ValueError, OSError, KeyError) as err:
        parser.error(str(err))
    print(text)


if __name__ == "__main__":
    main()
