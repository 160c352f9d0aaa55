"""``python -m avex.profiling``: the paper's Table 4 for a backbone on this machine: FLOPs at
real size (fvcore, 1 multiply-add = 1 flop; the hand count where fvcore is missing), then
prefill / end-to-end latency, selection overhead and peak memory per method (on a CPU, of a
scaled-down model)."""
from __future__ import annotations

import argparse
import sys

from avex.set_selection import SELECTIONS
from avex.training.config import DEFAULT_REDUNDANCY

from .methods import PROFILED
from .settings import FLOPS_COUNTERS, ProfileSettings
from .suite import profile


def main(argv=None) -> int:
    d = ProfileSettings()
    p = argparse.ArgumentParser(prog="python -m avex.profiling", description=__doc__)
    p.add_argument("--backbone", default=d.backbone,
                   help="qwen2-7b, llama3-8b, or a path to a Hugging Face config")
    p.add_argument("--retention", type=float, default=d.retention, help="rho in (0, 1]")
    p.add_argument("--methods", default=",".join(d.methods),
                   help=f"comma-separated, from {list(PROFILED)} (fastv: FastV-AV, tome: "
                        "ToMe-AV, fastav: FastAV, attention: Attention-AV (balanced), as "
                        "avex.methods runs them)")
    p.add_argument("--visual-tokens", type=int, default=d.visual_tokens)
    p.add_argument("--audio-tokens", type=int, default=d.audio_tokens)
    p.add_argument("--text-before", type=int, default=d.text_before,
                   help="prompt tokens before the AV tokens")
    p.add_argument("--text-after", type=int, default=d.text_after,
                   help="prompt tokens after the AV tokens")
    p.add_argument("--decode-tokens", type=int, default=d.decode_tokens,
                   help="forced decode length, the same for every method")
    p.add_argument("--device", default=d.device, help="auto, cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", default=d.dtype,
                   help="auto (bfloat16 on CUDA, float32 on CPU), bfloat16, float16, float32")
    p.add_argument("--policy-hidden-size", type=int, default=d.policy_hidden_size,
                   help="policy width at the real size (768: the paper's ~30M policy; 0: as "
                        "wide as the LLM); scaled with the model for the CPU configuration")
    p.add_argument("--selection", default=d.selection, choices=SELECTIONS,
                   help="the policy's selection rule (default: %(default)s; the default "
                        "training recipe serves set-aware, --redundancy 4)")
    p.add_argument("--redundancy", type=float, default=None,
                   help="set-aware's redundancy weight (default: the training recipe's, "
                        f"{DEFAULT_REDUNDANCY['set-aware']:g}, with --selection set-aware)")
    p.add_argument("--runs", type=int, default=None, help="timed runs (default 50 CUDA, 10 CPU)")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--no-latency", action="store_true", help="FLOPs only")
    p.add_argument("--flops", default=d.flops, choices=FLOPS_COUNTERS,
                   help="auto: fvcore where installed, else the hand count (the table says "
                        "which); fvcore: fail up front without it; hand: no tracing (instant)")
    p.add_argument("--max-seconds", type=float, default=d.max_seconds,
                   help="start no timing round after this many seconds from the start (at "
                        "least one runs; the table says how many did)")
    p.add_argument("--full-size-latency", action="store_true",
                   help="time the real-size model even on a CPU")
    p.add_argument("--out-dir", default=d.out_dir,
                   help="default: runs/profiling-<date-time>; results/ holds the committed "
                        "tables (scripts/regenerate_results.sh passes --out-dir results)")
    p.add_argument("--name", default=None, help="file stem: profiling-<name>.{md,json,png}")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    settings = ProfileSettings(
        backbone=a.backbone, retention=a.retention,
        methods=tuple(m.strip() for m in a.methods.split(",") if m.strip()),
        visual_tokens=a.visual_tokens, audio_tokens=a.audio_tokens, text_before=a.text_before,
        text_after=a.text_after, decode_tokens=a.decode_tokens, device=a.device, dtype=a.dtype,
        policy_hidden_size=a.policy_hidden_size, selection=a.selection,
        redundancy=DEFAULT_REDUNDANCY[a.selection] if a.redundancy is None else a.redundancy,
        runs=a.runs, warmup=a.warmup,
        latency=not a.no_latency, flops=a.flops, max_seconds=a.max_seconds,
        full_size_latency=True if a.full_size_latency else None,
        out_dir=a.out_dir, name=a.name, progress=not a.no_progress)
    try:  # every flag is checked before any model is built; a bad one is a usage error
        settings.validate()
    except (ValueError, TypeError) as e:
        p.error(str(e))
    try:  # what only a built model shows (its size, its family) is a usage error too
        results = profile(settings)
    except ValueError as e:
        p.error(str(e))
    print(results["markdown"])
    print("wrote " + ", ".join(results["files"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
