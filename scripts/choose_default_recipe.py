"""Stage 1 of issue #36's choice of the default recipe (docs/evaluation.md, "Choosing the
default recipe"), on the val splits of several benchmarks:

    python scripts/choose_default_recipe.py b0/ablation.json b1/ablation.json ... \
        [--candidates A,A-fid,B-fid] [--exchange-arms B-fid]

The first candidate is the incumbent, the default the others must displace: A in the first
round (stage 1 of 2026-11-27), D-fid in the second (``--candidates D-fid,E-fid,D8-fid``).

Each file is an ``avex.evaluate ablation`` output scored on a val split (a test split is
refused: the test split only reports); several files of one benchmark (arms scored at other
times, on the same judge and clips) are merged. Every candidate is compared with the
incumbent at every retention, pooled over the files
(:func:`avex.intervals.pooled_interval`: each benchmark's clips and seeds resampled
on their own, the benchmarks weighted equally). The rule, applied in
this order:

1. a candidate is eligible when it is worse than the incumbent at no retention;
2. an exchange arm is eligible only if it also beats A-fid at two or more retentions and is
   worse than it nowhere (the exchange term enters the default only if it wins);
3. among the eligible, the highest mean C_av over 20% and 10% is chosen;
4. a choice that is ahead of a simpler eligible candidate (order of ``--candidates``) at no
   retention loses to it, and the simpler one is checked the same way.

Prints Markdown: the pooled table, every comparison the rule used, and the choice.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from avex.intervals import RULE, Interval, pooled_interval, seed_rows

CANDIDATES = ("A", "A-fid", "B-fid")
EXCHANGE_ARMS = ("B-fid", "B", "S", "S-fid")
CHOICE_RETENTIONS = (0.2, 0.1)


def load_results(paths) -> list[dict]:
    """The ablation.json files, each checked to be a val-split result, one result per
    benchmark: files of the same benchmark (arms scored at different times) are merged when
    they share the judge (benchmark and captioner sha256), the clips and the retentions."""
    by_benchmark: dict[str, dict] = {}
    for path in paths:
        data = json.loads(Path(path).read_text())
        if data.get("split") != "val":
            raise ValueError(f"{path} was scored on split {data.get('split')!r}; stage 1 "
                             "chooses on val splits only (the test split only reports)")
        data["source"] = str(path)
        name = data["judge"]["benchmark"]["name"]
        if name not in by_benchmark:
            by_benchmark[name] = data
            continue
        first = by_benchmark[name]
        for key in ("judge", "clips", "retentions"):
            if _judged(first, key) != _judged(data, key):
                raise ValueError(f"{path} and {first['source']} both score {name} but differ "
                                 f"in {key}: {_judged(data, key)} against {_judged(first, key)}")
        twice = {r["variant"] for r in first["rows"]} & {r["variant"] for r in data["rows"]}
        if twice:
            raise ValueError(f"{path} and {first['source']} both score {sorted(twice)} on "
                             f"{name}; give each arm of a benchmark once")
        first["rows"] = first["rows"] + data["rows"]
        first["source"] += f" + {path}"
    results = list(by_benchmark.values())
    retentions = [tuple(r["retentions"]) for r in results]
    if len(set(retentions)) != 1:
        raise ValueError(f"the files scored different retentions: {retentions}")
    return results


def _judged(data: dict, key: str):
    """What two files of one benchmark must share: the judge's hashes, clips, retentions."""
    if key == "judge":
        judge = data.get("judge") or {}
        return tuple((judge.get(part) or {}).get("sha256") for part in ("benchmark", "captioner"))
    return data.get(key)


def per_benchmark(result: dict, name: str, retention: float) -> list:
    """[seeds, clips] per-clip C_av of ``name`` in one file (seeds in order)."""
    rows = seed_rows(result["rows"], name, retention, key="variant")
    if rows is None:
        raise ValueError(f"{result['source']}: {name} at {retention:.0%} has no per-clip "
                         "scores")
    if not rows:
        raise ValueError(f"{result['source']} has no {name} row at {retention:.0%}")
    return [rows[s] for s in sorted(rows, key=str)]


def pooled(results, ours: str, other: str, retention: float) -> Interval:
    return pooled_interval([(per_benchmark(r, ours, retention), per_benchmark(r, other, retention))
                            for r in results])


def pooled_mean(results, name: str, retention: float) -> float:
    return float(np.mean([np.mean(per_benchmark(r, name, retention)) for r in results]))


def wins(interval: Interval) -> bool:
    return interval.low > 0


def loses(interval: Interval) -> bool:
    return interval.high < 0


def choose(results, candidates, exchange_arms) -> dict:
    """The rule of this module's docstring; every interval it read, and the steps."""
    retentions = list(results[0]["retentions"])
    missing = [r for r in CHOICE_RETENTIONS if not any(math.isclose(r, x) for x in retentions)]
    if missing:
        raise ValueError(f"the files don't score {missing}, which the choice averages")
    if len(candidates) < 2 or len(set(candidates)) != len(candidates):
        raise ValueError(f"--candidates must name the incumbent and at least one other arm, "
                         f"each once, got {candidates}")
    incumbent = candidates[0]
    against_incumbent = {(name, r): pooled(results, name, incumbent, r)
                         for name in candidates[1:] for r in retentions}
    steps, eligible = [], [incumbent]
    for name in candidates[1:]:
        worse = [r for r in retentions if loses(against_incumbent[(name, r)])]
        if worse:
            steps.append(f"{name} is out: worse than {incumbent} at {fmt_retentions(worse)}")
            continue
        if name in exchange_arms and "A-fid" in candidates:
            vs = [pooled(results, name, "A-fid", r) for r in retentions]
            ahead = [r for r, i in zip(retentions, vs) if wins(i)]
            behind = [r for r, i in zip(retentions, vs) if loses(i)]
            if len(ahead) < 2 or behind:
                steps.append(f"{name} is out: an exchange arm must beat A-fid at two or more "
                             f"retentions and be worse nowhere; ahead at "
                             f"{fmt_retentions(ahead)}, behind at {fmt_retentions(behind)}")
                continue
        eligible.append(name)
    score = {name: float(np.mean([pooled_mean(results, name, r) for r in CHOICE_RETENTIONS]))
             for name in candidates}
    chosen = max(eligible, key=lambda name: score[name])
    steps.append(f"highest mean C_av over 20% and 10% among the eligible: {chosen} "
                 f"({score[chosen]:.1f})")
    replaced = True
    while replaced:
        replaced = False
        for simpler in eligible[:eligible.index(chosen)]:
            ahead = [r for r in retentions if wins(pooled(results, chosen, simpler, r))]
            if not ahead:
                steps.append(f"{chosen} is ahead of the simpler {simpler} at no retention: "
                             f"{simpler} takes its place")
                chosen, replaced = simpler, True
                break
            steps.append(f"{chosen} is ahead of the simpler {simpler} at "
                         f"{fmt_retentions(ahead)}")
    return {"retentions": retentions, "against_incumbent": against_incumbent, "score": score,
            "eligible": eligible, "steps": steps, "chosen": chosen}


def fmt_retentions(values) -> str:
    return ", ".join(f"{r:.0%}" for r in values) or "none"


def report(results, decision: dict, candidates) -> str:
    retentions = decision["retentions"]
    lines = [f"Pooled over {len(results)} benchmarks' val splits "
             f"({', '.join(r['judge']['benchmark']['name'] for r in results)}; "
             f"{sum(r['clips'] for r in results)} clips), each benchmark weighted equally.", "",
             "Mean C_av (CIDEr points) over benchmarks and training seeds:", "",
             "| arm | " + " | ".join(f"{r:.0%}" for r in retentions) + " | mean of 20%, 10% |",
             "|---|" + "---|" * (len(retentions) + 1)]
    for name in candidates:
        cells = [f"{pooled_mean(results, name, r):.1f}" for r in retentions]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {decision['score'][name]:.1f} |")
    lines += ["", f"Each arm − {candidates[0]}, pooled, with its paired 95% interval:", "",
              f"| arm − {candidates[0]} | " + " | ".join(f"{r:.0%}" for r in retentions) + " |",
              "|---|" + "---|" * len(retentions)]
    for name in candidates[1:]:
        lines.append(f"| {name} | " + " | ".join(decision["against_incumbent"][(name, r)].text()
                                                for r in retentions) + " |")
    lines += ["", f"The rule: {RULE}.", ""] + [f"- {step}" for step in decision["steps"]]
    lines += ["", f"**Stage 1 chooses {decision['chosen']}.**"]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="ablation.json of each benchmark (val split)")
    parser.add_argument("--candidates", default=",".join(CANDIDATES),
                        help="candidates, simplest first, starting with the incumbent "
                             "(default %(default)s)")
    parser.add_argument("--exchange-arms", default=",".join(EXCHANGE_ARMS),
                        help="candidates that carry the exchange term (default %(default)s)")
    args = parser.parse_args(argv)
    candidates = [c for c in args.candidates.split(",") if c]
    try:
        results = load_results(args.files)
        decision = choose(results, candidates, set(args.exchange_arms.split(",")))
    except (ValueError, OSError, KeyError) as err:
        parser.error(str(err))
    print(report(results, decision, candidates))


if __name__ == "__main__":
    main()
