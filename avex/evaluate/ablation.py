"""The paper's Table 3 at one retention: training-signal variants and the group size g."""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from avex.judge import judge_line, judge_record
from avex.methods import load_policy, make_selector
from avex.progress import progress_bar
from avex.scoring import caption_split, score_captions
from avex.tables import markdown_table
from avex.train import ensure_trained

from .common import base_train_config, fmt, load_assets, split_clips

#: Table 3's rows: name -> (label, V-V, A-A, V-A, A-V marks, TrainConfig settings). Every
#: exchange row turns the exchange term on (``lambda_ex`` 0.1 beside L_RL, as the recipe had it
#: before the default dropped it); "rloo" is the default recipe, L_RL alone.
ABLATIONS = {
    "warmup": ("Warmup only", "✗ ✗ ✗ ✗", {"warmup_only": True}),
    "rloo": ("L_RL alone, no exchanges (the default)", "✗ ✗ ✗ ✗", {"exchanges": False}),
    "random": ("Random exchange", "✗ ✗ mixed mixed",
               {"exchanges": True, "exchange_selection": "random",
                "exchange_types": ["va", "av"]}),
    "vv": ("V-to-V only", "✓ ✗ ✗ ✗", {"exchanges": True, "exchange_types": ["vv"]}),
    "aa": ("A-to-A only", "✗ ✓ ✗ ✗", {"exchanges": True, "exchange_types": ["aa"]}),
    "vv+aa": ("V-to-V + A-to-A", "✓ ✓ ✗ ✗", {"exchanges": True, "exchange_types": ["vv", "aa"]}),
    "no-aa": ("w/o A-to-A", "✓ ✗ ✓ ✓", {"exchanges": True, "exchange_types": ["vv", "va", "av"]}),
    "no-vv": ("w/o V-to-V", "✗ ✓ ✓ ✓", {"exchanges": True, "exchange_types": ["aa", "va", "av"]}),
    "full": ("Full AVEX (g = 8)", "✓ ✓ ✓ ✓", {"exchanges": True, "g": 8}),
    "g4": ("g = 4", "✓ ✓ ✓ ✓", {"exchanges": True, "g": 4}),
    "g16": ("g = 16", "✓ ✓ ✓ ✓", {"exchanges": True, "g": 16}),
    "g32": ("g = 32", "✓ ✓ ✓ ✓", {"exchanges": True, "g": 32}),
}


def run_ablation(args) -> dict:
    """Train (or reuse) every variant at ``args.retention`` for each of ``args.seeds`` and score
    it there on the test split; mean ± std over the seeds.

    Variants differ from the default ``python -m avex.train`` only by their flags in
    :data:`ABLATIONS` (plus ``--train-args``). The variants only change the RL phase, so each
    seed's warmup is trained once (the "warmup" row's run) and every other variant of that seed
    starts from it (``warmup_from``), as the sweep's CaCoVID-AV does. The random-exchange row
    draws G and G' at random (``--exchange-selection random``) for cross-modal exchanges, with
    the same g and number of reward evaluations per step."""
    started = time.perf_counter()
    out = Path(args.out) if args.out else Path("runs") / time.strftime("ablation-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    cache, captioner = load_assets(args)
    clips = split_clips(cache, args.split, args.max_clips)
    decode = dict(batch_size=args.batch_size, num_beams=args.num_beams,
                  max_new_tokens=args.max_new_tokens)
    base = base_train_config(args)
    rows = []
    jobs = [(seed, name) for seed in args.seeds for name in args.variants]
    warmups = {}
    for seed, name in progress_bar(jobs, desc="ablation variants", unit="run",
                                   disable=not args.progress):
        label, marks, settings = ABLATIONS[name]
        if seed not in warmups:
            warmups[seed] = args.run.get("warmup") or base.warmup_from or ensure_trained(
                dataclasses.replace(base, run_dir=str(out / "runs" / f"seed{seed}" / "warmup"),
                                    seed=seed, retention=args.retention,
                                    **ABLATIONS["warmup"][2]))
        run_dir = args.run.get(name)
        if run_dir is None and name == "warmup":
            run_dir = warmups[seed]
        elif run_dir is None:
            run_dir = ensure_trained(dataclasses.replace(
                base, run_dir=str(out / "runs" / f"seed{seed}" / name), seed=seed,
                retention=args.retention, warmup_from=str(warmups[seed]), **settings))
        policy = load_policy(run_dir, captioner,
                             checkpoint="warmup" if name == "warmup" else "latest")
        captions = caption_split(captioner, clips, make_selector("avex", policy=policy),
                                 args.retention, **decode)
        cfg = json.loads((Path(run_dir) / "config.json").read_text())
        rows.append({"variant": name, "label": label, "marks": marks, "run": str(run_dir),
                     "seed": cfg.get("seed"), "g": cfg.get("g"),
                     "exchange_types": cfg.get("exchange_types"),
                     **score_captions(captions, clips)})
    seconds = time.perf_counter() - started
    judge = judge_record(cache.root, captioner.path)
    table = ablation_table(rows, args.retention, args.split, len(clips), seconds)
    table = f"{table}\n\n{judge_line(judge)}"
    (out / "ablation.md").write_text(table + "\n")
    (out / "ablation.json").write_text(json.dumps({"rows": rows, "retention": args.retention,
                                                   "seeds": list(args.seeds), "judge": judge,
                                                   "seconds": round(seconds, 1)}, indent=1)
                                       + "\n")
    print(table)
    return {"rows": rows, "table": table, "out": str(out)}


def ablation_table(rows, retention, split, clip_count, seconds) -> str:
    """One line per variant: its C_av, C_v and C_a, mean ± std over the seeds it ran with."""
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    lines = []
    for name in variants:
        group = [r for r in rows if r["variant"] == name]
        label, marks, _ = ABLATIONS[name]
        seeds = ",".join(str(r["seed"]) for r in group)
        lines.append([label, *marks.split(), *(fmt([r[k] for r in group])
                                                for k in ("C_av", "C_v", "C_a")), seeds])
    return "\n".join([
        f"# Ablation at {retention:.0%} retention ({split} split, {clip_count} clips)", "",
        markdown_table(["variant", "V-V", "A-A", "V-A", "A-V", "C_av", "C_v", "C_a", "seeds"],
                       lines), "",
        "With several seeds: mean ± std (population std) over the training seeds. Every "
        "variant of a seed starts from that seed's warmup (the Warmup only row).", "",
        f"Took {seconds:.0f} s (training included)."])
