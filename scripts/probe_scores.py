"""Score statistics of trained policies at one retention, on a split of the embedded benchmark.

    python scripts/probe_scores.py NAME=RUN_DIR[:warmup] ... [--retention 0.2] [--out FILE]

Per clip: the within-modality spread of the policy's scores (visual and audio std), the offset
between the modalities (mean audio score minus mean visual score, also in visual stds), the
audio tokens in the Top-K; then C_av, C_v and C_a of the policy's selection. Means over the
clips. docs/results.md ("V-to-V only") quotes its output.
"""
from __future__ import annotations

import argparse
import json

import torch

from avex.cache_and_captioner import load_cache_and_captioner, resolve_asset_paths
from avex.methods import load_policy, make_selector
from avex.modality import AUDIO, VISUAL
from avex.scoring import caption_split, score_captions
from avex.selection import AVLayout


def clip_statistics(policy, captioner, clips, retention, batch_size=50) -> list[dict]:
    rows = []
    with torch.no_grad():
        for start in range(0, len(clips), batch_size):
            batch = captioner.embed(clips[start:start + batch_size])
            layout = AVLayout.of(batch.modality)
            scores = layout.gather(policy(batch.inputs_embeds, batch.modality))
            budget = layout.budget(retention)
            for row in range(scores.shape[0]):
                codes = layout.modality[row]
                visual, audio = scores[row][codes == VISUAL], scores[row][codes == AUDIO]
                top = scores[row].topk(int(budget[row])).indices
                offset = float(audio.mean() - visual.mean())
                rows.append(dict(visual_std=float(visual.std()), audio_std=float(audio.std()),
                                 offset=offset, offset_in_visual_std=offset / float(visual.std()),
                                 audio_in_topk=int((codes[top] == AUDIO).sum()),
                                 k=int(budget[row])))
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="NAME=RUN_DIR[:warmup]")
    parser.add_argument("--retention", type=float, default=0.2)
    parser.add_argument("--split", default="test")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    data, captioner_dir = resolve_asset_paths("embedded", "embedded", progress=False)
    cache, captioner = load_cache_and_captioner(data, captioner_dir, device="cpu")
    split = cache.split(args.split)
    clips = [split[i] for i in range(len(split))]
    results = {}
    for spec in args.runs:
        name, _, where = spec.partition("=")
        run_dir, _, checkpoint = where.partition(":")
        policy = load_policy(run_dir, captioner, checkpoint=checkpoint or "latest")
        rows = clip_statistics(policy, captioner, clips, args.retention)
        means = {key: sum(r[key] for r in rows) / len(rows) for key in rows[0]}
        captions = caption_split(captioner, clips, make_selector("avex", policy=policy),
                                 args.retention)
        scores = score_captions(captions, clips)
        results[name] = dict(run=where, **{k: round(v, 4) for k, v in means.items()},
                             **{k: round(scores[k], 1) for k in ("C_av", "C_v", "C_a")})
        print(name, json.dumps(results[name]), flush=True)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
