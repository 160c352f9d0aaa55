"""``python -m avex.evaluate``: the paper's pruning comparison, motivation analysis and ablations.

Subcommands (``sweep`` is the default):

``sweep``       every method (Random, FastV-AV, ToMe-AV, FastAV, CaCoVID-AV, AVEX-Prune) at every
                retention (50/40/30/20/10%): C_av, C_v, C_a on the test split, CIDEr on the
                transfer split, and Rel. (the paper's Table 2) against the full-token numbers of
                the same run; a Markdown table, a JSON file, a PNG like the paper's Fig. 3 and
                qualitative captions at 40%. ``--seeds 0,1,2`` reports mean ± std, and
                AVEX-Prune − each method comes with its paired bootstrap 95% interval.
``motivation``  the paper's Fig. 1: (a) counterfactual CIDEr gain against attention rank with the
                rank correlation, (b) joint gain of a visual + an audio group against the sum of
                their separate gains. A PNG and its numbers.
``ablation``    the paper's Table 3 at 20% retention: training-signal variants and group size g;
                it trains the variants it needs (``avex.train.train``) or reuses given runs;
                ``--derive 'NAME=VARIANT FLAGS'`` adds a variant with some settings changed.
``gates``       the embedded benchmark's measured gates (Markdown + JSON report).
``diagnose``    where a trained policy's lost C_av goes (issue #33): exact reproductions, the
                loss by clip and by kind of caption difference, role-oracle sets, a
                reference-free best-of-N, and the ties in training.

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
import shlex
import sys
from pathlib import Path

from avex import _checks
from avex.data.embedded import default_benchmark_path
from avex.paths import default_captioner_path, portable_command
from avex.registry import BENCHMARK_PRESETS, CAPTIONER_PRESETS, SELECTORS
from avex.stop_signals import sigterm_as_interrupt
from avex.training.config import TrainConfig, explicit_settings, resolve_config
from avex.training.config import build_parser as build_train_parser
from avex.training.stopping import TrainingInterrupted

from .ablation import ABLATIONS, AblationSettings, run_ablation
from .common import DECODING, Refused, not_a_cache
from .diagnose import RETENTIONS as DIAGNOSE_RETENTIONS
from .diagnose import DiagnoseSettings, run_diagnose
from .gates import run_gates
from .gates_report import write_report
from .motivation import MotivationSettings, run_motivation
from .sweep import RETENTIONS, SweepSettings, run_sweep

DEFAULT_METHODS = SELECTORS


# ----------------------------------------------------------------------------------------------
# Arguments
# ----------------------------------------------------------------------------------------------

def _list(name: str, kind, what: str):
    """An argparse type: a comma-separated list of ``kind``; the settings check the values."""
    def parse(text):
        try:
            values = [kind(x.strip()) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be comma-separated {what}, got "
                                             f"{text!r}")
        if not values:
            raise argparse.ArgumentTypeError(f"{name} is empty")
        return values
    return parse


def _common(parser, *, trains: bool = True):
    """The flags every experiment takes; ``trains``: whether it may train a policy (else
    ``--train-args`` is hidden, and refused when given)."""
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
                             "here, e.g. \"--epochs 1\" or a single flag, --train-args "
                             "--exchanges" if trains else argparse.SUPPRESS)
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m avex.evaluate",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    _add_sweep(sub)
    _add_ablation(sub)
    _add_motivation(sub)
    _add_diagnose(sub)
    _add_gates(sub)
    return parser


def _add_sweep(sub) -> None:
    """``python -m avex.evaluate sweep``: the retention sweep's flags."""
    sweep = sub.add_parser("sweep", help="the retention sweep of every method (Table 2, Fig. 3)")
    _common(sweep)
    sweep.add_argument("--methods", type=_list("methods", str, "method names"),
                       default=list(DEFAULT_METHODS))
    sweep.add_argument("--retentions", type=_list("retentions", float, "numbers"),
                       default=list(RETENTIONS))
    sweep.add_argument("--seeds", type=_list("seeds", int, "integers"), default=[0])
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
    sweep.add_argument("--qualitative", type=int, default=3,
                       help="clips whose captions are shown, at the retention of --retentions "
                            "nearest 40%%")


def _add_ablation(sub) -> None:
    """``python -m avex.evaluate ablation``: the ablation's flags."""
    abl = sub.add_parser("ablation", help="the paper's Table 3 (training signal, group size)")
    _common(abl)
    abl.add_argument("--variants", type=_list("variants", str, "variant names"), default=None,
                     help="the variants to train and score (default: every variant; with "
                          "--derive, the variants it derives from)")
    abl.add_argument("--retention", type=float, default=0.2,
                     help="the retention scored when --retentions is not given (default "
                          "0.2); training draws its own (train_retentions: 50-10%%)")
    abl.add_argument("--retentions", type=_list("retentions", float, "numbers"), default=None,
                     help="evaluate every variant at each of these (e.g. 0.5,0.4,0.3,0.2,0.1: "
                          "the matched-budget comparison's table); default: --retention")
    abl.add_argument("--seeds", type=_list("seeds", int, "integers"), default=[0],
                     help="training seeds, comma-separated: mean ± std over them")
    abl.add_argument("--split", default="test")
    abl.add_argument("--run", action="append", default=[], metavar="VARIANT=DIR",
                     help="reuse a trained run for a variant (repeatable), e.g. full=runs/x")
    abl.add_argument("--derive", action="append", default=[], metavar="'NAME=VARIANT FLAGS'",
                     help="score a variant with some training settings changed, under a name "
                          "of its own (repeatable), e.g. 'Dc-fid@r2=Dc-fid --redundancy 2'; "
                          "FLAGS are python -m avex.train flags")


def _add_motivation(sub) -> None:
    """``python -m avex.evaluate motivation``: the motivation figure's flags."""
    mot = sub.add_parser("motivation", help="the paper's Fig. 1")
    _common(mot, trains=False)
    mot.add_argument("--split", default="test")
    mot.add_argument("--clips", type=int, default=40)
    mot.add_argument("--base-retention", type=float, default=0.2)
    mot.add_argument("--base-sets", type=int, default=3)
    mot.add_argument("--group", type=int, default=2)
    mot.add_argument("--seed", type=int, default=0)


def _add_diagnose(sub) -> None:
    """``python -m avex.evaluate diagnose``: the diagnosis's flags."""
    diag = sub.add_parser("diagnose", help="where a trained policy's lost C_av goes "
                          "(issue #33)")
    _common(diag, trains=False)
    diag.add_argument("--run", required=True,
                      help="the python -m avex.train run directory whose policy is diagnosed")
    diag.add_argument("--retentions", type=_list("retentions", float, "numbers"),
                      default=list(DIAGNOSE_RETENTIONS))
    diag.add_argument("--split", default="test")
    diag.add_argument("--samples", type=int, default=8,
                      help="N: Gumbel-Top-K samples of the policy per clip for best-of-N")
    diag.add_argument("--tau", type=float, default=None,
                      help="the samples' temperature (default: the run's)")
    diag.add_argument("--seed", type=int, default=0, help="the samples' noise seed")
    diag.add_argument("--ties-run", default=None,
                      help="the run whose metrics.jsonl gives the ties in training "
                           "(default: --run)")
    diag.add_argument("--name", default="diagnose",
                      help="the report's file name stem under --out (NAME.md, NAME.json, "
                           "NAME-ties.png)")
    diag.add_argument("--allow-unfinished", action="store_true",
                      help="diagnose the latest checkpoint of a run that did not finish")


def _add_gates(sub) -> None:
    """``python -m avex.evaluate gates``: the gates's flags."""
    gates = sub.add_parser("gates", help="measure the embedded benchmark's gates")
    gates.add_argument("--benchmark", default=None, help="feature cache (default: the "
                       "embedded benchmark of --preset / --seed)")
    gates.add_argument("--preset", default=None, choices=sorted(BENCHMARK_PRESETS),
                       help="the embedded benchmark's preset (default: default); not with "
                            "--benchmark")
    gates.add_argument("--seed", type=int, default=None,
                       help="the embedded benchmark's seed (default: 0); not with --benchmark")
    gates.add_argument("--captioner", default=None, help="captioner directory (default: the "
                       "embedded captioner trained on the benchmark)")
    gates.add_argument("--captioner-preset", default="default")
    gates.add_argument("--cache-dir", default=None)
    gates.add_argument("--seeds", type=int, default=3, help="random-pruning seeds")
    gates.add_argument("--max-clips", type=int, default=None,
                       help="the first N clips of the test and transfer splits (default: all; "
                            "the committed gates: 200)")
    gates.add_argument("--counterfactual-clips", type=int, default=100)
    gates.add_argument("--base-sets", type=int, default=3)
    gates.add_argument("--device", default=None)
    gates.add_argument("--out", default="results/embedded-benchmark-gates.md")
    gates.add_argument("--timing-note", default=None,
                       help="a measured build/train timing line to include in the report")
    gates.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)


def run_gates_command(args, argv) -> int:
    bench = Path(args.benchmark) if args.benchmark else default_benchmark_path(
        args.preset or "default", args.cache_dir, seed=args.seed or 0)
    captioner = Path(args.captioner) if args.captioner else default_captioner_path(
        bench.name, args.captioner_preset, args.cache_dir)
    report = run_gates(bench, captioner, seeds=args.seeds,
                       counterfactual_clips=args.counterfactual_clips, base_sets=args.base_sets,
                       device=args.device, max_clips=args.max_clips, cache_dir=args.cache_dir,
                       progress=args.progress)
    shown, skip = [], False  # the command as typed, minus the (long) timing note
    for arg in argv[1:]:
        if skip:
            skip = False
        elif arg == "--timing-note":
            skip = True
        elif not arg.startswith("--timing-note="):
            shown.append(arg)
    command = "python -m avex.evaluate gates " + portable_command(shown, args.cache_dir)
    out = write_report(report, args.out, command.strip(), args.timing_note)
    share = report["gate_random_lowest_share"]
    print(f"full C_av {report['full']['C_av']:.1f}; random at the lowest retention keeps "
          f"{share * 100:.1f}% of it (gate: below 60%); Spearman(attention, gain) per clip "
          f"{report['phenomena']['attention_vs_gain']['spearman_per_clip_mean']:.3f}")
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0 if share < 0.6 else 1


def train_settings(text: str) -> TrainConfig:
    """``--train-args``: ``python -m avex.train`` flags, split once as a shell would (a quoted
    path may hold spaces), resolved as that command resolves them."""
    try:
        flags = shlex.split(text)
        return resolve_config(build_train_parser("--train-args", "training settings")
                              .parse_args(flags))
    except SystemExit:
        raise ValueError(f"--train-args: {text!r} are not python -m avex.train flags (see the "
                         "message above)") from None
    except (ValueError, TypeError, OSError) as err:
        raise ValueError(f"--train-args: {err}") from None


def derived_variant(text: str) -> tuple[str, tuple[str, dict]]:
    """``--derive 'NAME=VARIANT FLAGS'`` -> (NAME, (VARIANT, the settings FLAGS give)); FLAGS
    are ``python -m avex.train`` flags, split as a shell would, and only those given count."""
    name, sep, rest = text.partition("=")
    words = shlex.split(rest) if sep else []
    if not sep or not name.strip() or not words or words[0].startswith("-"):
        raise ValueError(f"--derive must be 'NAME=VARIANT FLAGS' (e.g. 'Dc-fid@r2=Dc-fid "
                         f"--redundancy 2'), got {text!r}")
    where = f"--derive {name}"
    try:
        args = build_train_parser(where, "training settings").parse_args(words[1:])
    except SystemExit:
        raise ValueError(f"{where}: {shlex.join(words[1:])!r} are not python -m avex.train "
                         "flags (see the message above)") from None
    for flag, given in (("--config", args.config), ("--resume", args.resume),
                        ("--preset", args.preset != "embedded")):
        if given:
            raise ValueError(f"{where}: {flag} can't derive a variant; give the settings it "
                             "changes as flags")
    return name, (words[0], explicit_settings(args, with_preset=False))


def settings_of(args):
    """The settings of the sweep, ablation or motivation the parsed flags ask for."""
    common = dict(data=args.data, captioner=args.captioner,
                  benchmark_preset=args.benchmark_preset, captioner_preset=args.captioner_preset,
                  cache_dir=args.cache_dir, out=args.out, max_clips=args.max_clips,
                  batch_size=args.batch_size, num_beams=args.num_beams,
                  max_new_tokens=args.max_new_tokens, device=args.device,
                  train=train_settings(args.train_args), progress=args.progress)
    if args.command == "sweep":
        return SweepSettings(**common, methods=args.methods, retentions=args.retentions,
                             seeds=args.seeds, split=args.split,
                             transfer_split=args.transfer_split, avex_run=args.avex_run,
                             cacovid_run=args.cacovid_run, allow_unfinished=args.allow_unfinished,
                             fastv_layer=args.fastv_layer, qualitative=args.qualitative)
    if args.command == "ablation":
        runs = {}
        for item in args.run:
            name, sep, path = item.partition("=")
            if not sep:
                raise ValueError(f"--run must be VARIANT=DIR with VARIANT one of "
                                 f"{list(ABLATIONS)}, got {item!r}")
            if name in runs:
                raise ValueError(f"--run {name}= is given twice ({runs[name]} and {path}); "
                                 "give one run per variant")
            runs[name] = path
        derived = dict(derived_variant(item) for item in args.derive)
        variants = args.variants if args.variants is not None else list(dict.fromkeys(
            base for base, _ in derived.values())) if derived else list(ABLATIONS)
        return AblationSettings(**common, variants=variants, retention=args.retention,
                                retentions=args.retentions, seeds=args.seeds, split=args.split,
                                runs=runs, derived=derived)
    if args.command == "diagnose":
        return DiagnoseSettings(**common, run=args.run, retentions=args.retentions,
                                split=args.split, samples=args.samples, tau=args.tau,
                                seed=args.seed, ties_run=args.ties_run, name=args.name,
                                allow_unfinished=args.allow_unfinished)
    return MotivationSettings(**common, split=args.split, clips=args.clips,
                              base_retention=args.base_retention, base_sets=args.base_sets,
                              group=args.group, seed=args.seed)


def check_gates_args(args) -> None:
    if args.device is not None:
        _checks.available_device("device", args.device)
    if args.cache_dir is not None:  # a prebuilt cache may be read-only
        _checks.output_dir("cache_dir", args.cache_dir, writable=False)
    _checks.choice("captioner_preset", args.captioner_preset, set(CAPTIONER_PRESETS))
    _checks.output_file("out", args.out)
    for name, low in (("seeds", 1), ("counterfactual_clips", 1), ("base_sets", 1)):
        _checks.int_at_least(name, getattr(args, name), low)
    _checks.optional_int_at_least("max_clips", args.max_clips, 1)
    _checks.optional_int_at_least("seed", args.seed, 0)
    if args.benchmark is not None:   # they choose the embedded benchmark --benchmark replaces
        given = [f"--{name} {value}" for name, value in (("preset", args.preset),
                                                          ("seed", args.seed))
                 if value is not None]
        if given:
            raise ValueError(f"{' and '.join(given)} would have no effect with --benchmark "
                             f"{args.benchmark}: they choose the embedded benchmark it "
                             "replaces; drop them")
    if args.benchmark is not None and not (Path(args.benchmark) / "meta.json").is_file():
        raise FileNotFoundError(f"--benchmark: no feature cache at {args.benchmark!r}"
                                + not_a_cache(args.benchmark))
    if args.captioner is not None and not Path(args.captioner).exists():
        raise FileNotFoundError(f"--captioner: no model directory at {args.captioner!r}")


def parse_args(argv):
    """(flags, settings): every flag checked before any captioning (a bad one is a usage
    error, exit status 2); no settings for ``gates``, which takes its flags as they are."""
    argv = list(argv)
    if not argv or argv[0] not in ("sweep", "motivation", "ablation", "gates", "diagnose", "-h",
                                "--help"):
        argv = ["sweep"] + argv
    parser = build_parser()
    args = parser.parse_args(joined_train_args(argv))
    try:
        if args.command == "gates":
            check_gates_args(args)
            return args, None
        settings = settings_of(args).validate()
        unused = settings.training_unused()   # flags given at their defaults too
        if args.train_args.strip() and unused:
            raise ValueError(f"--train-args {args.train_args!r} would have no effect: "
                             f"{unused}; drop it")
        return args, settings
    except (ValueError, TypeError, OSError) as err:
        parser.error(str(err))


def joined_train_args(argv: list) -> list:
    """``argv`` with ``--train-args VALUE`` written ``--train-args=VALUE`` where VALUE starts
    with '-': argparse takes a lone ``--exchanges`` for a flag of its own, so ``--train-args
    --exchanges`` would be refused as missing its value ("expected one argument")."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--train-args" and i + 1 < len(argv) and argv[i + 1].startswith("-") \
                and argv[i + 1] != "--":
            out.append(f"--train-args={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def main(argv=None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, settings = parse_args(argv)
    if args.command == "gates":
        return {"exit_code": run_gates_command(args, argv)}
    run = {"sweep": run_sweep, "ablation": run_ablation, "motivation": run_motivation,
           "diagnose": run_diagnose}
    return run[args.command](settings)


def cli(argv=None) -> int:
    """:func:`main` as the command runs it: a refusal made before anything is written
    (:class:`Refused`) is a usage error (exit status 2, no traceback); Ctrl-C or SIGTERM ends it
    with a line that says what is kept, and exit status 130, instead of a traceback. Results
    are written only once every setting is scored; a run that an ablation or sweep was
    training stops at its next step boundary with a checkpoint, which the same command
    resumes."""
    try:
        with sigterm_as_interrupt():
            return main(argv).get("exit_code", 0)
    except Refused as refused:   # nothing was written: the message says what to change
        print(f"python -m avex.evaluate: error: {refused}", file=sys.stderr)
        return 2
    except TrainingInterrupted as stop:
        print(f"\ninterrupted: a run stopped training at checkpoint {stop.checkpoint}. No "
              "results were written; the same command resumes that run and reuses the runs "
              "it finished.", file=sys.stderr)
    except KeyboardInterrupt:
        print("\ninterrupted: no results were written; the runs already trained under the "
              "output directory are kept, and the same command reuses them.", file=sys.stderr)
    return 130


if __name__ == "__main__":
    from avex.heap import keep_freed_memory

    try:   # the command's own process: see avex/heap.py
        keep_freed_memory()
    except ValueError as err:   # before any work, as a usage error
        print(f"python -m avex.evaluate: error: {err}", file=sys.stderr)
        sys.exit(2)
    sys.exit(cli())
