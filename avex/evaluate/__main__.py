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
                it trains the variants it needs (``avex.train.train``) or reuses given runs.
``gates``       the embedded benchmark's measured gates (Markdown + JSON report).

Rel. = 100 x 1/4 (C_av / C_av_full + C_v / C_v_full + C_a / C_a_full + C_T / C_T_full), C_T being
CIDEr (AV references) on the transfer split, which stands in for the paper's MSRVTT column; the
``_full`` values are the full-token numbers of the same run, same decoding. The sweep prints
C_av / C_av_full beside it: on the embedded benchmark C_v rises under pruning, so Rel. is not
comparable with the paper's, and C_av / full is (docs/results.md).

Full-token captions are computed once per split and shared by every method and seed; methods
that do not depend on the seed (FastV-AV, ToMe-AV, FastAV, and a policy given as one run) are
captioned once and reported for every seed.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

from avex import _checks
from avex.checkpoint import check_weights
from avex.config import build_parser as build_train_parser
from avex.config import resolve_config
from avex.data.embedded import default_benchmark_path
from avex.methods.learned import check_finished, run_policy_weights
from avex.paths import default_captioner_path
from avex.registry import BENCHMARK_PRESETS, CAPTIONER_PRESETS, SELECTORS, SPLITS

from .ablation import ABLATIONS, run_ablation
from .gates import run_gates, write_report
from .motivation import run_motivation
from .sweep import RETENTIONS, run_sweep

DEFAULT_METHODS = SELECTORS
#: decoding when no run is given and no flag sets it
DECODING = {"num_beams": 1, "max_new_tokens": 24}


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


def _name_list(name, choices):
    def parse(text):
        names = [x.strip() for x in text.split(",") if x.strip()]
        for item in names:
            if item not in choices:
                raise argparse.ArgumentTypeError(f"{name} must be drawn from {list(choices)}, "
                                                 f"got {item!r}")
        if not names:
            raise argparse.ArgumentTypeError(f"{name} is empty")
        return names
    return parse


_variants = _name_list("variants", ABLATIONS)
_methods = _name_list("methods", SELECTORS)


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
    parser.add_argument("--num-beams", type=int, default=None,
                        help=f"default: a given run's (--avex-run, --cacovid-run), else "
                             f"{DECODING['num_beams']}")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help=f"default: a given run's, else {DECODING['max_new_tokens']}")
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
    sweep.add_argument("--avex-run", default=None,
                       help="a python -m avex.train run directory; with {seed} in it, one run "
                            "per --seeds (e.g. ABL/runs/seed{seed}/A)")
    sweep.add_argument("--cacovid-run", default=None,
                       help="a CaCoVID-AV run directory (or a pattern with {seed})")
    sweep.add_argument("--allow-unfinished", action="store_true",
                       help="score the latest checkpoint of a run that did not finish training "
                            "(the table names the checkpoint)")
    sweep.add_argument("--fastv-layer", type=int, default=None)
    sweep.add_argument("--qualitative", type=int, default=3, help="clips shown at 40%%")
    abl = sub.add_parser("ablation", help="the paper's Table 3 (training signal, group size)")
    _common(abl)
    abl.add_argument("--variants", type=_variants, default=list(ABLATIONS))
    abl.add_argument("--retention", type=float, default=0.2,
                     help="training and evaluation retention (default 0.2)")
    abl.add_argument("--retentions", type=_float_list("retentions"), default=None,
                     help="evaluate every variant at each of these (e.g. 0.5,0.4,0.3,0.2,0.1: "
                          "the matched-budget comparison's table); default: --retention")
    abl.add_argument("--seeds", type=_int_list("seeds"), default=[0],
                     help="training seeds, comma-separated: mean ± std over them")
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
    gates = sub.add_parser("gates", help="measure the embedded benchmark's gates")
    gates.add_argument("--benchmark", default=None, help="feature cache (default: the "
                       "embedded benchmark of --preset / --seed)")
    gates.add_argument("--preset", default="default", choices=sorted(BENCHMARK_PRESETS))
    gates.add_argument("--seed", type=int, default=0)
    gates.add_argument("--captioner", default=None, help="captioner directory (default: the "
                       "embedded captioner trained on the benchmark)")
    gates.add_argument("--captioner-preset", default="default")
    gates.add_argument("--cache-dir", default=None)
    gates.add_argument("--seeds", type=int, default=3, help="random-pruning seeds")
    gates.add_argument("--counterfactual-clips", type=int, default=100)
    gates.add_argument("--base-sets", type=int, default=3)
    gates.add_argument("--device", default=None)
    gates.add_argument("--out", default="results/embedded-benchmark-gates.md")
    gates.add_argument("--timing-note", default=None,
                       help="a measured build/train timing line to include in the report")
    gates.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)
    return parser


def run_gates_command(args, argv) -> int:
    bench = Path(args.benchmark) if args.benchmark else default_benchmark_path(
        args.preset, args.cache_dir, seed=args.seed)
    captioner = Path(args.captioner) if args.captioner else default_captioner_path(
        bench.name, args.captioner_preset, args.cache_dir)
    report = run_gates(bench, captioner, seeds=args.seeds,
                       counterfactual_clips=args.counterfactual_clips, base_sets=args.base_sets,
                       device=args.device, progress=args.progress)
    shown, skip = [], False  # the command as typed, minus the (long) timing note
    for arg in argv[1:]:
        if skip:
            skip = False
        elif arg == "--timing-note":
            skip = True
        elif not arg.startswith("--timing-note="):
            shown.append(shlex.quote(arg))
    command = "python -m avex.evaluate gates " + " ".join(shown)
    out = write_report(report, args.out, command.strip(), args.timing_note)
    share = report["gate_random_lowest_share"]
    print(f"full C_av {report['full']['C_av']:.1f}; random at the lowest retention keeps "
          f"{share * 100:.1f}% of it (gate: below 60%); Spearman(attention, gain) per clip "
          f"{report['phenomena']['attention_vs_gain']['spearman_per_clip_mean']:.3f}")
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0 if share < 0.6 else 1


def parse_args(argv):
    argv = list(argv)
    if not argv or argv[0] not in ("sweep", "motivation", "ablation", "gates", "-h", "--help"):
        argv = ["sweep"] + argv
    parser = build_parser()
    args = parser.parse_args(argv)
    try:  # every flag is checked before any captioning; a bad one is a usage error
        check_args(args)
    except (ValueError, TypeError, OSError) as err:
        parser.error(str(err))
    return args


def _split(name: str, value, *extra):
    return _checks.choice(name, value, set(SPLITS) | set(extra))


def _captioner_depth(args) -> int | None:
    """The captioner's layer count from its config.json, when it is already on disk."""
    path = Path(args.captioner) if args.captioner != "embedded" else default_captioner_path(
        default_benchmark_path(args.benchmark_preset, args.cache_dir).name,
        args.captioner_preset, args.cache_dir)
    try:
        return int(json.loads((path / "config.json").read_text())["num_hidden_layers"])
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not built yet, or not a plain config: checked once it is loaded


def _check_seeds(seeds) -> None:
    for seed in seeds:
        _checks.int_at_least("seeds", seed, 0)
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds has duplicates: {seeds}")


def _given_run(path, checkpoint: str, name: str) -> dict:
    """A run's settings, checked with a readable weights file (its header read, not the
    tensors) before --out is made or anything is trained."""
    weights, settings = run_policy_weights(path, checkpoint, name=name)
    try:
        check_weights(weights)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None
    return settings


def _not_a_cache(path) -> str:
    what = "a file" if Path(path).is_file() else "a directory without meta.json"
    return "" if not Path(path).exists() else f" ({what}; a feature cache is a directory " \
        "holding meta.json)"


def resolve_decoding(args, runs: dict) -> None:
    """Set ``args.num_beams`` / ``args.max_new_tokens``: a flag's value, else the given runs'
    own decoding (their reward and results table used it), else :data:`DECODING`. Runs that
    decode differently from each other are refused unless flags settle it.
    ``args.decoding_source`` says where the values came from (sweep.md states it)."""
    sources = {}
    for key in DECODING:
        if getattr(args, key) is not None:
            sources[key] = "flag"
            continue
        values = {flag: cfg.get(key, DECODING[key]) for flag, cfg in runs.items()}
        if len(set(values.values())) > 1:
            listed = ", ".join(f"{flag} has {key}={value}" for flag, value in values.items())
            raise ValueError(f"the runs decode differently ({listed}); pass --"
                             f"{key.replace('_', '-')} to score both with one setting")
        if values:
            setattr(args, key, next(iter(values.values())))
            sources[key] = "run " + " and ".join(values)
        else:
            setattr(args, key, DECODING[key])
            sources[key] = "default"
    args.decoding_source = sources


def check_args(args) -> None:
    """Check (and normalise ``--run``) the parsed flags of any subcommand."""
    if args.device is not None:
        _checks.available_device("device", args.device)
    if args.cache_dir is not None:  # a prebuilt cache may be read-only
        _checks.output_dir("cache_dir", args.cache_dir, writable=False)
    _checks.choice("captioner_preset", args.captioner_preset, set(CAPTIONER_PRESETS))
    if args.command == "gates":
        _checks.output_file("out", args.out)
        for name, low in (("seeds", 1), ("counterfactual_clips", 1), ("base_sets", 1)):
            _checks.int_at_least(name, getattr(args, name), low)
        _checks.int_at_least("seed", args.seed, 0)
        if args.benchmark is not None and not (Path(args.benchmark) / "meta.json").is_file():
            raise FileNotFoundError(f"--benchmark: no feature cache at {args.benchmark!r}"
                                    + _not_a_cache(args.benchmark))
        if args.captioner is not None and not Path(args.captioner).exists():
            raise FileNotFoundError(f"--captioner: no model directory at {args.captioner!r}")
        return
    _checks.choice("benchmark_preset", args.benchmark_preset, set(BENCHMARK_PRESETS))
    if args.out is not None:
        _checks.output_dir("out", args.out)
    _checks.int_at_least("batch_size", args.batch_size, 1)
    _checks.optional_int_at_least("num_beams", args.num_beams, 1)
    _checks.optional_int_at_least("max_new_tokens", args.max_new_tokens, 1)
    if args.max_clips is not None:
        _checks.int_at_least("max_clips", args.max_clips, 1)
    _split("split", args.split)
    runs = {}
    for name in ("avex_run", "cacovid_run"):
        path = getattr(args, name, None)
        if path is not None:  # a finished run, checked now, not after the other methods ran
            flag = "--" + name.replace("_", "-")
            for seed in getattr(args, "seeds", [0]) if "{seed}" in path else [None]:
                run = path if seed is None else path.replace("{seed}", str(seed))
                runs[flag if seed is None else f"{flag} (seed {seed})"] = \
                    _given_run(run, "latest", flag)
                if not getattr(args, "allow_unfinished", False):
                    check_finished(run, name=flag)
    resolve_decoding(args, runs)
    if args.data != "embedded" and not Path(args.data).exists():
        raise FileNotFoundError(f"--data: no feature cache at {args.data!r}")
    if args.captioner != "embedded" and not Path(args.captioner).exists():
        raise FileNotFoundError(f"--captioner: no model directory at {args.captioner!r}")
    if args.captioner == "embedded" and args.data != "embedded":
        raise ValueError("--captioner embedded goes with --data embedded; for your own feature "
                         "cache pass --captioner PATH to its Hugging Face causal LM")
    if args.data != "embedded" and not (Path(args.data) / "meta.json").is_file():
        raise FileNotFoundError(f"--data: no feature cache at {args.data!r}"
                                + _not_a_cache(args.data))
    try:  # the settings of any policy trained here, checked now rather than after captioning
        resolve_config(build_train_parser("--train-args", "training settings").parse_args(
            shlex.split(args.train_args)))
    except SystemExit:
        raise ValueError(f"--train-args: {args.train_args!r} are not python -m avex.train "
                         "flags (see the message above)") from None
    except (ValueError, TypeError, OSError) as err:
        raise ValueError(f"--train-args: {err}") from None
    if args.command == "sweep":
        _check_seeds(args.seeds)
        if len(set(args.retentions)) != len(args.retentions):
            raise ValueError(f"retentions has duplicates: {args.retentions}")
        _split("transfer_split", args.transfer_split, "none")
        _checks.optional_int_at_least("fastv_layer", args.fastv_layer, 1)
        depth = _captioner_depth(args)
        if args.fastv_layer is not None and depth is not None and args.fastv_layer > depth:
            raise ValueError(f"fastv_layer must be <= the captioner's {depth} layers, got "
                             f"{args.fastv_layer}")
        _checks.int_at_least("qualitative", args.qualitative, 0)
    if args.command == "ablation":
        _checks.ratio("retention", args.retention)
        if args.retentions and len(set(args.retentions)) != len(args.retentions):
            raise ValueError(f"retentions has duplicates: {args.retentions}")
        _check_seeds(args.seeds)
        if args.run and len(args.seeds) > 1:
            raise ValueError(f"--run reuses one run per variant, so it takes one seed; got "
                             f"seeds {args.seeds}")
        runs = {}
        for item in args.run:
            name, sep, path = item.partition("=")
            if not sep or name not in ABLATIONS:
                raise ValueError(f"--run must be VARIANT=DIR with VARIANT one of "
                                 f"{list(ABLATIONS)}, got {item!r}")
            _given_run(path, "warmup" if name == "warmup" else "latest", f"--run {name}")
            runs[name] = Path(path)
        args.run = runs
    if args.command == "motivation":
        _checks.ratio("base_retention", args.base_retention)
        _checks.int_at_least("clips", args.clips, 1)
        _checks.int_at_least("base_sets", args.base_sets, 1)
        _checks.int_at_least("group", args.group, 1)
        _checks.int_at_least("seed", args.seed, 0)


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.command == "gates":
        return {"exit_code": run_gates_command(args, argv)}
    if args.command == "motivation":
        return run_motivation(args)
    if args.command == "ablation":
        return run_ablation(args)
    return run_sweep(args)


if __name__ == "__main__":
    sys.exit(main().get("exit_code", 0))
