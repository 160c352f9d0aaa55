"""How well each warmup teacher's scores rank the AV tokens by their counterfactual CIDEr gain
(issue #36 item 6), and how well the cheaper fidelity gains agree with exact leave-one-out.

    python scripts/warmup_teacher_agreement.py --data BENCH --captioner CAPT --split val --clips 100

Per clip of the first ``--clips`` of ``--split``: the counterfactual CIDEr-D gain of every AV
token as the gates measure it (``avex.evaluate.gates.counterfactual_gains``: added to 3 random
base sets at 20%, x100, document frequencies from the split's AV references); the scores of
prompt attention, caption attention and the fidelity gain at each ``--gain-bases`` candidate
(RETENTION:SETS; 1:1 is exact leave-one-out from the full tokens). Prints per-clip Spearman
means (NaN clips left out) and each candidate's seconds per clip; ``--out`` writes the JSON.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from avex.cache_and_captioner import load_cache_and_captioner
from avex.evaluate.gates import counterfactual_gains, spearman
from avex.fidelity import full_captions
from avex.reward import CiderD
from avex.selection import AVLayout
from avex.training.warmup_teachers import caption_attention, fidelity_gains, gain_bases


def base_arg(text: str) -> tuple[float, int]:
    retention, sep, count = text.partition(":")
    try:
        return float(retention), int(count)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gain-bases must be RETENTION:SETS, got {text!r}")


def teacher_rows(captioner, clips, full, candidates, batch_size=4) -> tuple[dict, dict]:
    """name -> per clip float arrays [M], and name -> seconds per clip."""
    scores = {"prompt-attention": [], "caption-attention": []}
    scores.update({f"fidelity-gain@{r:g}x{n}": [] for r, n in candidates})
    seconds = dict.fromkeys(scores, 0.0)
    for start in range(0, len(clips), batch_size):
        chunk = clips[start:start + batch_size]
        batch = captioner.embed(chunk)
        targets = full.targets(chunk)
        counts = [c.n_visual + c.n_audio for c in chunk]
        began = time.perf_counter()
        scores["prompt-attention"] += [a.numpy() for a in captioner.text_to_av_attention(batch)]
        seconds["prompt-attention"] += time.perf_counter() - began
        began = time.perf_counter()
        scores["caption-attention"] += [a.numpy() for a in
                                        caption_attention(captioner, batch, targets)]
        seconds["caption-attention"] += time.perf_counter() - began
        for retention, count in candidates:
            name = f"fidelity-gain@{retention:g}x{count}"
            began = time.perf_counter()
            bases = gain_bases([c.clip_id for c in chunk], AVLayout.of(batch.modality),
                               retention, count)
            gains = fidelity_gains(captioner, batch, targets, bases)
            seconds[name] += time.perf_counter() - began
            scores[name] += [gains[b, :m].numpy() for b, m in enumerate(counts)]
    return scores, {k: v / len(clips) for k, v in seconds.items()}


def per_clip_mean(first, second) -> float:
    values = []
    for a, b in zip(first, second):
        ok = ~np.isnan(b)
        values.append(spearman(a[ok], b[ok]))
    finite = [v for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--captioner", required=True)
    parser.add_argument("--split", default="val")
    parser.add_argument("--clips", type=int, default=100)
    parser.add_argument("--gain-bases", type=base_arg, nargs="+", default=[(1.0, 1), (0.2, 3)])
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if args.clips < 1:
        parser.error(f"--clips must be >= 1, got {args.clips}")
    cache, captioner = load_cache_and_captioner(args.data, args.captioner, device="cpu")
    split = cache.split(args.split)
    clips = [split[i] for i in range(min(args.clips, len(split)))]
    full = full_captions(captioner, cache, args.split)
    scores, seconds = teacher_rows(captioner, clips, full, args.gain_bases)
    scorer = CiderD([split[i].refs_av for i in range(len(split))])
    began = time.perf_counter()
    cider = [counterfactual_gains(captioner, c, scorer, base_retention=0.2, base_sets=3, seed=0)
             for c in clips]
    cider_seconds = (time.perf_counter() - began) / len(clips)
    exact = scores.get("fidelity-gain@1x1")
    result = {"split": args.split, "clips": len(clips), "cider_gain_seconds_per_clip":
              cider_seconds, "teachers": {
                  name: {"spearman_with_cider_gain": per_clip_mean(values, cider),
                         "spearman_with_exact_loo": None if exact is None
                         else per_clip_mean(values, exact),
                         "seconds_per_clip": seconds[name]}
                  for name, values in scores.items()}}
    print(f"{len(clips)} clips of {args.split}; per-clip Spearman, mean")
    print("| teacher | with the CIDEr gain | with exact LOO | s per clip |")
    print("|---|---|---|---|")
    for name, row in result["teachers"].items():
        loo = row["spearman_with_exact_loo"]
        print(f"| {name} | {row['spearman_with_cider_gain']:.3f} | "
              f"{'' if loo is None else f'{loo:.3f}'} | {row['seconds_per_clip']:.3f} |")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1)
    return result


if __name__ == "__main__":
    main()
