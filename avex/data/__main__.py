"""python -m avex.data {build, export, verify, info}

  build   generate the embedded benchmark (default: preset "default", seed 0) into the cache
  export  a folder of media files + reference captions (JSONL) -> a feature cache, through a
          model's own processor and avex.adapters (python -m avex.train --data reads it)
  verify  check a feature cache completely (every row against its shard, every shard's SHA-256,
          the tokenizer meta.json names)
  info    print a cache's splits, sizes and one clip

The benchmark's measured gates are an analysis: ``python -m avex.evaluate gates``.
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

import torch

from .. import _checks
from .cache import CacheError, FeatureCache, is_feature_cache
from .captions import LABEL_FREE_SPLIT, ExportError
from .export import (ExportSettings, check_headers, check_out, export_cache, load_model,
                     model_dir_family, read_rows)
from .processor import load_processor
from .embedded import (PRESETS, benchmark_name, build_benchmark, built_mismatch,
                       default_benchmark_path, estimated_bytes, resolve_config)

SIZE_FLAGS = ("train", "val", "test", "transfer", "dim", "grid", "audio_per_frame", "n_frames")


def _add_benchmark_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="default", choices=sorted(PRESETS),
                        help="size preset: tiny (tests), default (Nv=64, Na=16), paper "
                        "(Nv=256, Na=64)")
    parser.add_argument("--seed", type=int, default=0)
    for name in SIZE_FLAGS:
        parser.add_argument("--" + name.replace("_", "-"), dest=name, type=int, default=None,
                            help=f"override the preset's {name}")
    parser.add_argument("--cache-dir", default=None,
                        help="root of the cache (default: $AVEX_CACHE, else ~/.cache/avex)")


def _overrides(args) -> dict:
    return {name: getattr(args, name) for name in SIZE_FLAGS if getattr(args, name) is not None}


def check_room(out: Path, cfg, flag: str) -> None:
    """Refuse a build that would not fit on ``out``'s disk, before any file is written (it
    stages the whole cache beside ``out``; an --overwrite keeps the old one until the end)."""
    needed = estimated_bytes(cfg)
    existing = next(p for p in (out, *out.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if needed > free:
        clips = sum(cfg.split_sizes().values())
        raise ValueError(f"{flag}: the build writes about {needed / 1e9:.2f} GB ({clips} clips of "
                         f"{cfg.n_visual + cfg.n_audio} tokens x {cfg.dim} float32) under {out}, "
                         f"whose disk has {free / 1e9:.2f} GB free; build fewer clips (--train, "
                         f"--val, --test, --transfer), or choose another {flag}")


def cmd_build(args) -> int:
    cfg = resolve_config(args.preset, seed=args.seed, **_overrides(args))
    out = Path(args.out) if args.out else default_benchmark_path(
        args.preset, args.cache_dir, seed=args.seed, **_overrides(args))
    if (out / "meta.json").is_file() and not args.overwrite:
        mismatch = built_mismatch(out, cfg, args.preset)
        if mismatch:   # never report another build as this one
            flag = "--out" if args.out else "--cache-dir"
            remedy = ("pass --overwrite to replace it, or " if is_feature_cache(out) else "")
            raise ValueError(f"{flag}: {mismatch}; {remedy}choose another {flag}")
        print(f"benchmark already built at {out} (pass --overwrite to rebuild)")
        return 0
    _checks.output_dir("out" if args.out else "cache_dir", str(out))
    check_room(out, cfg, "--out" if args.out else "--cache-dir")
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    build_benchmark(out, cfg, preset=args.preset, overwrite=args.overwrite,
                    progress=not args.no_progress)
    print(f"built {benchmark_name(cfg, args.preset)}: {cfg.train}/{cfg.val}/{cfg.test}/"
          f"{cfg.transfer} train/val/test/transfer clips, Nv={cfg.n_visual}, Na={cfg.n_audio}, "
          f"d={cfg.dim} -> {out} in {time.perf_counter() - started:.1f} s")
    return 0


#: the names export's messages start with ("out: ..."), each the CLI flag it stands for
EXPORT_FLAGS = ("out", "media", "captions", "model", "processor", "split")

#: files a processor folder holds, one at least (AutoTokenizer reads the first two)
PROCESSOR_FILES = ("tokenizer_config.json", "tokenizer.json", "processor_config.json",
                   "preprocessor_config.json")


def _flagged(err: ExportError) -> ExportError:
    """``err`` with the argument its message starts with named as the CLI's flag."""
    head, sep, rest = str(err).partition(": ")
    return ExportError(f"--{head}: {rest}") if sep and head in EXPORT_FLAGS else err


def _check_export(args, settings: ExportSettings):
    """Everything that needs no model loaded, in this order: the settings, the output, the
    device, the clips, the model and processor folders, and every file's header against the
    model's family and its processor's feature extractor. Returns the clips."""
    settings.validate()
    try:
        check_out(args.out, args.overwrite, [("media folder", args.media),
                                             ("captions file", args.captions),
                                             ("model", args.model)], cli=True)
        _checks.available_device("--device", args.device)
        if args.captions is not None and args.split is not None:
            raise ExportError(f"--split: {args.split!r} is for a label-free export (no "
                              "--captions); a captions file gives each line its own 'split'")
        rows = read_rows(args.media, args.captions, _split(args))
        family = model_dir_family(args.model, "--model")
        processor = args.processor
        if processor is not None and not Path(processor).is_dir():
            raise ExportError(f"--processor: no folder at {processor!r}")
        if processor is not None and not any(Path(processor, f).is_file()
                                             for f in PROCESSOR_FILES):
            raise ExportError(f"--processor: {processor!r} holds none of {list(PROCESSOR_FILES)}"
                              "; pass the folder save_pretrained wrote the processor to")
        extractor = _feature_extractor(family, processor or args.model,
                                       "--processor" if processor else "--model")
        check_headers(rows, family, extractor=extractor,
                      use_audio_in_video=settings.use_audio_in_video)
    except ExportError as err:
        raise _flagged(err) from None
    return rows


def _feature_extractor(family, folder, flag: str):
    """The processor's audio feature extractor, as the processor will be loaded with it, for
    a family that hears (None for one that doesn't): the header check needs its hop length
    and sampling rate before the model loads."""
    if not family.HEARS:
        return None
    import transformers

    try:
        return transformers.AutoFeatureExtractor.from_pretrained(str(folder))
    except (OSError, ValueError) as err:
        raise ExportError(f"{flag}: can't load the processor's feature extractor from "
                          f"{str(folder)!r} ({type(err).__name__}: {str(err)[:300]})") from None


def _split(args) -> str:
    return LABEL_FREE_SPLIT if args.split is None else args.split


def _export_device(args) -> str:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and world > 1:   # each process its own GPU
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return device


def cmd_export(args) -> int:
    settings = ExportSettings(prompt=args.prompt, fps=args.fps, max_frames=args.max_frames,
                              use_audio_in_video=args.use_audio_in_video, dtype=args.dtype)
    rows = _check_export(args, settings)   # before the model loads
    model = load_model(args.model, _export_device(args), name="--model",
                       progress=not args.no_progress)
    processor = load_processor(args.processor or args.model, model)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    launcher = f"torchrun --nproc-per-node {world} -m avex.data " if world > 1 else \
        "python -m avex.data "
    resume = launcher + shlex.join(args.argv)
    started = time.perf_counter()
    try:
        out = export_cache(args.media, args.captions, args.out, model=model,
                           processor=processor, settings=settings, overwrite=args.overwrite,
                           progress=not args.no_progress,
                           split=_split(args),
                           resume_command=resume, rows=rows, cli=True)
    except KeyboardInterrupt as stop:   # ExportInterrupted, or a second Ctrl-C mid-clip
        kept = Path(args.out).parent / ("." + Path(args.out).name + ".export")
        done = f" after {stop.done} of {stop.total} clips" if hasattr(stop, "done") else ""
        print(f"\nexport stopped{done}; the clips done are kept in {kept}; resume with: "
              f"{resume}", file=sys.stderr)
        return 130
    except ExportError as err:
        raise _flagged(err) from None
    if int(os.environ.get("RANK", "0")) == 0:
        cache = FeatureCache(out)
        labels = sum(bool(row["refs_av"]) for row in cache.rows)
        print(f"exported {len(cache)} clips ("
              f"{', '.join(f'{k} {v}' for k, v in cache.meta.splits.items())}; {labels} with "
              f"reference captions) -> {out} in {time.perf_counter() - started:.2f} s, "
              f"verified; train with python -m avex.train --data {out} --captioner "
              f"{args.model}")
    return 0


def cmd_verify(args) -> int:
    cache = FeatureCache(args.path, verify="hash")
    cache.verify_all()
    tokenizer = cache.check_tokenizer()
    print(f"{args.path}: {len(cache)} clips in {len(cache.meta.shards)} shards, all rows and "
          "shard hashes check out; " + ("prompts are stored as embeddings (no tokenizer)"
                                        if tokenizer is None else f"tokenizer {tokenizer} loads"))
    return 0


def cmd_info(args) -> int:
    cache = FeatureCache(args.path)
    print(f"{args.path}: dim {cache.meta.dim}, {cache.meta.n_frames} frames, dtype "
          f"{cache.meta.dtype}, tokenizer {cache.meta.tokenizer!r}")
    for split, count in cache.meta.splits.items():
        print(f"  {split}: {count} clips")
    clip = cache[0]
    print(f"first clip {clip.clip_id!r}: visual {list(clip.visual.shape)}, audio "
          f"{list(clip.audio.shape)}")
    for kind, refs in (("AV", clip.refs_av), ("V", clip.refs_v), ("A", clip.refs_a)):
        for ref in refs:
            print(f"  {kind}: {ref}")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m avex.data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    build = sub.add_parser("build", help="generate the embedded benchmark")
    _add_benchmark_flags(build)
    build.add_argument("--out", default=None, help="write here instead of the cache directory")
    build.add_argument("--overwrite", action="store_true")
    build.add_argument("--no-progress", action="store_true")
    build.set_defaults(run=cmd_build, parser=build)

    export = sub.add_parser("export", help="media files + captions -> a feature cache, "
                            "through a model's processor")
    export.add_argument("--media", required=True, help="the folder of media files")
    export.add_argument("--captions", default=None,
                        help='JSON lines: {"file": ..., "captions": [...], "split": "train"} '
                        "(captions may be left out); without it every media file under "
                        "--media is a clip of --split, without references")
    export.add_argument("--split", default=None,
                        help="the split of every clip when there is no --captions file: train "
                        "only (avex.train needs train clips, avex.evaluate scores only clips "
                        "with references); for val/test clips write a captions file")
    export.add_argument("--model", required=True,
                        help="a local Hugging Face model directory (the captioner to train with)")
    export.add_argument("--processor", default=None,
                        help="its processor's directory (default: --model)")
    export.add_argument("--out", required=True, help="the cache directory to write")
    export.add_argument("--prompt", default=ExportSettings.prompt)
    export.add_argument("--fps", type=float, default=ExportSettings.fps,
                        help="video frames sampled per second")
    export.add_argument("--max-frames", type=int, default=ExportSettings.max_frames)
    export.add_argument("--use-audio-in-video", action=argparse.BooleanOptionalAction,
                        default=True, help="a video's audio track goes in with it (Omni)")
    export.add_argument("--dtype", default="float32", choices=("float32", "float16",
                                                               "bfloat16"))
    export.add_argument("--device", default="auto",
                        help="auto (a GPU where there is one; under torchrun each process its "
                        "own), cpu, cuda or cuda:N")
    export.add_argument("--overwrite", action="store_true",
                        help="replace the cache at --out (only ever a feature cache)")
    export.add_argument("--no-progress", action="store_true")
    export.set_defaults(run=cmd_export, parser=export)

    verify = sub.add_parser("verify", help="check a feature cache completely")
    verify.add_argument("path")
    verify.set_defaults(run=cmd_verify, parser=verify)

    info = sub.add_parser("info", help="describe a feature cache")
    info.add_argument("path")
    info.set_defaults(run=cmd_info, parser=info)

    args = parser.parse_args(argv)
    args.argv = argv
    try:  # a bad flag, path or cache is a usage error of its subcommand (exit status 2)
        return args.run(args)
    except (CacheError, FileNotFoundError, FileExistsError, ValueError, TypeError, OSError,
            ImportError) as err:
        args.parser.error(str(err))


if __name__ == "__main__":
    sys.exit(main())
