"""Stage 2 of issue #36's choice of the default recipe (docs/evaluation.md, "Choosing the
default recipe"), on the deciding benchmark's test split, once:

    python scripts/decide_default_recipe.py --chosen D-fid --ablation B4/ablation.json \
        --sweep B4-sweep/sweep.json

``--ablation``: an ``avex.evaluate ablation`` output on the test split holding arm A, the
controls C and C-fid and stage 1's choice, 3 training seeds each (``--with FILE``, repeatable,
adds the arms of other files of the same judge and clips, e.g. ``scripts/score_merging.py``'s). ``--sweep``: an ``avex.evaluate
sweep`` output on the same judge and clips holding the other methods (Random, FastV-AV, ToMe-AV,
FastAV and the privileged Attention-AV). ``--incumbent`` (default A, round 1's; D-fid from
round 2 on) is the default the choice must not be worse than; ``--controls`` (default C,C-fid;
round 3 adds Cc-fid) the CaCoVID-AV arms the default is read against. The rule:

1. the chosen recipe becomes the default if it is worse than the incumbent at no retention (the
   paired 95% interval of chosen − incumbent, over clips and training seeds, lies below 0
   nowhere); otherwise the incumbent stays;
2. the report gives the default − each control with its interval at every retention, and
   reads issue #36's targets against the strongest of them (the highest mean, per retention);
3. "above every efficient method" compares means with every method of both files except
   Attention-AV, a privileged reference.

Prints Markdown; ``--json`` also writes the numbers.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from avex.intervals import RULE, Interval, paired_interval, seed_rows, with_arms_of
from avex.registry import METHODS

CONTROLS = ("C", "C-fid")
#: issue #36's targets on the deciding benchmark: the default − the stronger CaCoVID-AV
SIGNIFICANT_AT = (0.2, 0.1)            # the interval above 0
LEVEL_AT = (0.5, 0.4, 0.3)             # the mean at least 0


def load(path, kind: str) -> dict:
    data = json.loads(Path(path).read_text())
    split = data.get("split", (data.get("settings") or {}).get("split"))
    if split is None and kind == "sweep":  # a sweep from before it recorded the split: its
        # command says it (--split, default test)
        words = str(data.get("command", "")).split()
        split = words[words.index("--split") + 1] if "--split" in words[:-1] else "test"
    if split != "test":
        raise ValueError(f"{path} was scored on split {split!r}; stage 2 decides on the "
                         "deciding benchmark's test split")
    data["source"], data["kind"] = str(path), kind
    return data


def judge_of(data: dict) -> tuple:
    judge = data.get("judge") or (data.get("settings") or {}).get("judge") or {}
    return tuple((judge.get(part) or {}).get("sha256") for part in ("benchmark", "captioner"))


def scores(data: dict, name: str, retention: float) -> list:
    """[seeds, clips] per-clip C_av of ``name`` (a variant of an ablation, a method of a
    sweep) at ``retention``."""
    key = "variant" if data["kind"] == "ablation" else "method"
    rows = seed_rows(data["rows"], name, retention, key=key)
    if not rows:
        raise ValueError(f"{data['source']} has no per-clip {name} row at {retention:.0%}")
    return [rows[s] for s in sorted(rows, key=str)]


def decide(ablation: dict, chosen: str, sweep: dict | None = None, *, incumbent: str = "A",
           controls=CONTROLS) -> dict:
    """The rule of this module's docstring; every interval and mean it read."""
    retentions = list(ablation["retentions"])
    controls = tuple(controls)
    if not controls or incumbent in controls or chosen in controls:
        raise ValueError(f"controls must be CaCoVID-AV arms other than the incumbent "
                         f"({incumbent}) and the choice ({chosen}), got {list(controls)}")
    names = {row["variant"] for row in ablation["rows"]}
    arms = tuple(dict.fromkeys((incumbent, *controls, chosen)))
    missing = [n for n in arms if n not in names]
    if missing:
        raise ValueError(f"{ablation['source']} lacks the arms {missing}")
    if sweep is not None and judge_of(sweep) != judge_of(ablation):
        raise ValueError(f"{sweep['source']} and {ablation['source']} were scored by different "
                         f"judges: {judge_of(sweep)} against {judge_of(ablation)}")
    vs_incumbent = {r: paired_interval(scores(ablation, chosen, r),
                                       scores(ablation, incumbent, r)) for r in retentions}
    worse = [r for r in retentions if vs_incumbent[r].high < 0]
    default = incumbent if worse or chosen == incumbent else chosen
    means = {(n, r): float(np.mean(scores(ablation, n, r))) for n in arms for r in retentions}
    vs_controls = {(c, r): paired_interval(scores(ablation, default, r), scores(ablation, c, r))
                   for c in controls for r in retentions}
    stronger = {r: max(controls, key=lambda c: means[(c, r)]) for r in retentions}
    others = {}
    if sweep is not None:
        for row in sweep["rows"]:
            method = row["method"]
            at = [r for r in retentions if math.isclose(r, row["retention"])]
            if method in ("full", "avex", "cacovid") or not at:
                continue
            others.setdefault(method, {}).setdefault(at[0], []).append(row["C_av"])
    efficient = {m: {r: float(np.mean(v)) for r, v in by_r.items()}
                 for m, by_r in others.items() if not METHODS[m].privileged}
    # per retention, the efficient methods whose mean is above the default's
    ahead_of_default = {r: [c for c in controls if means[(c, r)] > means[(default, r)]]
                        + [METHODS[m].label for m, by_r in efficient.items()
                           if r in by_r and by_r[r] > means[(default, r)]]
                        for r in retentions}
    targets = {
        "significant": {r: vs_controls[(stronger[r], r)].low > 0 for r in SIGNIFICANT_AT
                        if r in retentions},
        "level": {r: vs_controls[(stronger[r], r)].difference >= 0 for r in LEVEL_AT
                  if r in retentions},
        "every_efficient": {r: not behind for r, behind in ahead_of_default.items()},
    }
    return {"benchmark": ((ablation.get("judge") or {}).get("benchmark") or {}).get("name"),
            "judge": judge_of(ablation),
            "retentions": retentions, "chosen": chosen, "default": default, "worse": worse,
            "incumbent": incumbent, "controls": controls, "arms": arms,
            "vs_incumbent": vs_incumbent, "means": means, "vs_controls": vs_controls,
            "stronger": stronger,
            "others": {m: {r: float(np.mean(v)) for r, v in by_r.items()}
                       for m, by_r in others.items()},
            "targets": targets, "ahead_of_default": ahead_of_default}


def pct(values) -> str:
    return ", ".join(f"{r:.0%}" for r in values) or "none"


def report(ablation: dict, decision: dict, sweep: dict | None) -> str:
    rs, chosen, default = decision["retentions"], decision["chosen"], decision["default"]
    head = "| " + " | ".join(f"{r:.0%}" for r in rs) + " |"
    rule = "|---|" + "---|" * len(rs)
    full = (ablation.get("full") or {}).get("C_av")
    lines = [f"Deciding benchmark `{ablation['judge']['benchmark']['name']}`, test split, "
             f"{ablation['clips']} clips; judge: benchmark sha256 "
             f"`{judge_of(ablation)[0][:16]}`, captioner sha256 `{judge_of(ablation)[1][:16]}`."
             + (f" Full tokens: {full:.1f}." if isinstance(full, (int, float)) else ""), "",
             "C_av (CIDEr points), mean over training seeds:", "", "| method " + head,
             rule]
    incumbent = decision["incumbent"]
    for name in decision["arms"]:
        lines.append(f"| {name} | " + " | ".join(f"{decision['means'][(name, r)]:.1f}"
                                                 for r in rs) + " |")
    for method, by_r in decision["others"].items():
        mark = " (privileged reference)" if METHODS[method].privileged \
            and "privileged" not in METHODS[method].label else ""
        lines.append(f"| {METHODS[method].label}{mark} | "
                     + " | ".join(f"{by_r[r]:.1f}" if r in by_r else "–" for r in rs) + " |")
    if chosen == incumbent:   # a round that only reads the targets (round 7)
        lines += ["", f"Nothing is chosen in this round: **{default} is the default.**"]
    else:
        lines += ["", f"{chosen} − {incumbent}, paired 95% interval (clips and training seeds "
                  "resampled together):", "", "| " + head, rule,
                  f"| {chosen} − {incumbent} | "
                  + " | ".join(decision["vs_incumbent"][r].text() for r in rs) + " |", ""]
        if decision["worse"]:
            lines.append(f"{chosen} is worse than {incumbent} at {pct(decision['worse'])}: "
                         f"**{incumbent} stays the default.**")
        else:
            lines.append(f"{chosen} is worse than {incumbent} at no retention: **{default} "
                         "becomes the default.**")
    lines += ["", f"The default ({default}) − each CaCoVID-AV control:", "", "| control " + head,
              rule]
    for c in decision["controls"]:
        lines.append(f"| {c} | " + " | ".join(decision["vs_controls"][(c, r)].text()
                                              for r in rs) + " |")
    t = decision["targets"]
    lines += ["", "Issue #36's targets on the deciding benchmark, against the stronger control "
              "at each retention (" + ", ".join(f"{r:.0%}: {decision['stronger'][r]}"
                                                 for r in rs) + "):", "",
              f"- interval above 0 at {pct(SIGNIFICANT_AT)}: "
              + ", ".join(f"{r:.0%} {'met' if ok else 'not met'}"
                          for r, ok in t["significant"].items()),
              f"- mean at least 0 at {pct(LEVEL_AT)}: "
              + ", ".join(f"{r:.0%} {'met' if ok else 'not met'}" for r, ok in t["level"].items()),
              "- mean at least every efficient method's (Attention-AV excluded) at every "
              "retention: " + ", ".join(
                  f"{r:.0%} met" if ok else
                  f"{r:.0%} not met ({', '.join(decision['ahead_of_default'][r])} above)"
                  for r, ok in t["every_efficient"].items())
              + ("" if sweep is not None else
                 f" (no --sweep: against {', '.join(decision['controls'])} only)"),
              "", f"The rule: {RULE}."]
    return "\n".join(lines)


def as_json(decision: dict) -> dict:
    def interval(i: Interval) -> dict:
        return i.as_dict()
    return {"benchmark": decision["benchmark"], "judge": list(decision["judge"]),
            "chosen": decision["chosen"], "default": decision["default"],
            "incumbent": decision["incumbent"], "controls": list(decision["controls"]),
            "retentions": decision["retentions"], "worse_than_incumbent_at": decision["worse"],
            "chosen_minus_incumbent": {f"{r:g}": interval(i)
                                       for r, i in decision["vs_incumbent"].items()},
            "means": {f"{n}@{r:g}": m for (n, r), m in decision["means"].items()},
            "default_minus_control": {f"{c}@{r:g}": interval(i)
                                      for (c, r), i in decision["vs_controls"].items()},
            "stronger_control": {f"{r:g}": c for r, c in decision["stronger"].items()},
            "others": {m: {f"{r:g}": v for r, v in by_r.items()}
                       for m, by_r in decision["others"].items()},
            "targets": {k: {f"{r:g}": ok for r, ok in v.items()}
                        for k, v in decision["targets"].items()},
            "ahead_of_default": {f"{r:g}": v for r, v in decision["ahead_of_default"].items()}}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chosen", required=True, help="stage 1's choice (an ablation arm)")
    parser.add_argument("--ablation", required=True,
                        help="ablation.json of the deciding benchmark's test split")
    parser.add_argument("--sweep", default=None,
                        help="sweep.json of the same test split (the other methods)")
    parser.add_argument("--incumbent", default="A",
                        help="the default the choice must not be worse than (default A)")
    parser.add_argument("--controls", default=",".join(CONTROLS),
                        help="CaCoVID-AV arms the default is read against (default %(default)s)")
    parser.add_argument("--with", dest="others", action="append", default=[],
                        help="another ablation.json of the same judge and clips whose arms "
                             "--ablation lacks (e.g. score_merging.py's merged arm); repeatable")
    parser.add_argument("--json", default=None, help="also write the numbers here")
    args = parser.parse_args(argv)
    try:
        ablation = load(args.ablation, "ablation")
        for other in args.others:
            ablation = with_arms_of(ablation, load(other, "ablation"), other)
        sweep = None if args.sweep is None else load(args.sweep, "sweep")
        decision = decide(ablation, args.chosen, sweep, incumbent=args.incumbent,
                          controls=[c for c in args.controls.split(",") if c])
    except (ValueError, OSError, KeyError) as err:
        parser.error(str(err))
    print(report(ablation, decision, sweep))
    if args.json:
        Path(args.json).write_text(json.dumps(as_json(decision), indent=1) + "\n")


if __name__ == "__main__":
    main()
