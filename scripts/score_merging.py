"""Trained runs served with their dropped tokens merged, against the same runs unmerged.

    python scripts/score_merging.py CMP/ablation.json [MORE/ablation.json ...] \\
        --variant Dc-fid --thresholds 0.7,0.8,0.9 --out results/NAME

For every training seed of ``--variant`` in the ablation files (one file, or several whose
seeds differ: the same split, clips, judge and full-token captions), each run's finished
policy is served with ``merge_threshold`` T (avex/merging.py: each dropped AV token folded into
its most similar kept token of its modality from cosine T) and captioned and scored on the
files' split, clips and retentions. The unmerged scores are the files' own, not re-scored;
full tokens are re-scored only to check that the clips, judge and decoding are the files'.
NAME.md gives each threshold's C_av and its difference from the unmerged policy with the
paired 95% interval (clips and training seeds resampled together; docs/evaluation.md);
NAME.json keeps the per-clip scores in an ablation.json's layout (the merged arm's variant
named ``VARIANT+mergeT``), so ``scripts/choose_default_recipe.py`` and
``scripts/pooled_differences.py`` read it beside the files it was scored against.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from avex.evaluate.ablation import scored
from avex.evaluate.common import results_json
from avex.evaluate.rescoring import rescoring
from avex.intervals import difference_table, differences, interval_fields
from avex.judge_identity import judge_line
from avex.merging import check_merge_threshold
from avex.methods import make_selector
from avex.paths import relative_path
from avex.policy.load import load_policy
from avex.scoring import caption_split
from avex.tables import markdown_table

SAME = ("split", "clips", "retentions", "judge")


def merged_name(variant: str, threshold: float) -> str:
    """The merged arm's variant name in the output, e.g. ``Dc-fid+merge0.8``."""
    return f"{variant}+merge{threshold:g}"


def read_files(ablations: list[Path], variant: str) -> tuple[dict, list[dict]]:
    """(the first file, the variant's rows of every file with ``run`` made absolute), checked:
    one split, clip count, retention list, judge and full-token scores, and no seed twice."""
    first, rows = None, []
    for path in ablations:
        result = json.loads(Path(path).read_text())
        if first is None:
            first = result
        for key in SAME:
            if result[key] != first[key]:
                raise ValueError(f"{path}: its {key} differs from {ablations[0]}'s")
        if result["full"]["per_clip"] != first["full"]["per_clip"]:
            raise ValueError(f"{path}: its full-token scores differ from {ablations[0]}'s")
        found = [dict(r, run=str(Path(path).parent / r["run"])) for r in result["rows"]
                 if r["variant"] == variant]
        if not found:
            raise ValueError(f"--variant: {path} has no {variant!r} rows (it has "
                             f"{sorted({r['variant'] for r in result['rows']})})")
        rows += found
    seeds = [r["seed"] for r in rows if r["retention"] == first["retentions"][0]]
    if len(seeds) != len(set(seeds)):
        raise ValueError(f"training seed(s) {sorted(s for s in set(seeds) if seeds.count(s) > 1)}"
                         f" of {variant!r} appear in more than one file")
    return first, rows


def score_merging(ablations: list[Path], variant: str, thresholds: list[float],
                  cache_dir: Path | None, batch_size: int) -> dict:
    thresholds = [check_merge_threshold("--thresholds", t) for t in thresholds]
    if not thresholds:
        raise ValueError("--thresholds: give at least one cosine threshold in [-1, 1]")
    result, rows = read_files(ablations, variant)
    setup = rescoring(result, "the files", cache_dir, batch_size)
    captioner, clips, decode = setup.captioner, setup.clips, setup.decode
    merged = []
    for run in dict.fromkeys(r["run"] for r in rows):
        policy = load_policy(Path(run), captioner)
        if policy.config.merge_threshold is not None:
            raise ValueError(f"{run} already merges (merge_threshold "
                             f"{policy.config.merge_threshold:g}): its rows are not unmerged")
        seed = json.loads((Path(run) / "config.json").read_text())["seed"]
        for threshold in thresholds:
            policy.config = dataclasses.replace(policy.config, merge_threshold=threshold)
            for retention in result["retentions"]:
                captions = caption_split(captioner, clips, make_selector("avex", policy=policy),
                                         retention, **decode)
                merged.append({"variant": merged_name(variant, threshold),
                               "threshold": threshold,
                               "run": run, "seed": seed, "retention": retention,
                               **scored(captions, clips)})
    seconds = time.perf_counter() - setup.started
    return report(result, rows, merged, variant, thresholds, setup.judge, len(clips), seconds)


def report(result, rows, merged, variant, thresholds, judge, clip_count, seconds) -> dict:
    names = [merged_name(variant, t) for t in thresholds]
    retentions = result["retentions"]
    found = {}
    for name in names:   # each merged arm against the unmerged runs
        arm = [r for r in merged if r["variant"] == name]
        found.update({(name, r): v for (_, r), v in differences(
            arm + rows, name, [variant], retentions, key="variant").items()})
    full = result["full"]["C_av"]

    def mean(group, retention):
        values = [r["C_av"] for r in group if r["retention"] == retention]
        return sum(values) / len(values)
    groups = [(variant, rows)] + [(n, [r for r in merged if r["variant"] == n]) for n in names]
    table = markdown_table(["policy", *(f"{r:.0%}" for r in retentions)],
                           [[label, *(f"{mean(g, r):.1f} ({mean(g, r) / full:.3f})"
                                      for r in retentions)] for label, g in groups])
    seeds = sorted({r["seed"] for r in rows})
    text = "\n".join([
        f"{variant}'s runs served with their dropped tokens merged into the kept ones from "
        f"cosine T (avex/merging.py), against the same runs unmerged; {result['split']} split, "
        f"{clip_count} clips, training seeds {', '.join(map(str, seeds))}. C_av (C_av / full "
        f"tokens' {full:.1f}), mean over seeds:", "", table, "",
        difference_table(found, f"{variant}+mergeT", {n: f"T = {t:g}" for n, t in
                                                      zip(names, thresholds)},
                         retentions, others=variant), "",
        f"Scoring the merged policies (and full tokens, to check the files' decoding) took "
        f"{seconds:.0f} s.", "", judge_line(judge)])
    # the layout of an ablation.json, so that the pooling scripts read it beside the files'
    return {"text": text, "json": {
        "variant": variant, "thresholds": thresholds, "rows": merged, "split": result["split"],
        "clips": clip_count, "retentions": retentions, "full": result["full"],
        "judge": judge, "seconds": round(seconds, 1),
        "intervals": [{"ours": n, "other": variant, "retention": r, **interval_fields(v)}
                      for (n, r), v in found.items()]}}


def relative_runs(data: dict, folder: Path) -> dict:
    """``data`` with each row's run relative to ``folder``, where the file is written (as an
    ablation.json records them: docs/evaluation.md, "Paths in results files")."""
    rows = [dict(r, run=relative_path(r["run"], folder)) for r in data["rows"]]
    return {**data, "rows": rows, "paths": {
        "judge": "relative to the avex cache root ($AVEX_CACHE, or --cache-dir)",
        "run": "relative to the folder this file was written to"}}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ablations", type=Path, nargs="+",
                        help="ablation.json files of python -m avex.evaluate")
    parser.add_argument("--variant", required=True, help="the variant whose runs to serve merged")
    parser.add_argument("--thresholds", required=True,
                        help="comma-separated cosine thresholds, e.g. 0.7,0.8,0.9")
    parser.add_argument("--out", type=Path, required=True, help="writes OUT.md and OUT.json")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="the avex cache the files' judge paths are relative to")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args(argv)
    try:
        thresholds = [float(t) for t in args.thresholds.split(",") if t.strip()]
    except ValueError:
        parser.error(f"--thresholds must be comma-separated numbers, got {args.thresholds!r}")
    got = score_merging(args.ablations, args.variant, thresholds, args.cache_dir,
                        args.batch_size)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(got["text"] + "\n")
    args.out.with_suffix(".json").write_text(results_json(relative_runs(got["json"],
                                                                        args.out.parent)))
    print(got["text"])


if __name__ == "__main__":
    main()
