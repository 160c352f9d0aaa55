"""What RL adds to its warmup: each run's warmup policy against the finished run (issue #36).

    python scripts/score_warmups.py CMP/ablation.json --variant Dc-fid --out results/NAME

For every training seed of ``--variant`` in an ablation.json, the run's warmup policy (the
weights RL started from, ``warmup_policy.safetensors``) is captioned and scored on the file's
split, clips and retentions, served as the run serves its policy (its selection and
redundancy). NAME.md gives each retention's C_av of both and VARIANT − its warmup with the
paired 95% interval (clips and training seeds resampled together; docs/evaluation.md);
NAME.json keeps the per-clip scores. The benchmark and captioner are the file's judge, read
from ``--cache-dir`` (default ``$AVEX_CACHE``) and checked by sha256; the runs are the file's,
relative to its folder. The variant's scores are the file's, not re-scored; full tokens are
re-scored only to check that the clips, judge and decoding are the file's, clip for clip.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from avex.evaluate.ablation import scored
from avex.evaluate.common import results_json
from avex.evaluate.rescoring import rescoring
from avex.intervals import difference_table, differences, interval_fields
from avex.judge_identity import judge_line
from avex.methods import make_selector
from avex.policy.load import load_policy
from avex.scoring import caption_split
from avex.tables import markdown_table

WARMUP = "its warmup"


def seed_mean(rows, retention: float) -> float:
    """C_av at ``retention``, the mean over the rows (one per training seed)."""
    values = [r["C_av"] for r in rows if math.isclose(r["retention"], retention)]
    return sum(values) / len(values)


def score_warmups(ablation: Path, variant: str, cache_dir: Path | None, batch_size: int) -> dict:
    result = json.loads(ablation.read_text())
    rows = [r for r in result["rows"] if r["variant"] == variant]
    if not rows:
        raise ValueError(f"--variant: {ablation} has no {variant!r} rows (it has "
                         f"{sorted({r['variant'] for r in result['rows']})})")
    setup = rescoring(result, str(ablation), cache_dir, batch_size)
    captioner, clips, decode = setup.captioner, setup.clips, setup.decode
    warm = []
    for run in dict.fromkeys(r["run"] for r in rows):
        run_dir = ablation.parent / run
        policy = load_policy(run_dir, captioner, checkpoint="warmup")
        seed = json.loads((run_dir / "config.json").read_text())["seed"]
        for retention in result["retentions"]:
            captions = caption_split(captioner, clips, make_selector("avex", policy=policy),
                                     retention, **decode)
            warm.append({"variant": WARMUP, "run": run, "seed": seed, "retention": retention,
                         "selection": policy.config.selection,
                         "redundancy": policy.config.redundancy, **scored(captions, clips)})
    seconds = time.perf_counter() - setup.started
    found = differences(rows + warm, variant, [WARMUP], result["retentions"], key="variant")
    full = result["full"]["C_av"]
    table = markdown_table(
        ["policy", *(f"{r:.0%}" for r in result["retentions"])],
        [[name, *(f"{seed_mean(runs, r):.1f} ({seed_mean(runs, r) / full:.3f})"
                  for r in result["retentions"])]
         for name, runs in ((variant, rows), (WARMUP, warm))])
    seeds = sorted({r["seed"] for r in warm})
    text = "\n".join([
        f"{variant} against {WARMUP} (the weights its RL started from, served as {variant} "
        f"serves: {warm[0]['selection']}, redundancy {warm[0]['redundancy']:g}), "
        f"{result['split']} split, {len(clips)} clips, training seeds "
        f"{', '.join(map(str, seeds))}. C_av (C_av / full tokens' {full:.1f}), mean over seeds:",
        "", table, "",
        difference_table(found, variant, {WARMUP: "C_av, paired 95% interval"},
                         result["retentions"], others=WARMUP), "",
        f"Scoring the warmups (and full tokens, to check the file's decoding) took "
        f"{seconds:.0f} s.", "", judge_line(setup.judge)])
    return {"text": text, "json": {
        "variant": variant, "rows": warm, "split": result["split"], "clips": len(clips),
        "retentions": result["retentions"], "judge": setup.judge, "seconds": round(seconds, 1),
        "intervals": [{"ours": variant, "other": WARMUP, "retention": r,
                       **interval_fields(v)}
                      for (_, r), v in found.items()]}}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("ablation", type=Path, help="an ablation.json of python -m avex.evaluate")
    parser.add_argument("--variant", required=True, help="the variant whose runs' warmups to score")
    parser.add_argument("--out", type=Path, required=True, help="writes OUT.md and OUT.json")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="the avex cache the file's judge paths are relative to")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args(argv)
    got = score_warmups(args.ablation, args.variant, args.cache_dir, args.batch_size)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(got["text"] + "\n")
    args.out.with_suffix(".json").write_text(results_json(got["json"]))
    print(got["text"])


if __name__ == "__main__":
    main()
