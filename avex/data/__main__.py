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
import sys
import time
from pathlib import Path

import torch

from .. import _checks
from .cache import SPLITS, CacheError, FeatureCache
from .captions import ExportError, media_rows, read_captions
from .export import ExportSettings, export_cache, load_model
from .processor import load_processor
from .embedded import (PRESETS, benchmark_name, build_benchmark, default_benchmark_path,
                       resolve_config)

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


def cmd_build(args) -> int:
    cfg = resolve_config(args.preset, seed=args.seed, **_overrides(args))
    out = Path(args.out) if args.out else default_benchmark_path(
        args.preset, args.cache_dir, seed=args.seed, **_overrides(args))
    if (out / "meta.json").is_file() and not args.overwrite:
        print(f"benchmark already built at {out} (pass --overwrite to rebuild)")
        return 0
    _checks.output_dir("out" if args.out else "cache_dir", str(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    build_benchmark(out, cfg, preset=args.preset, overwrite=args.overwrite,
                    progress=not args.no_progress)
    print(f"built {benchmark_name(cfg, args.preset)}: {cfg.train}/{cfg.val}/{cfg.test}/"
          f"{cfg.transfer} train/val/test/transfer clips, Nv={cfg.n_visual}, Na={cfg.n_audio}, "
          f"d={cfg.dim} -> {out} in {time.perf_counter() - started:.1f} s")
    return 0


def cmd_export(args) -> int:
    settings = ExportSettings(prompt=args.prompt, fps=args.fps, max_frames=args.max_frames,
                              use_audio_in_video=args.use_audio_in_video, dtype=args.dtype)
    # settings, captions, media and output path are checked before the model loads
    settings.validate()
    _checks.output_dir("out", args.out)
    _checks.available_device("device", args.device)
    if args.captions is not None:
        read_captions(args.captions, args.media)
    else:
        media_rows(args.media, args.split)
    if not Path(args.model, "config.json").is_file():
        raise ExportError(f"--model: {args.model!r} is not a Hugging Face model directory "
                          "(no config.json)")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and world > 1:   # each process its own GPU
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    model = load_model(args.model, device)
    processor = load_processor(args.processor or args.model, model)
    launcher = f"torchrun --nproc-per-node {world} -m avex.data " if world > 1 else \
        "python -m avex.data "
    started = time.perf_counter()
    try:
        out = export_cache(args.media, args.captions, args.out, model=model,
                           processor=processor, settings=settings, overwrite=args.overwrite,
                           progress=not args.no_progress, split=args.split,
                           resume_command=launcher + shlex.join(args.argv))
    except KeyboardInterrupt as stop:   # ExportInterrupted, or a second Ctrl-C mid-clip
        resume = getattr(stop, "resume", launcher + shlex.join(args.argv))
        print(f"\n{stop if str(stop) else 'export stopped'}; the clips done are kept in "
              f"{Path(args.out).parent / ('.' + Path(args.out).name + '.export')}; resume "
              f"with: {resume}", file=sys.stderr)
        return 130
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
    export.add_argument("--split", default="train", choices=SPLITS,
                        help="the split of every clip when there is no --captions file")
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
