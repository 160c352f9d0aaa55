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

Any split may be given; choosing on test splits is for the rule's stage 2 alone
(docs/evaluation.md). Prints Markdown.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from avex.intervals import arm_pairs, paired_interval, pooled_interval, seed_rows
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


def report(merged: dict, pairs, retentions) -> str:
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
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="ablation.json files, one or more per benchmark")
    parser.add_argument("--pairs", type=arm_pairs, required=True, help="X:Y[,X:Y...]")
    args = parser.parse_args(argv)
    try:
        merged = load(args.files)
        retentions = sorted({r["retention"] for m in merged.values() for r in m["rows"]},
                            reverse=True)
        text = report(merged, args.pairs, retentions)
    except (ValueError, OSError, KeyError) as err:
        parser.error(str(err))
    print(text)


if __name__ == "__main__":
    main()
