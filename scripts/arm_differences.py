"""Paired differences between any two arms of an ablation.json (issue #36's comparisons).

    python scripts/arm_differences.py CMP/ablation.json --pairs A-fid:C-fid,A-fid:A,B-fid:A-fid

The ablation's own table gives arm A − every other arm; this gives ``X − Y`` for each ``X:Y``
in ``--pairs``, at every retention the file scored, with the paired bootstrap 95% interval
(clips and training seeds resampled together, :mod:`avex.evaluate.intervals`) and the verdict
of the project's decision rule (docs/evaluation.md, "Paired intervals"). Prints Markdown.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from avex.evaluate.intervals import Interval, difference_table, differences


def pairs_arg(text: str) -> list[tuple[str, str]]:
    pairs = []
    for item in text.split(","):
        ours, sep, other = item.partition(":")
        if not sep or not ours or not other:
            raise argparse.ArgumentTypeError(f"--pairs must be X:Y[,X:Y...], got {item!r}")
        pairs.append((ours, other))
    return pairs


def verdict(value) -> str:
    if not isinstance(value, Interval):
        return "no interval"
    if value.low > 0:
        return "ahead"
    if value.high < 0:
        return "behind"
    return "level"


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
    parser.add_argument("--pairs", type=pairs_arg, required=True, help="X:Y[,X:Y...]")
    args = parser.parse_args(argv)
    if not args.file.is_file():
        parser.error(f"file: no such file {str(args.file)!r}")
    try:
        text = arm_differences(json.loads(args.file.read_text()), args.pairs)
    except ValueError as err:
        parser.error(str(err))
    print(text)
    return text


if __name__ == "__main__":
    main()
