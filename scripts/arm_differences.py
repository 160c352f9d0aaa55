"""Paired differences between any two arms of an ablation.json (issue #36's comparisons).

    python scripts/arm_differences.py CMP/ablation.json --pairs A-fid:C-fid,A-fid:A,B-fid:A-fid
    python scripts/arm_differences.py NEW/ablation.json --with OLD/ablation.json --pairs X:warmup
    python scripts/arm_differences.py NEW/ablation.json --with OLD/ablation.json@old --pairs A:A@old

The ablation's own table gives arm A − every other arm; this gives ``X − Y`` for each ``X:Y``
in ``--pairs``, at every retention the file scored, with the paired bootstrap 95% interval
(clips and training seeds resampled together, :mod:`avex.intervals`) and the verdict
of the project's decision rule (docs/evaluation.md, "Paired intervals"). ``--with`` adds the rows
of arms the file lacks from another ablation.json of the same judge, split and clips (its
full-token scores must be the file's, clip for clip), so an arm scored before need not be scored
again; ``--with FILE@TAG`` adds every arm of FILE as ``ARM@TAG`` (an arm both files hold, trained
two ways). ``--seeds 0`` keeps only those training seeds' rows of every arm (a one-seed
setting against the same seed of the arm it varies). Prints Markdown.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from avex.intervals import Interval, arm_pairs, difference_table, differences, with_arms_of


def verdict(value) -> str:
    if not isinstance(value, Interval):
        return "no interval"
    if value.low > 0:
        return "ahead"
    if value.high < 0:
        return "behind"
    return "level"


def only_seeds(result: dict, seeds: str) -> dict:
    """``result`` with the rows of the training seeds in ``seeds`` ("0,2") alone."""
    try:
        keep = {int(s) for s in seeds.split(",") if s.strip()}
    except ValueError:
        raise ValueError(f"--seeds must be comma-separated integers, got {seeds!r}") from None
    rows = [r for r in result["rows"] if r.get("seed") in keep]
    if not rows:
        raise ValueError(f"--seeds {seeds}: no row has those training seeds")
    return {**result, "rows": rows}


def arm_differences(result: dict, pairs) -> str:
    """One table per first arm of ``pairs``: X − each of its Y at every retention of
    ``result`` (an ablation.json's contents), then each cell's verdict under the rule."""
    variants = {r["variant"] for r in result["rows"]}
    for ours, other in pairs:
        for name in (ours, other):
            if name not in variants:
                raise ValueError(f"--pairs names {name!r}, which the file has no rows of; it "
                                 f"has {sorted(variants)}")
    retentions = result["retentions"]
    out = []
    for ours in dict.fromkeys(o for o, _ in pairs):
        others = [y for x, y in pairs if x == ours]
        intervals = differences(result["rows"], ours, others, retentions, "C_av", key="variant")
        out.append(difference_table(intervals, ours, {y: y for y in others}, retentions,
                                    others="arm"))
        for y in others:
            out.append(f"- {ours} against {y}: " + ", ".join(
                f"{r:.0%} {verdict(intervals[(y, r)])}" for r in retentions))
        out.append("")
    return "\n".join(out)


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path, help="an ablation.json")
    parser.add_argument("--pairs", type=arm_pairs, required=True, help="X:Y[,X:Y...]")
    parser.add_argument("--with", dest="others", action="append", default=[],
                        help="another ablation.json whose arms the file lacks are added; "
                             "FILE@TAG adds all of its arms as ARM@TAG")
    parser.add_argument("--seeds", default=None,
                        help="keep only these training seeds' rows (comma-separated)")
    args = parser.parse_args(argv)
    split = (o.rpartition("@") if "@" in o else (o, "", "") for o in args.others)
    others = [(Path(path), tag) for path, _, tag in split]
    for path in (args.file, *(p for p, _ in others)):
        if not path.is_file():
            parser.error(f"file: no such file {str(path)!r}")
    try:
        result = json.loads(args.file.read_text())
        for path, tag in others:
            result = with_arms_of(result, json.loads(path.read_text()), str(path), tag)
        if args.seeds is not None:
            result = only_seeds(result, args.seeds)
        text = arm_differences(result, args.pairs)
    except ValueError as err:
        parser.error(str(err))
    print(text)
    return text


if __name__ == "__main__":
    main()
