"""python -m avex.captioner {install, train, caption}

  install  put the shipped reference captioner of an embedded benchmark into the cache
           (building the benchmark first if it is missing): the judge every committed figure
           used, the same on every machine (training runs do this themselves)
  train    train the embedded captioner on a benchmark's train split (building the embedded
           benchmark first if it is missing) and save it under the cache directory; its
           weights depend on the machine's CPU kernels (docs/results.md, "The judge")
  caption  caption a few clips of a feature cache with any captioner, full or pruned
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from .. import _checks
from ..data import PRESETS as BENCHMARK_PRESETS
from ..data import SPLITS, FeatureCache, default_benchmark_path, ensure_benchmark
from ..data.cache import peek_meta
from ..paths import default_captioner_path
from ..selection import num_kept, random_keep
from .frozen import CAPTIONER_FILE, FrozenCaptioner
from .pairing import check_captioner_benchmark
from .reference import install_reference, reference_name, references, verify_reference
from .train import PRESETS, check_captioner_out, ensure_captioner, train_captioner


def cmd_train(args) -> int:
    # every setting is checked before a benchmark is built or a model trained
    cfg = PRESETS[args.preset]
    changes = {k: getattr(args, k) for k in ("steps", "batch_size", "lr")
               if getattr(args, k) is not None}
    cfg = dataclasses.replace(cfg, **changes).validate()
    if args.device is not None:
        _checks.available_device("device", args.device)
    if args.data:
        for flag, value in (("--benchmark-preset", args.benchmark_preset), ("--seed", args.seed)):
            if value is not None:  # they choose the embedded benchmark that --data replaces
                raise ValueError(f"{flag} {value} has no effect with --data (the captioner "
                                 f"trains on {args.data!r}); drop one")
        bench = Path(args.data)
        if not (bench / "meta.json").is_file():
            raise FileNotFoundError(f"--data: no feature cache at {args.data!r}")
    else:
        args.benchmark_preset = args.benchmark_preset or "default"
        args.seed = 0 if args.seed is None else args.seed
        _checks.int_at_least("seed", args.seed, 0)
        if args.benchmark_preset not in BENCHMARK_PRESETS:
            raise ValueError(f"benchmark_preset must be one of {sorted(BENCHMARK_PRESETS)}, "
                             f"got {args.benchmark_preset!r}")
        if args.cache_dir is not None:
            _checks.output_dir("cache_dir", args.cache_dir, writable=False)
        bench = default_benchmark_path(args.benchmark_preset, args.cache_dir, seed=args.seed)
    out = Path(args.out) if args.out else default_captioner_path(bench.name, args.preset,
                                                                  args.cache_dir)
    where = "--out" if args.out else "cache_dir"
    if (out / CAPTIONER_FILE).is_file() and not args.overwrite:
        check_same_training(out, bench, cfg, where)
        print(f"captioner already trained at {out} (pass --overwrite to retrain)")
        return 0
    # where the model goes must take it before hours of training, not after; and never a
    # folder of the user's (saving replaces the folder)
    check_captioner_out(out, args.overwrite, where)
    _checks.output_dir(where, str(out))
    if not args.data:
        bench = ensure_benchmark(args.benchmark_preset, cache_dir=args.cache_dir,
                                 seed=args.seed, progress=not args.no_progress)
    started = time.perf_counter()
    path = train_captioner(bench, out, cfg, device=args.device, progress=not args.no_progress,
                           overwrite=args.overwrite)
    print(f"trained captioner ({cfg.num_layers} layers, hidden {cfg.hidden_size}, {cfg.steps} "
          f"steps) -> {path} in {time.perf_counter() - started:.1f} s")
    return 0


def check_same_training(out: Path, bench: Path, cfg, where: str) -> None:
    """Refuse to call the captioner at ``out`` "already trained" when its record says it was
    trained on another benchmark (generator settings, or another cache's meta.json) or with
    other training settings than asked for."""
    info = json.loads((out / CAPTIONER_FILE).read_text(encoding="utf-8"))
    differs = []
    if (bench / "meta.json").is_file():
        source = (peek_meta(bench) or {}).get("source")
        if (info.get("benchmark") or {}).get("source") != source:
            differs.append(f"the benchmark (it was trained on "
                           f"{(info.get('benchmark') or {}).get('path', '?')!r})")
    trained = info.get("training") or {}
    asked = {k: v for k, v in dataclasses.asdict(cfg).items() if k in trained}
    changed = sorted(k for k, v in asked.items() if trained[k] != v)
    if changed:
        differs.append("training settings " + ", ".join(
            f"{k}={trained[k]!r} (asked {asked[k]!r})" for k in changed))
    if differs:
        raise ValueError(f"{where}: the captioner at {str(out)!r} was trained otherwise: "
                         + "; ".join(differs) + "; pass --overwrite to retrain it there, or "
                         "another --out")


def cmd_install(args) -> int:
    _checks.int_at_least("seed", args.seed, 0)
    if args.cache_dir is not None:
        _checks.output_dir("cache_dir", args.cache_dir)
    bench = default_benchmark_path(args.benchmark_preset, args.cache_dir, seed=args.seed)
    name = reference_name(bench.name, args.preset)
    if name is None:
        raise ValueError(f"no shipped reference captioner for {bench.name} with preset "
                         f"{args.preset!r} (shipped: {sorted(references())}); train one with "
                         "`python -m avex.captioner train`")
    path = default_captioner_path(bench.name, args.preset, args.cache_dir)
    replaced = (path / CAPTIONER_FILE).is_file() and installed_reference(path) != name
    if replaced and not args.overwrite:
        raise ValueError(f"a captioner trained here is at {str(path)!r}, where the shipped "
                         f"reference {name} goes; pass --overwrite to replace it with the "
                         "reference (the judge of every committed figure), or move it first")
    if replaced:  # a captioner trained here sits where the reference goes: the judge is the
        # shipped one, so it takes that place (the same weights where this machine trained
        # the reference itself)
        install_reference(name, path, benchmark_path=ensure_benchmark(
            args.benchmark_preset, cache_dir=args.cache_dir, seed=args.seed,
            progress=not args.no_progress))
    path = ensure_captioner(args.benchmark_preset, args.preset, seed=args.seed,
                            cache_dir=args.cache_dir, progress=not args.no_progress)
    verify_reference(path, name)
    print(f"{path}: the reference captioner {name} (verified"
          + (", in place of the captioner trained there)" if replaced else ")"))
    return 0


def installed_reference(path) -> str | None:
    """The reference a cached captioner directory says it is (None: one trained there)."""
    try:
        return json.loads((Path(path) / CAPTIONER_FILE).read_text(encoding="utf-8")).get(
            "reference")
    except (OSError, ValueError):
        return None


def caption_default(data, source) -> Path:
    """``caption``'s captioner when none is given: the captioner built for ``data``'s own
    embedded benchmark (its default preset's, or the only one there is), else benchmark 0's
    default (refused beside another benchmark's cache by the pairing check, not used on it)."""
    if isinstance(source, dict) and source.get("kind") == "embedded":
        own = default_captioner_path(Path(data).name)
        built = sorted(p for p in own.parent.glob(f"{Path(data).name}-*") if p.is_dir())
        if own.is_dir() or len(built) == 1:
            return own if own.is_dir() else built[0]
    return default_captioner_path()


def cmd_caption(args) -> int:
    # every flag is checked before the captioner is loaded
    _checks.int_at_least("n", args.n, 1)
    _checks.ratio("retention", args.retention)
    _checks.int_at_least("num_beams", args.num_beams, 1)
    _checks.int_at_least("seed", args.seed, 0)
    _checks.choice("split", args.split, set(SPLITS))
    if args.device is not None:
        _checks.available_device("device", args.device)
    if not Path(args.data, "meta.json").is_file():
        raise FileNotFoundError(f"--data: no feature cache at {args.data!r}")
    source = (peek_meta(args.data) or {}).get("source")
    path = args.captioner if args.captioner is not None else caption_default(args.data, source)
    # an embedded captioner beside another benchmark's cache
    check_captioner_benchmark(source, path, args.data, "--captioner")
    try:
        captioner = FrozenCaptioner.load(path, device=args.device, progress=not args.no_progress)
    except OSError as err:   # a folder of a config without weights, an unreadable file
        raise ValueError(f"--captioner: {args.captioner!r} could not be loaded as a model "
                         f"({type(err).__name__}: {str(err).splitlines()[0]})") from None
    cache = FeatureCache(args.data, expected_dim=captioner.feature_dim)
    split = cache.split(args.split)
    clips = [split[i] for i in range(min(args.n, len(split)))]
    keep = None
    if args.retention < 1:  # random selection, as the "random" method draws it
        counts = torch.tensor([c.n_visual + c.n_audio for c in clips])
        keep = random_keep([c.clip_id for c in clips], counts,
                           num_kept(args.retention, counts), args.seed)
    captions = captioner.caption(clips, keep=keep, num_beams=args.num_beams)
    for clip, text in zip(clips, captions):
        # a label-free clip (exported without captions) has no reference to show
        reference = clip.refs_av[0] if clip.refs_av else "none (a label-free clip)"
        print(f"{clip.clip_id}: {text}\n    reference: {reference}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m avex.captioner", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    install = sub.add_parser("install", help="install the shipped reference captioner")
    install.add_argument("--preset", default="default", choices=sorted(PRESETS))
    install.add_argument("--benchmark-preset", default="default", choices=sorted(BENCHMARK_PRESETS))
    install.add_argument("--seed", type=int, default=0, help="benchmark seed")
    install.add_argument("--cache-dir", default=None,
                         help="root of the cache (default: $AVEX_CACHE, else ~/.cache/avex)")
    install.add_argument("--overwrite", action="store_true",
                         help="replace a captioner trained at the reference's place")
    install.add_argument("--no-progress", action="store_true")
    install.set_defaults(run=cmd_install, parser=install)

    train = sub.add_parser("train", help="train the embedded captioner")
    train.add_argument("--preset", default="default", choices=sorted(PRESETS),
                       help="captioner size: tiny (tests), default (2 layers, hidden 128), "
                       "large (4 layers, hidden 256)")
    train.add_argument("--benchmark-preset", default=None,
                       help="embedded benchmark to train on (built if missing; default: default)")
    train.add_argument("--seed", type=int, default=None, help="benchmark seed (default 0)")
    train.add_argument("--data", default=None, help="train on this feature cache instead")
    train.add_argument("--out", default=None, help="save here instead of the cache directory")
    train.add_argument("--cache-dir", default=None,
                       help="root of the cache (default: $AVEX_CACHE, else ~/.cache/avex)")
    train.add_argument("--steps", type=int, default=None)
    train.add_argument("--batch-size", type=int, default=None)
    train.add_argument("--lr", type=float, default=None)
    train.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    train.add_argument("--overwrite", action="store_true")
    train.add_argument("--no-progress", action="store_true")
    train.set_defaults(run=cmd_train, parser=train)

    caption = sub.add_parser("caption", help="caption clips of a feature cache")
    caption.add_argument("--captioner", default=None,
                         help="captioner directory or any local HF causal LM (default: the "
                         "embedded captioner of --data's benchmark)")
    caption.add_argument("--data", required=True, help="feature cache directory")
    caption.add_argument("--split", default="test")
    caption.add_argument("-n", type=int, default=5, help="number of clips")
    caption.add_argument("--retention", type=float, default=1.0,
                         help="keep this share of AV tokens, chosen at random")
    caption.add_argument("--num-beams", type=int, default=1)
    caption.add_argument("--seed", type=int, default=0)
    caption.add_argument("--device", default=None)
    caption.add_argument("--no-progress", action="store_true",
                         help="no progress bars (transformers' weight-loading bar)")
    caption.set_defaults(run=cmd_caption, parser=caption)

    args = parser.parse_args(argv)
    try:  # a bad flag, path or cache is a usage error of its subcommand (exit status 2)
        return args.run(args)
    except (FileNotFoundError, FileExistsError, ValueError, TypeError) as err:
        args.parser.error(str(err))


if __name__ == "__main__":
    sys.exit(main())
