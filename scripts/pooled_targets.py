"""Issue #36's "at or above every efficient method" target pooled over deciding benchmarks.

    python scripts/pooled_targets.py results/round6-deciding-targets.json \
        results/round7-deciding-targets.json

Each file is a ``scripts/decide_default_recipe.py --json`` output of one deciding benchmark,
all with the same default. For every CaCoVID-AV control and every efficient method of the
sweep (Attention-AV, a privileged reference, is left out as there), it prints the default's
mean C_av minus that method's, per benchmark and pooled: the mean over the benchmarks, each
weighted equally (round 7's rule in docs/evaluation.md). The target holds at a retention when
every pooled difference is at least 0. The CaCoVID-AV intervals come from
``scripts/pooled_differences.py``; this reads means only. Prints Markdown.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from avex.registry import METHODS


def differences(targets: dict) -> dict:
    """method -> {retention key: the default's mean − the method's} of one targets file."""
    default, means = targets["default"], targets["means"]
    out = {}
    for key in targets["retentions"]:
        r = f"{key:g}"
        mine = means[f"{default}@{key}"]
        for control in targets["controls"]:
            out.setdefault(control, {})[r] = mine - means[f"{control}@{key}"]
        for method, by_r in targets["others"].items():
            if METHODS[method].privileged or r not in by_r:
                continue
            out.setdefault(METHODS[method].label, {})[r] = mine - by_r[r]
    return out


def pool(files: list[dict]) -> dict:
    """The equal-weight mean over benchmarks of each method's difference, per retention; a
    method or retention missing from any file is refused (it would be pooled unequally)."""
    defaults = {f["default"] for f in files}
    if len(defaults) != 1:
        raise ValueError(f"the files read different defaults: {sorted(defaults)}")
    names = [f["benchmark"] for f in files]
    if len(set(names)) != len(names):
        raise ValueError(f"a deciding benchmark is given twice: {names}")
    per_file = [differences(f) for f in files]
    shared = set(per_file[0])
    for name, d in zip(names, per_file):
        if set(d) != shared or any(set(d[m]) != set(per_file[0][m]) for m in d):
            raise ValueError(f"{name} does not hold the same methods and retentions as "
                             f"{names[0]}: {sorted(d)} against {sorted(shared)}")
    return {m: {r: sum(d[m][r] for d in per_file) / len(per_file) for r in per_file[0][m]}
            for m in per_file[0]}


def report(files: list[dict]) -> str:
    pooled = pool(files)
    per_file = [differences(f) for f in files]
    rs = list(next(iter(pooled.values())))
    lines = [f"The default ({files[0]['default']}) minus each method's mean C_av, per deciding "
             f"benchmark and pooled (each benchmark weighted equally):", "",
             "| method | benchmark | " + " | ".join(f"{float(r):.0%}" for r in rs) + " |",
             "|---|---|" + "---|" * len(rs)]
    for method in pooled:
        for f, d in zip(files, per_file):
            lines.append(f"| {method} | {f['benchmark']} | "
                         + " | ".join(f"{d[method][r]:+.1f}" for r in rs) + " |")
        lines.append(f"| {method} | **pooled** | "
                     + " | ".join(f"**{pooled[method][r]:+.1f}**" for r in rs) + " |")
    held = {r: all(pooled[m][r] >= 0 for m in pooled) for r in rs}
    lines += ["", "Pooled, the default's mean is at or above every efficient method's at "
              + (", ".join(f"{float(r):.0%}" for r in rs if held[r]) or "no retention")
              + "; below one at " + (", ".join(f"{float(r):.0%}" for r in rs if not held[r])
                                     or "none") + "."]
    return "\n".join(lines)


def load(path) -> dict:
    data = json.loads(Path(path).read_text())
    for key in ("default", "controls", "retentions", "means", "others"):
        if key not in data:
            raise ValueError(f"{path} is not a decide_default_recipe.py --json output "
                             f"(no {key!r})")
    data["source"] = str(path)
    if not data.get("benchmark"):  # written before the files named it
        data["benchmark"] = Path(path).stem
    return data


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("targets", nargs="+", help="decide_default_recipe.py --json outputs")
    args = parser.parse_args(argv)
    if len(args.targets) < 2:
        parser.error(f"pooling needs two or more targets files, got {args.targets}")
    try:
        text = report([load(p) for p in args.targets])
    except (ValueError, OSError, KeyError) as err:
        parser.error(str(err))
    print(text)


if __name__ == "__main__":
    main()
