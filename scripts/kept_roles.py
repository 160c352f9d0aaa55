"""What a policy's kept sets hold, by the embedded benchmark's token roles (issue #36 item 5):
per retention, the mean number of kept tokens of each visual and audio role per clip, the share
of clips that keep at least one subject token, and the share of sound events (over the clips
that have them) with at least one kept token. Reads only the policy's scores, no captioning.

    python scripts/kept_roles.py --data $AVEX_CACHE/benchmarks/B --captioner $AVEX_CACHE/captioners/C \
        --split val --retentions 0.2,0.1 NAME=RUN_DIR [NAME=RUN_DIR ...]

Each policy keeps as it serves (``avex.methods.learned.policy_selector``: Top-K, or its greedy
set-aware picks). Prints Markdown.
"""
from __future__ import annotations

import argparse


from avex.cache_and_captioner import load_cache_and_captioner
from avex.data.embedded import AUDIO_ROLES, VISUAL_ROLES
from avex.methods import load_policy
from avex.methods.learned import policy_selector
from avex.selection import AVLayout
from avex.tables import markdown_table

BATCH = 64


def role_counts(policy, captioner, clips, retention: float) -> dict:
    """Mean kept tokens per role per clip, subject coverage and event coverage."""
    select = policy_selector(policy)
    totals = {f"v:{name}": 0.0 for name in VISUAL_ROLES} | {f"a:{name}": 0.0
                                                            for name in AUDIO_ROLES}
    with_subject, events, events_hit = 0, 0, 0
    for start in range(0, len(clips), BATCH):
        chunk = clips[start:start + BATCH]
        batch = captioner.embed(chunk)
        keep = select(batch, AVLayout.of(batch.modality), retention)
        for row, clip in enumerate(chunk):
            visual_role = clip.annotations["visual_role"]
            audio_role = clip.annotations["audio_role"]
            kept_v = keep[row, :clip.n_visual]
            kept_a = keep[row, clip.n_visual:clip.n_visual + clip.n_audio]
            for name, code in VISUAL_ROLES.items():
                totals[f"v:{name}"] += float((kept_v & (visual_role == code)).sum())
            for name, code in AUDIO_ROLES.items():
                totals[f"a:{name}"] += float((kept_a & (audio_role == code)).sum())
            with_subject += bool((kept_v & (visual_role == VISUAL_ROLES["subject"])).any())
            for event in clip.info.get("events", []):
                events += 1
                events_hit += bool(kept_a[int(event["start"]):int(event["start"]) + int(event["length"])].any())
    n = len(clips)
    return {**{k: v / n for k, v in totals.items()}, "subject kept": with_subject / n,
            "events kept": events_hit / max(events, 1)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--captioner", required=True)
    parser.add_argument("--split", default="val")
    parser.add_argument("--retentions", default="0.2,0.1")
    parser.add_argument("runs", nargs="+", help="NAME=RUN_DIR")
    args = parser.parse_args(argv)
    runs = [item.partition("=")[::2] for item in args.runs]
    for name, path in runs:
        if not name or not path:
            parser.error(f"runs must be NAME=RUN_DIR, got {name}={path}")
    retentions = [float(r) for r in args.retentions.split(",")]
    cache, captioner = load_cache_and_captioner(args.data, args.captioner, device="cpu")
    split = cache.split(args.split)
    clips = [split[i] for i in range(len(split))]
    columns = None
    lines = []
    for name, path in runs:
        policy = load_policy(path, captioner)
        for retention in retentions:
            counts = role_counts(policy, captioner, clips, retention)
            columns = columns or list(counts)
            lines.append([name, f"{retention:.0%}", *(f"{counts[c]:.2f}" for c in columns)])
    print(f"{args.split} split, {len(clips)} clips: kept tokens per clip by role (v: visual, "
          "a: audio), the share of clips keeping a subject token, the share of events with a "
          "kept token\n")
    print(markdown_table(["policy", "rho", *columns], lines))


if __name__ == "__main__":
    main()
