"""The exchange-search pilot's report (issue #36 item 4): arm S at three distillation weights
against arm A and the warmup, one training seed, benchmark 0's val split.

    python scripts/exchange_search_pilot.py --out results/exchange-search-pilot.md \
        EVAL_S_VS_A EVAL_S_DISTILL0.1 EVAL_S_DISTILL0

Reads each ``python -m avex.evaluate ablation`` output folder's ``ablation.json`` (the first
scores warmup, A and S; the others S alone, under another distillation weight read from the
run's config.json) and writes C_av per retention with A − each variant's paired bootstrap 95%
interval over the same 200 val clips (:func:`avex.intervals.differences`).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from avex.run_files import read_run_config
from avex.intervals import LEVEL, REPLICATES, differences
from avex.tables import markdown_table


#: how the runs and the evaluations were made
COMMANDS = [
    "python -m avex.train --warmup-from $RUNS/warmup --no-evaluate "
    "--exchange-search --search-rounds 2 --search-candidates 7 [--distill-weight W] "
    "--run-dir $RUNS/S[-distillW] --seed 0   (W = 1, the default; 0.1; 0)",
    "python -m avex.evaluate ablation --split val --variants warmup,A,S --run "
    "warmup=$RUNS/warmup --run A=$RUNS/A --run "
    "S=$RUNS/S --retentions 0.5,0.4,0.3,0.2,0.1 --out "
    "$RUNS/eval-val-S-vs-A",
    "python -m avex.evaluate ablation --split val --variants S --run "
    "warmup=$RUNS/warmup --run S=$RUNS/S-distillW --retentions "
    "0.5,0.4,0.3,0.2,0.1 --out $RUNS/eval-val-S-distillW   (W = 0.1, 0)",
    "python scripts/exchange_search_pilot.py --out results/exchange-search-pilot.md "
    "$RUNS/eval-val-S-vs-A $RUNS/eval-val-S-distill0.1 "
    "$RUNS/eval-val-S-distill0",
]


def rows_of(folder: Path) -> tuple[list[dict], dict]:
    data = json.loads((folder / "ablation.json").read_text())
    rows = []
    for row in data["rows"]:
        if row["variant"] == "S":
            weight = read_run_config(folder / row["run"])["distill_weight"]
            row = {**row, "variant": f"S (distill_weight {weight:g})"}
        rows.append(row)
    return rows, data


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    rows, first = [], None
    for folder in args.folders:
        got, data = rows_of(folder)
        first = first or data
        if data["full"]["C_av"] != first["full"]["C_av"] or data["clips"] != first["clips"]:
            raise ValueError(f"{folder}: scored other clips than {args.folders[0]}")
        rows += got
    retentions = first["retentions"]
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    cells = {(r["variant"], r["retention"]): r["C_av"] for r in rows}
    table = markdown_table(["variant", *(f"{r:.0%}" for r in retentions)],
                           [[v, *(f"{cells[(v, r)]:.1f}" for r in retentions)]
                            for v in variants])
    others = [v for v in variants if v != "A"]
    spans = differences(rows, "A", others, retentions, "C_av", key="variant")
    diff = markdown_table(["A − variant", *(f"{r:.0%}" for r in retentions)],
                          [[v, *(f"{spans[(v, r)].difference:+.1f} [{spans[(v, r)].low:+.1f}, "
                                 f"{spans[(v, r)].high:+.1f}]" for r in retentions)]
                           for v in others])
    report = "\n".join([
        "# Exchange search + distillation: one-seed pilot (issue #36 item 4)", "",
        f"C_av (CIDEr points) on the {first['split']} split of benchmark 0 "
        f"({first['clips']} clips), training seed 0, every run from the same warmup "
        f"(`$RUNS/warmup`). Full tokens: {first['full']['C_av']:.1f}. Judge: "
        f"benchmark sha256 `{first['judge']['benchmark']['sha256'][:16]}`, captioner sha256 "
        f"`{first['judge']['captioner']['sha256'][:16]}`.",
        "", table, "",
        f"A − variant, paired bootstrap {LEVEL:.0%} interval ({REPLICATES} replicates over "
        "the clips; one training seed, so seed variation is not in it):", "", diff, "",
        "Arm A (`$RUNS/A`): the default recipe (arm A's settings) from the same warmup. "
        "Made with ($AVEX_CACHE: the cache of benchmark 0 and its captioner; $RUNS: a folder holding its seed-0 warmup and arm A runs; OMP_NUM_THREADS=1, the project's 2-core AMD "
        "EPYC CPU; avex/ at commit fe49fc3, unchanged through 5173f82):", "",
        *(f"    {c}" for c in COMMANDS), ""])
    args.out.write_text(report, encoding="utf-8")
    print(report)


if __name__ == "__main__":
    main()
