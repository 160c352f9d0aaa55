"""``python -m avex.evaluate``: the paper's pruning comparison, motivation analysis and ablations.

Subcommands (``sweep`` is the default):

``sweep``       every method (Random, FastV-AV, ToMe-AV, FastAV, CaCoVID-AV, AVEX-Prune) at every
                retention (50/40/30/20/10%): C_av, C_v, C_a on the test split, CIDEr on the
                transfer split, and Rel. (the paper's Table 2) against the full-token numbers of
                the same run; a Markdown table, a JSON file, a PNG like the paper's Fig. 3 and
                qualitative captions at 40%. ``--seeds 0,1,2`` reports mean ± std.
``motivation``  the paper's Fig. 1: (a) counterfactual CIDEr gain against attention rank with the
                rank correlation, (b) joint gain of a visual + an audio group against the sum of
                their separate gains. A PNG and its numbers.
``ablation``    the paper's Table 3 at 20% retention: training-signal variants and group size g;
                it trains the variants it needs (``python -m avex.train``) or reuses given runs.

Rel. = 100 x 1/4 (C_av / C_av_full + C_v / C_v_full + C_a / C_a_full + C_T / C_T_full), C_T being
CIDEr (AV references) on the transfer split, which stands in for the paper's MSRVTT column; the
``_full`` values are the full-token numbers of the same run, same decoding.

Full-token captions are computed once per split and shared by every method and seed; methods
that do not depend on the seed (FastV-AV, ToMe-AV, FastAV, and a policy given as one run) are
captioned once and reported for every seed.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from avex import _checks
from avex.baselines import METHODS, make_selector
from avex.evaluation import caption_split, keep_all, score_captions

RETENTIONS = (0.5, 0.4, 0.3, 0.2, 0.1)
DEFAULT_METHODS = tuple(METHODS)
SEED_FREE = {"fastv", "tome", "fastav"}
POLICY_METHODS = {"avex": "avex_run", "cacovid": "cacovid_run"}


# ----------------------------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------------------------

def _float_list(name):
    def parse(text):
        try:
            values = [float(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be comma-separated numbers, "
                                             f"got {text!r}")
        for v in values:
            if not 0 < v <= 1:
                raise argparse.ArgumentTypeError(f"{name} must be in (0, 1], got {v:g}")
        if not values:
            raise argparse.ArgumentTypeError(f"{name} is empty")
        return values
    return parse


def _int_list(name):
    def parse(text):
        try:
            values = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be comma-separated integers, "
                                             f"got {text!r}")
        if not values:
            raise argparse.ArgumentTypeError(f"{name} is empty")
        return values
    return parse


#: Table 3's rows: name -> (label, V-V, A-A, V-A, A-V marks, python -m avex.train flags)
ABLATIONS = {
    "warmup": ("Warmup only", "✗ ✗ ✗ ✗", ["--warmup-only"]),
    "random": ("Random exchange", "✗ ✗ mixed mixed",
               ["--exchange-selection", "random", "--exchange-types", "va,av"]),
    "vv": ("V-to-V only", "✓ ✗ ✗ ✗", ["--exchange-types", "vv"]),
    "aa": ("A-to-A only", "✗ ✓ ✗ ✗", ["--exchange-types", "aa"]),
    "vv+aa": ("V-to-V + A-to-A", "✓ ✓ ✗ ✗", ["--exchange-types", "vv,aa"]),
    "no-aa": ("w/o A-to-A", "✓ ✗ ✓ ✓", ["--exchange-types", "vv,va,av"]),
    "no-vv": ("w/o V-to-V", "✗ ✓ ✓ ✓", ["--exchange-types", "aa,va,av"]),
    "full": ("Full AVEX (g = 8)", "✓ ✓ ✓ ✓", ["--g", "8"]),
    "g4": ("g = 4", "✓ ✓ ✓ ✓", ["--g", "4"]),
    "g16": ("g = 16", "✓ ✓ ✓ ✓", ["--g", "16"]),
    "g32": ("g = 32", "✓ ✓ ✓ ✓", ["--g", "32"]),
}


def _variants(text):
    names = [x.strip() for x in text.split(",") if x.strip()]
    for name in names:
        if name not in ABLATIONS:
            raise argparse.ArgumentTypeError(f"variants must be drawn from {list(ABLATIONS)}, "
                                             f"got {name!r}")
    if not names:
        raise argparse.ArgumentTypeError("variants is empty")
    return names


def _methods(text):
    names = [x.strip() for x in text.split(",") if x.strip()]
    for name in names:
        if name not in METHODS:
            raise argparse.ArgumentTypeError(f"methods must be drawn from {list(METHODS)}, "
                                             f"got {name!r}")
    if not names:
        raise argparse.ArgumentTypeError("methods is empty")
    return names


def _common(parser):
    parser.add_argument("--data", default="embedded",
                        help="'embedded' or the path of a feature cache (default: embedded)")
    parser.add_argument("--captioner", default="embedded",
                        help="'embedded' or a Hugging Face causal-LM directory")
    parser.add_argument("--benchmark-preset", default="default")
    parser.add_argument("--captioner-preset", default="default")
    parser.add_argument("--cache-dir", default=None, help="default: $AVEX_CACHE or ~/.cache/avex")
    parser.add_argument("--out", default=None, help="output directory (default: runs/eval-<time>)")
    parser.add_argument("--max-clips", type=int, default=None, help="first N clips of each split")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--num-beams", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--train-args", default="",
                        help="extra flags for python -m avex.train when a policy is trained "
                             "here, e.g. \"--epochs 1\"")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m avex.evaluate",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    sweep = sub.add_parser("sweep", help="the retention sweep of every method (Table 2, Fig. 3)")
    _common(sweep)
    sweep.add_argument("--methods", type=_methods, default=list(DEFAULT_METHODS))
    sweep.add_argument("--retentions", type=_float_list("retentions"), default=list(RETENTIONS))
    sweep.add_argument("--seeds", type=_int_list("seeds"), default=[0])
    sweep.add_argument("--split", default="test")
    sweep.add_argument("--transfer-split", default="transfer",
                       help="the split for the transfer CIDEr column ('none' to skip)")
    sweep.add_argument("--avex-run", default=None, help="a python -m avex.train run directory")
    sweep.add_argument("--cacovid-run", default=None,
                       help="a python -m avex.train --no-exchanges run directory")
    sweep.add_argument("--fastv-layer", type=int, default=None)
    sweep.add_argument("--qualitative", type=int, default=3, help="clips shown at 40%%")
    abl = sub.add_parser("ablation", help="the paper's Table 3 (training signal, group size)")
    _common(abl)
    abl.add_argument("--variants", type=_variants, default=list(ABLATIONS))
    abl.add_argument("--retention", type=float, default=0.2,
                     help="training and evaluation retention (default 0.2)")
    abl.add_argument("--seed", type=int, default=0)
    abl.add_argument("--split", default="test")
    abl.add_argument("--run", action="append", default=[], metavar="VARIANT=DIR",
                     help="reuse a trained run for a variant (repeatable), e.g. full=runs/x")
    mot = sub.add_parser("motivation", help="the paper's Fig. 1")
    _common(mot)
    mot.add_argument("--split", default="test")
    mot.add_argument("--clips", type=int, default=40)
    mot.add_argument("--base-retention", type=float, default=0.2)
    mot.add_argument("--base-sets", type=int, default=3)
    mot.add_argument("--group", type=int, default=2)
    mot.add_argument("--seed", type=int, default=0)
    return parser


def parse_args(argv):
    argv = list(argv)
    if not argv or argv[0] not in ("sweep", "motivation", "ablation", "-h", "--help"):
        argv = ["sweep"] + argv
    args = build_parser().parse_args(argv)
    _checks.int_at_least("batch_size", args.batch_size, 1)
    _checks.int_at_least("num_beams", args.num_beams, 1)
    _checks.int_at_least("max_new_tokens", args.max_new_tokens, 1)
    if args.max_clips is not None:
        _checks.int_at_least("max_clips", args.max_clips, 1)
    for name in ("avex_run", "cacovid_run"):
        path = getattr(args, name, None)
        if path is not None and not Path(path).is_dir():
            raise FileNotFoundError(f"--{name.replace('_', '-')}: no run directory at {path!r}")
    if args.data != "embedded" and not Path(args.data).exists():
        raise FileNotFoundError(f"--data: no feature cache at {args.data!r}")
    if args.captioner != "embedded" and not Path(args.captioner).exists():
        raise FileNotFoundError(f"--captioner: no model directory at {args.captioner!r}")
    if args.command == "ablation":
        _checks.ratio("retention", args.retention)
        runs = {}
        for item in args.run:
            name, sep, path = item.partition("=")
            if not sep or name not in ABLATIONS:
                raise ValueError(f"--run must be VARIANT=DIR with VARIANT one of "
                                 f"{list(ABLATIONS)}, got {item!r}")
            if not Path(path).is_dir():
                raise FileNotFoundError(f"--run {name}: no run directory at {path!r}")
            runs[name] = Path(path)
        args.run = runs
    if args.command == "motivation":
        _checks.ratio("base_retention", args.base_retention)
        _checks.int_at_least("clips", args.clips, 1)
    return args


# ----------------------------------------------------------------------------------------------
# Assets
# ----------------------------------------------------------------------------------------------

def load_assets(args):
    from avex.captioner import FrozenCaptioner
    from avex.captioner.train import resolve_asset_paths
    from avex.data import FeatureCache

    data_path, captioner_path = resolve_asset_paths(
        args.data, args.captioner, benchmark_preset=args.benchmark_preset,
        captioner_preset=args.captioner_preset, cache_dir=args.cache_dir,
        progress=args.progress)
    device = None if args.device == "auto" else args.device
    return FeatureCache(data_path), FrozenCaptioner.load(captioner_path, device=device)


def split_clips(cache, split: str, max_clips):
    if split not in {r["split"] for r in cache.rows}:
        raise ValueError(f"split {split!r} is not in the cache (has "
                         f"{sorted({r['split'] for r in cache.rows})})")
    clips = cache.split(split)
    n = len(clips) if max_clips is None else min(len(clips), max_clips)
    return [clips[i] for i in range(n)]


def train_args(args, run_dir, seed: int, *extra) -> list[str]:
    argv = ["--run-dir", str(run_dir), "--seed", str(seed), "--no-evaluate",
            "--data", args.data, "--captioner", args.captioner,
            "--benchmark-preset", args.benchmark_preset,
            "--captioner-preset", args.captioner_preset]
    if args.cache_dir:
        argv += ["--cache-dir", str(args.cache_dir)]
    if not args.progress:
        argv.append("--no-progress")
    return argv + args.train_args.split() + list(extra)


def ensure_trained(argv: list[str], run_dir: Path) -> Path:
    """Train with ``python -m avex.train`` unless ``run_dir`` already holds a finished run
    (then it is reused; an unfinished one is resumed)."""
    from avex.checkpoint import latest_checkpoint
    from avex.train import main as train_main

    latest = latest_checkpoint(run_dir) if run_dir.exists() else None
    if latest is not None:
        state = torch.load(latest / "state.pt", weights_only=False)
        if state.get("phase") == "done":
            return run_dir
        argv = argv + ["--resume"]
    train_main(argv)
    return run_dir


def policy_for(args, method: str, seed: int, captioner, out: Path):
    """(policy, run_dir, seed_of_run) for AVEX-Prune or CaCoVID-AV."""
    from avex.baselines import load_policy

    given = getattr(args, POLICY_METHODS[method])
    if given is not None:
        run_dir = Path(given)
    else:
        extra = ["--no-exchanges"] if method == "cacovid" else []
        run_dir = ensure_trained(train_args(args, out / "runs" / f"{method}-seed{seed}", seed,
                                            *extra), out / "runs" / f"{method}-seed{seed}")
    run_seed = json.loads((run_dir / "config.json").read_text()).get("seed")
    return load_policy(run_dir, captioner), run_dir, run_seed


# ----------------------------------------------------------------------------------------------
# Rel. and tables
# ----------------------------------------------------------------------------------------------

def relative_performance(row: dict, full: dict) -> float:
    """The paper's Rel.: 100 x the mean of C_av, C_v, C_a and transfer CIDEr, each divided by
    its full-token value (``full``). Without a transfer column, the mean of the other three."""
    keys = ["C_av", "C_v", "C_a"] + (["C_T"] if "C_T" in row and "C_T" in full else [])
    ratios = [row[k] / full[k] if full[k] else float("nan") for k in keys]
    return 100.0 * sum(ratios) / len(ratios)


def _fmt(values, digits=1):
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{np.mean(values):.{digits}f} ± {np.std(values):.{digits}f}"


def _percent(share) -> str:
    return "n/a" if share is None else f"{100 * share:.0f}%"


def aggregate(rows: list[dict]) -> list[dict]:
    """Rows of several seeds -> one row per (method, retention) with mean, std and seeds."""
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["method"], r["retention"]), []).append(r)
    out = []
    for (method, retention), group in groups.items():
        agg = {"method": method, "label": group[0]["label"], "retention": retention,
               "seeds": [g["seed"] for g in group]}
        for key in ("C_av", "C_v", "C_a", "C_T", "Rel", "BLEU-4", "METEOR"):
            values = [g[key] for g in group if g.get(key) is not None]
            if values:
                agg[key] = float(np.mean(values))
                agg[key + "_std"] = float(np.std(values))
                agg[key + "_values"] = values
        out.append(agg)
    return out


def sweep_table(agg: list[dict], has_transfer: bool) -> str:
    head = "| method | retention | C_av | C_v | C_a |" + (" transfer C |" if has_transfer else "") \
        + " Rel. | seeds |"
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    last = None
    for r in agg:
        if last is not None and r["retention"] != last:
            lines.append("| | | | | |" + (" |" if has_transfer else "") + " | |")
        last = r["retention"]
        cells = [r["label"], f"{r['retention']:.0%}"]
        for key in ("C_av", "C_v", "C_a") + (("C_T",) if has_transfer else ()):
            cells.append(_fmt(r.get(key + "_values", [])))
        cells.append(_fmt(r.get("Rel_values", [])))
        seeds = sorted({s for s in r["seeds"] if s is not None})
        cells.append(",".join(map(str, seeds)) if seeds else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sweep_figure(agg: list[dict], path: Path, bar_retention: float) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    methods = [m for m in dict.fromkeys(r["method"] for r in agg) if m != "full"]
    palette = plt.get_cmap("tab10").colors
    colour = {"full": "gray", **{m: palette[i % 10] for i, m in enumerate(METHODS)}}
    labels = {r["method"]: r["label"] for r in agg}
    for m in methods:
        pts = sorted((r["retention"], r["Rel"], r.get("Rel_std", 0.0)) for r in agg
                     if r["method"] == m)
        xs = [100 * p[0] for p in pts]
        left.errorbar(xs, [p[1] for p in pts], yerr=[p[2] for p in pts], marker="o",
                      capsize=3, label=labels[m], color=colour[m])
    left.axhline(100, color="gray", linestyle="--", linewidth=1, label="Full tokens")
    left.set_xlabel("retention ratio (%)")
    left.set_ylabel("Rel. (% of full tokens)")
    left.set_title("Relative performance")
    left.invert_xaxis()
    left.legend(fontsize=8)
    at = [r for r in agg if abs(r["retention"] - bar_retention) < 1e-9 or r["method"] == "full"]
    keys = ("C_av", "C_v", "C_a")
    width = 0.8 / max(1, len(at))
    for i, r in enumerate(at):
        xs = np.arange(len(keys)) + (i - (len(at) - 1) / 2) * width
        right.bar(xs, [r[k] for k in keys], width, yerr=[r.get(k + "_std", 0.0) for k in keys],
                  label=r["label"], capsize=2, color=colour[r["method"]])
    right.set_xticks(np.arange(len(keys)), ["$C_{av}$", "$C_v$", "$C_a$"])
    right.set_ylabel("CIDEr")
    right.set_title(f"Test split at {bar_retention:.0%} retention")
    right.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------------
# The sweep
# ----------------------------------------------------------------------------------------------

def run_sweep(args) -> dict:
    started = time.perf_counter()
    out = Path(args.out) if args.out else Path("runs") / time.strftime("eval-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    cache, captioner = load_assets(args)
    test = split_clips(cache, args.split, args.max_clips)
    transfer = [] if args.transfer_split == "none" else \
        split_clips(cache, args.transfer_split, args.max_clips)
    decode = dict(batch_size=args.batch_size, num_beams=args.num_beams,
                  max_new_tokens=args.max_new_tokens)
    splits = {"test": test, **({"transfer": transfer} if transfer else {})}

    # policies first (training, if any, has its own progress bars)
    policies: dict = {}
    for method in args.methods:
        if method not in POLICY_METHODS:
            continue
        if getattr(args, POLICY_METHODS[method]) is not None:  # one given run for every seed
            one = policy_for(args, method, args.seeds[0], captioner, out)
            policies[method] = {seed: one for seed in args.seeds}
        else:  # one training run per seed
            policies[method] = {seed: policy_for(args, method, seed, captioner, out)
                                for seed in args.seeds}

    jobs = [(m, s, r) for s in args.seeds for m in args.methods for r in args.retentions]
    bar = tqdm(total=len(splits) * (1 + len(jobs)), desc="sweep", unit="setting",
               disable=not args.progress)
    captions: dict = {}
    scores: dict = {}

    def score(split, caps):
        clips = splits[split]
        s = score_captions(caps, clips)
        return s if split == "test" else {"C_T": s["C_av"]}

    for split, clips in splits.items():
        caps = caption_split(captioner, clips, keep_all, 1.0, **decode)
        captions[(split, "full", None, 1.0)] = caps
        scores[(split, "full", None, 1.0)] = score(split, caps)
        bar.update(1)
    cached: dict = {}
    for method, seed, retention in jobs:
        for split in splits:
            bar.set_postfix(method=method, retention=f"{retention:.0%}", split=split)
            shared = method in SEED_FREE or (method in POLICY_METHODS and
                                             getattr(args, POLICY_METHODS[method]) is not None)
            key = (split, method, None if shared else seed, retention)
            if key not in cached:
                if method in POLICY_METHODS:
                    selector = make_selector(method, policy=policies[method][seed][0])
                else:
                    options = {"layer": args.fastv_layer} if method == "fastv" else {}
                    selector = make_selector(method, captioner=captioner, seed=seed, **options)
                caps = caption_split(captioner, splits[split], selector, retention, **decode)
                cached[key] = (caps, score(split, caps))
            captions[(split, method, seed, retention)] = cached[key][0]
            scores[(split, method, seed, retention)] = cached[key][1]
            bar.update(1)
    bar.close()

    full = dict(scores[("test", "full", None, 1.0)])
    if transfer:
        full.update(scores[("transfer", "full", None, 1.0)])
    rows = [{"method": "full", "label": "Full tokens", "retention": 1.0, "seed": None,
             **full, "Rel": 100.0}]
    for method, seed, retention in jobs:
        row = {"method": method, "label": METHODS[method][0], "retention": retention,
               "seed": seed, **scores[("test", method, seed, retention)]}
        if transfer:
            row.update(scores[("transfer", method, seed, retention)])
        if method in POLICY_METHODS:
            _, run_dir, run_seed = policies[method][seed]
            row["run"], row["seed"] = str(run_dir), run_seed
        row["Rel"] = relative_performance(row, full)
        rows.append(row)
    order = {m: i for i, m in enumerate(["full"] + list(args.methods))}
    agg = sorted(aggregate(rows), key=lambda r: (-r["retention"], order[r["method"]]))

    bar_retention = min(args.retentions, key=lambda r: abs(r - 0.4))
    qualitative = []
    first_seed = args.seeds[0]
    for i, clip in enumerate(test[:args.qualitative]):
        entry = {"clip_id": clip.clip_id, "reference": clip.refs_av[0],
                 "full": captions[("test", "full", None, 1.0)][i]}
        for method in args.methods:
            entry[method] = captions[("test", method, first_seed, bar_retention)][i]
        qualitative.append(entry)

    seconds = time.perf_counter() - started
    result = {"rows": rows, "aggregate": agg, "qualitative": qualitative,
              "settings": {"methods": list(args.methods), "retentions": list(args.retentions),
                           "seeds": list(args.seeds), "test_clips": len(test),
                           "transfer_clips": len(transfer), "num_beams": args.num_beams,
                           "max_new_tokens": args.max_new_tokens, "data": str(cache.root),
                           "captioner": str(captioner.path),
                           "runs": {m: {str(s): str(v[1]) for s, v in p.items()}
                                    for m, p in policies.items()}},
              "seconds": round(seconds, 1), "command": "python -m avex.evaluate " +
              " ".join(sys.argv[1:]) if sys.argv and "avex.evaluate" in sys.argv[0] else None}
    table = sweep_table(agg, bool(transfer))
    md = [f"# Pruning comparison ({args.split} split, {len(test)} clips"
          + (f"; transfer split, {len(transfer)} clips" if transfer else "") + ")", "",
          "CIDEr points (pycocoevalcap, x100). C_av / C_v / C_a: the same captions against the "
          "AV, visual-only and audio-only references. transfer C: CIDEr against the AV "
          "references of the transfer split (the paper's MSRVTT column). Rel. = 100 x mean of "
          "the four, each over its full-token value in this run. Seeds: Random's seed; for a "
          "policy, the seed of its training run; FastV/ToMe/FastAV are deterministic. With "
          "several seeds: mean ± std.", "", table, "",
          f"Figure: `sweep.png` (left: Rel. against retention; right: C_av, C_v, C_a at "
          f"{bar_retention:.0%}). The sweep took {seconds:.0f} s.", "",
          f"## Qualitative examples at {bar_retention:.0%} retention", ""]
    for q in qualitative:
        md.append(f"**{q['clip_id']}** (a reference: \"{q['reference']}\")")
        md.append("")
        md.append("| method | caption |")
        md.append("|---|---|")
        md.append(f"| Full tokens | {q['full']} |")
        for method in args.methods:
            md.append(f"| {METHODS[method][0]} | {q[method]} |")
        md.append("")
    (out / "sweep.md").write_text("\n".join(md) + "\n")
    (out / "sweep.json").write_text(json.dumps(result, indent=1, default=float) + "\n")
    sweep_figure(agg, out / "sweep.png", bar_retention)
    result["table"], result["out"] = table, str(out)
    print(table)
    print(f"wrote {out / 'sweep.md'}, {out / 'sweep.json'}, {out / 'sweep.png'} "
          f"({seconds:.0f} s)")
    return result

# ----------------------------------------------------------------------------------------------
# Motivation (Fig. 1), reusing avex.data.gates
# ----------------------------------------------------------------------------------------------

def run_motivation(args) -> dict:
    """Fig. 1 of the paper on ``args.clips`` clips of ``args.split``.

    (a) every AV token's counterfactual CIDEr-D gain (``gates.counterfactual_gains``: added to
    ``base_sets`` random base sets at ``base_retention``) against its rank by full-token
    text-to-AV attention within its clip (0 = most attended); Spearman per clip (mean) and
    pooled. (b) ``gates.non_additivity``: gain of a visual group, an audio group and both over a
    shared base set; the joint gain is plotted against the sum of the separate ones."""
    from avex.data import gates
    from avex.reward import CiderD

    started = time.perf_counter()
    out = Path(args.out) if args.out else Path("runs") / time.strftime("motivation-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    cache, captioner = load_assets(args)
    clips = split_clips(cache, args.split, args.max_clips)[:args.clips]
    scorer = CiderD([c.refs_av for c in clips])
    attention = captioner.text_to_av_attention(clips)
    ranks, gains, per_clip = [], [], []
    for clip, att in tqdm(list(zip(clips, attention)), desc="counterfactual gains", unit="clip",
                          disable=not args.progress):
        gain = gates.counterfactual_gains(captioner, clip, scorer,
                                          base_retention=args.base_retention,
                                          base_sets=args.base_sets, seed=args.seed,
                                          batch_size=args.batch_size * 4)
        att = att.numpy()
        rank = gates.rank_average(-att)  # 0 = most attended
        ok = ~np.isnan(gain)
        ranks.append(rank[ok])
        gains.append(gain[ok])
        per_clip.append(gates.spearman(att[ok], gain[ok]))
    rank_all, gain_all = np.concatenate(ranks), np.concatenate(gains)
    pairs = [gates.non_additivity(captioner, c, scorer, base_retention=args.base_retention,
                                  group=args.group, seed=args.seed)
             for c in tqdm(clips, desc="non-additivity", unit="clip", disable=not args.progress)]
    pairs = [p for p in pairs if p is not None]
    finite = [v for v in per_clip if np.isfinite(v)]
    numbers = {
        "clips": len(clips), "split": args.split, "seed": args.seed,
        "base_retention": args.base_retention, "base_sets": args.base_sets,
        "spearman_attention_gain_per_clip_mean": float(np.mean(finite)) if finite
        else float("nan"),  # NaN: every clip's gains were constant
        "spearman_attention_gain_pooled": gates.spearman(-rank_all, gain_all),
        "top_decile_attention_negligible_gain_share": float(
            (gain_all[rank_all < np.quantile(rank_all, 0.1)] < gates.NEGLIGIBLE_GAIN).mean()),
        "critical_tokens": int((gain_all >= gates.CRITICAL_GAIN).sum()),
        "critical_below_median_attention_share": float(
            (rank_all[gain_all >= gates.CRITICAL_GAIN] > np.median(rank_all)).mean())
        if (gain_all >= gates.CRITICAL_GAIN).any() else None,
        "non_additivity": gates._summarise_additivity(pairs, args.group),
        "pairs": pairs,
    }
    motivation_figure(rank_all, gain_all, numbers, pairs, out / "motivation.png")
    numbers["seconds"] = round(time.perf_counter() - started, 1)
    (out / "motivation.json").write_text(json.dumps(numbers, indent=1, default=float) + "\n")
    na = numbers["non_additivity"]
    lines = [f"# Motivation (Fig. 1): {len(clips)} {args.split} clips, seed {args.seed}", "",
             "| measure | value |", "|---|---|",
             f"| Spearman(attention, counterfactual gain), per clip mean | "
             f"{_fmt([numbers['spearman_attention_gain_per_clip_mean']], 3)} |",
             f"| Spearman, pooled over clips | "
             f"{_fmt([numbers['spearman_attention_gain_pooled']], 3)} |",
             f"| top-10% attention tokens with gain < {gates.NEGLIGIBLE_GAIN:g} | "
             f"{100 * numbers['top_decile_attention_negligible_gain_share']:.0f}% |",
             f"| critical tokens (gain >= {gates.CRITICAL_GAIN:g}) below median attention | "
             f"{_percent(numbers['critical_below_median_attention_share'])} "
             f"(of {numbers['critical_tokens']}) |"]
    for name, label in (("own_sound", "subject makes the sound"),
                        ("background_sound", "sound from elsewhere")):
        if name in na:
            r = na[name]
            lines.append(f"| non-additivity, {label} ({r['clips']} clips): gain V / A / both, "
                         f"mean deviation | {r['mean_gain_visual']:.1f} / "
                         f"{r['mean_gain_audio']:.1f} / {r['mean_gain_both']:.1f}, "
                         f"{r['mean_deviation']:+.1f} |")
    lines += ["", f"Figure: `motivation.png`. Took {numbers['seconds']:.0f} s."]
    (out / "motivation.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    numbers["out"] = str(out)
    return numbers


def motivation_figure(rank, gain, numbers, pairs, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    a.scatter(rank, gain, s=4, alpha=0.25, color="tab:blue")
    edges = np.linspace(0, rank.max() + 1, 11)
    centres, means = [], []
    for lo, hi in zip(edges[:-1], edges[1:]):
        sel = (rank >= lo) & (rank < hi)
        if sel.any():
            centres.append((lo + hi) / 2)
            means.append(gain[sel].mean())
    a.plot(centres, means, color="tab:red", marker="o", label="mean per rank bin")
    a.axhline(0, color="gray", linewidth=0.8)
    rho = numbers["spearman_attention_gain_per_clip_mean"]
    a.set_title(f"(a) gain vs attention rank (Spearman per clip {rho:.2f}, pooled "
                f"{numbers['spearman_attention_gain_pooled']:.2f})", fontsize=9)
    a.set_xlabel("attention rank within clip (0 = most attended)")
    a.set_ylabel("counterfactual CIDEr-D gain")
    a.legend(fontsize=8)
    for own, colour, label in ((True, "tab:orange", "subject makes the sound"),
                               (False, "tab:green", "sound from elsewhere")):
        chosen = [p for p in pairs if p["own"] == own]
        if chosen:
            b.scatter([p["d_v"] + p["d_a"] for p in chosen], [p["d_av"] for p in chosen], s=12,
                      alpha=0.7, color=colour, label=label)
    if pairs:
        values = [p["d_v"] + p["d_a"] for p in pairs] + [p["d_av"] for p in pairs]
        lo, hi = min(values), max(values)
        b.plot([lo, hi], [lo, hi], color="gray", linestyle="--", label="additive (y = x)")
    b.set_xlabel("gain(V group) + gain(A group)")
    b.set_ylabel("gain(V group + A group)")
    b.set_title("(b) non-additivity", fontsize=9)
    b.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------------
# Ablations (Table 3)
# ----------------------------------------------------------------------------------------------

def run_ablation(args) -> dict:
    """Train (or reuse) every variant at ``args.retention`` and score it there on the test
    split. Variants differ from the default ``python -m avex.train`` only by their flags in
    :data:`ABLATIONS` (plus ``--train-args``); every one uses the same seed, data and budget.
    The random-exchange row draws G and G' at random (``--exchange-selection random``) for
    cross-modal exchanges, with the same g and number of reward evaluations per step."""
    from avex.baselines import load_policy

    started = time.perf_counter()
    out = Path(args.out) if args.out else Path("runs") / time.strftime("ablation-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    cache, captioner = load_assets(args)
    clips = split_clips(cache, args.split, args.max_clips)
    decode = dict(batch_size=args.batch_size, num_beams=args.num_beams,
                  max_new_tokens=args.max_new_tokens)
    rows = []
    for name in tqdm(args.variants, desc="ablation variants", unit="variant",
                     disable=not args.progress):
        label, marks, flags = ABLATIONS[name]
        run_dir = args.run.get(name)
        if run_dir is None:
            run_dir = out / "runs" / name
            ensure_trained(train_args(args, run_dir, args.seed, "--retention",
                                      str(args.retention), *flags), run_dir)
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
             "clips)", "", "| variant | V-V | A-A | V-A | A-V | C_av | C_v | C_a | seed |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['label']} | " + " | ".join(r["marks"].split()) +
                     f" | {r['C_av']:.1f} | {r['C_v']:.1f} | {r['C_a']:.1f} | {r['seed']} |")
    lines += ["", f"Took {seconds:.0f} s (training included)."]
    table = "\n".join(lines)
    (out / "ablation.md").write_text(table + "\n")
    (out / "ablation.json").write_text(json.dumps({"rows": rows, "retention": args.retention,
                                                   "seconds": round(seconds, 1)}, indent=1)
                                       + "\n")
    print(table)
    return {"rows": rows, "table": table, "out": str(out)}


def main(argv=None) -> dict:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "motivation":
        return run_motivation(args)
    if args.command == "ablation":
        return run_ablation(args)
    return run_sweep(args)


if __name__ == "__main__":
    main()
