"""The paper's Table 3 at one retention: training-signal variants and the group size g."""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from avex.methods import load_policy, make_selector
from avex.progress import progress_bar
from avex.scoring import caption_split, score_captions
from avex.tables import markdown_table
from avex.train import ensure_trained

from .common import base_train_config, load_assets, split_clips

#: Table 3's rows: name -> (label, V-V, A-A, V-A, A-V marks, TrainConfig settings)
ABLATIONS = {
    "warmup": ("Warmup only", "✗ ✗ ✗ ✗", {"warmup_only": True}),
    "random": ("Random exchange", "✗ ✗ mixed mixed",
               {"exchange_selection": "random", "exchange_types": ["va", "av"]}),
    "vv": ("V-to-V only", "✓ ✗ ✗ ✗", {"exchange_types": ["vv"]}),
    "aa": ("A-to-A only", "✗ ✓ ✗ ✗", {"exchange_types": ["aa"]}),
    "vv+aa": ("V-to-V + A-to-A", "✓ ✓ ✗ ✗", {"exchange_types": ["vv", "aa"]}),
    "no-aa": ("w/o A-to-A", "✓ ✗ ✓ ✓", {"exchange_types": ["vv", "va", "av"]}),
    "no-vv": ("w/o V-to-V", "✗ ✓ ✓ ✓", {"exchange_types": ["aa", "va", "av"]}),
    "full": ("Full AVEX (g = 8)", "✓ ✓ ✓ ✓", {"g": 8}),
    "g4": ("g = 4", "✓ ✓ ✓ ✓", {"g": 4}),
    "g16": ("g = 16", "✓ ✓ ✓ ✓", {"g": 16}),
    "g32": ("g = 32", "✓ ✓ ✓ ✓", {"g": 32}),
}


def run_ablation(args) -> dict:
    """Train (or reuse) every variant at ``args.retention`` and score it there on the test
    split. Variants differ from the default ``python -m avex.train`` only by their flags in
    :data:`ABLATIONS` (plus ``--train-args``); every one uses the same seed, data and budget.
    The random-exchange row draws G and G' at random (``--exchange-selection random``) for
    cross-modal exchanges, with the same g and number of reward evaluations per step."""
    started = time.perf_counter()
    out = Path(args.out) if args.out else Path("runs") / time.strftime("ablation-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    cache, captioner = load_assets(args)
    clips = split_clips(cache, args.split, args.max_clips)
    decode = dict(batch_size=args.batch_size, num_beams=args.num_beams,
                  max_new_tokens=args.max_new_tokens)
    rows = []
    base = base_train_config(args)
    for name in progress_bar(args.variants, desc="ablation variants", unit="variant",
                             disable=not args.progress):
        label, marks, settings = ABLATIONS[name]
        run_dir = args.run.get(name)
        if run_dir is None:
            run_dir = ensure_trained(dataclasses.replace(
                base, run_dir=str(out / "runs" / name), seed=args.seed,
                retention=args.retention, **settings))
        policy = load_policy(run_dir, captioner)
        captions = caption_split(captioner, clips, make_selector("avex", policy=policy),
                                 args.retention, **decode)
        cfg = json.loads((Path(run_dir) / "config.json").read_text())
        rows.append({"variant": name, "label": label, "marks": marks, "run": str(run_dir),
                     "seed": cfg.get("seed"), "g": cfg.get("g"),
                     "exchange_types": cfg.get("exchange_types"),
                     **score_captions(captions, clips)})
    seconds = time.perf_counter() - started
    lines = [f"# Ablation at {args.retention:.0%} retention ({args.split} split, {len(clips)} "
             "clips)", "", markdown_table(
                 ["variant", "V-V", "A-A", "V-A", "A-V", "C_av", "C_v", "C_a", "seed"],
                 [[r["label"], *r["marks"].split(), f"{r['C_av']:.1f}", f"{r['C_v']:.1f}",
                   f"{r['C_a']:.1f}", r["seed"]] for r in rows]),
             "", f"Took {seconds:.0f} s (training included)."]
    table = "\n".join(lines)
    (out / "ablation.md").write_text(table + "\n")
    (out / "ablation.json").write_text(json.dumps({"rows": rows, "retention": args.retention,
                                                   "seconds": round(seconds, 1)}, indent=1)
                                       + "\n")
    print(table)
    return {"rows": rows, "table": table, "out": str(out)}


