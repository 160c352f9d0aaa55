"""The measurements of ``bench/gpu.sh first-light``: one part per call, each appending JSON rows.

    python bench/first_light.py p1 ROWS.jsonl           # Gumbel-Top-K + PL, fwd+bwd
    python bench/first_light.py p1-compile ROWS.jsonl   # the same under torch.compile
    python bench/first_light.py p2 ROWS.jsonl           # compaction against copy_ bandwidth
    python bench/first_light.py p9 ROWS.jsonl           # one AVEX training step, its generation
    python bench/first_light.py table ROWS.jsonl --machine M --tests XML --title T

- P1: ``gumbel_topk`` forward + backward, B=64, M=320, K=128 (the paper's 256 visual + 64 audio
  tokens at 40%). Baseline: the eager PyTorch reference (the CPU path). Compared: the same
  reference under ``torch.compile``, the public Triton path, its unchecked internal path, the
  Triton kernels alone, and the textbook loop of K argmaxes.
- P2: compaction, bf16 (float32 on a CPU), D=3584, B=64, L=400, S=5 keep-sets per sample.
  Baseline: boolean indexing + ``pad_sequence``. Ceiling: ``copy_`` of as many bytes.
- P9: one optimiser step of the default recipe (RLOO over 8 anchors, batch 32 in micro-batches
  of 16) on the embedded benchmark with its shipped captioner, at two retentions: the step's
  median time, and the share of it spent captioning the keep-sets (``generate_tokens``:
  compaction, prefill and greedy decoding) and scoring them (CIDEr-D on the host).

Every case is timed as the median of ``--rounds`` rounds (20 by default) after warm-up, with
CUDA events on a GPU and ``perf_counter`` on a CPU (the dry run). The parts run in separate
processes so that ``gpu.sh`` can bound each one's time; a part that fails writes a row saying
so and the others still run. The P1 and P2 cases reuse ``bench_gumbel_topk`` and
``bench_compact``'s implementations, so the baselines are the ones ``pytest bench/`` times.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:  # the dry run's small checks run Triton under the interpreter (set before import)
    os.environ.setdefault("TRITON_INTERPRET", "1")
DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")


# ----------------------------------------------------------------------------------------------
# Timing and rows
# ----------------------------------------------------------------------------------------------

def sync():
    if HAS_CUDA:
        torch.cuda.synchronize()


def time_rounds(fn, rounds: int, warmup: int = 3) -> list[float]:
    """Milliseconds of each of ``rounds`` calls of ``fn`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(rounds):
        if HAS_CUDA:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def summary(times: list[float]) -> dict:
    q = statistics.quantiles(times, n=4) if len(times) >= 2 else [times[0]] * 3
    return {"median_ms": statistics.median(times), "p25_ms": q[0], "p75_ms": q[2],
            "rounds": len(times)}


class Rows:
    """Appends one JSON object per line to ``path``, flushed at once: a part stopped by its
    time limit keeps every row it finished."""

    def __init__(self, path: str, part: str):
        self.path, self.part = Path(path), part

    def add(self, **row):
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"part": self.part, **row}) + "\n")
        shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}
        print(f"[{self.part}] {shown}", flush=True)

    def case(self, impl: str, fn, rounds: int, *, baseline=False, warmup=3, **extra):
        """Time ``fn`` and add its row; an exception becomes a row with the error."""
        try:
            self.add(impl=impl, baseline=baseline, **summary(time_rounds(fn, rounds, warmup)),
                     **extra)
        except Exception as err:  # noqa: BLE001 -- the row reports it, the part goes on
            traceback.print_exc()
            self.add(impl=impl, baseline=baseline, error=f"{type(err).__name__}: {err}"[:300])

    def skip(self, impl: str, why: str):
        self.add(impl=impl, skipped=why)


# ----------------------------------------------------------------------------------------------
# P1: Gumbel-Top-K + Plackett-Luce log-probability, forward and backward
# ----------------------------------------------------------------------------------------------

P1_K = 128


def p1_step(fn, scores, k):
    def step():
        scores.grad = None
        _, log_prob = fn(scores, k)
        log_prob.sum().backward()
    return step


def p1_check(batch: int, width: int, k: int) -> str:
    """The Triton path against the reference: same indices, log-prob and gradient within
    float32 rounding. Returns a short verdict for the table. (On a CPU, the dry run, Triton
    runs under the interpreter: a small size.)"""
    from avex.kernels import gumbel_topk

    scores = torch.randn(batch, width, device=DEVICE)
    a, b = scores.clone().requires_grad_(), scores.clone().requires_grad_()
    ia, la = gumbel_topk(a, k, seed=11, backend="triton")
    ib, lb = gumbel_topk(b, k, seed=11, backend="torch")
    la.sum().backward()
    lb.sum().backward()
    same = torch.equal(ia, ib)
    err_lp = float((la - lb).abs().max())
    err_grad = float((a.grad - b.grad).norm() / b.grad.norm())
    ok = same and err_lp < 1e-3 and err_grad < 1e-3
    return (f"{'ok' if ok else 'MISMATCH'} at B={batch} M={width} K={k}: indices "
            f"{'equal' if same else 'differ'}, max |dlogp| {err_lp:.1e}, relative gradient "
            f"error {err_grad:.1e}")


def checked(rows: Rows, case: str, check, *args):
    """A correctness check's verdict as a row; an exception is a verdict too."""
    try:
        verdict = check(*args)
    except Exception as err:  # noqa: BLE001
        traceback.print_exc()
        verdict = f"ERROR {type(err).__name__}: {err}"[:300]
    rows.add(impl="check", case=case, check=verdict)


def part_p1(rows: Rows, rounds: int):
    import bench_gumbel_topk as bg

    case = f"gumbel_topk fwd+bwd B={bg.BATCH} M={bg.WIDTH} K={P1_K} fp32"
    scores = torch.randn(bg.BATCH, bg.WIDTH, device=DEVICE, requires_grad=True)
    rows.case("torch reference, eager (baseline)", p1_step(bg.IMPLEMENTATIONS["torch-reference"],
              scores, P1_K), rounds, baseline=True, case=case)
    if not HAS_CUDA:
        checked(rows, case, p1_check, 4, 40, 16)
        for impl in ("triton", "triton, unchecked", "triton kernels only"):
            rows.skip(impl, "needs CUDA (Triton on a CPU would time the interpreter)")
    else:
        checked(rows, case, p1_check, bg.BATCH, bg.WIDTH, P1_K)
        rows.case("triton (public gumbel_topk)", p1_step(bg.IMPLEMENTATIONS["triton"], scores,
                  P1_K), rounds, case=case)
        rows.case("triton, unchecked", p1_step(bg.unchecked, scores, P1_K), rounds, case=case)
        kernels = bg.KernelsOnly(scores, P1_K)
        rows.case("triton kernels only", kernels.forward_backward, rounds, case=case)
    rows.case("textbook loop of K argmaxes", p1_step(bg.stepwise, scores, P1_K),
              max(3, rounds // 4), case=case)


def part_p1_compile(rows: Rows, rounds: int):
    import bench_gumbel_topk as bg

    case = f"gumbel_topk fwd+bwd B={bg.BATCH} M={bg.WIDTH} K={P1_K} fp32"
    if not HAS_CUDA:
        rows.skip("torch reference under torch.compile", "compared on the GPU only")
        return
    scores = torch.randn(bg.BATCH, bg.WIDTH, device=DEVICE, requires_grad=True)
    step = p1_step(bg.compiled_reference, scores, P1_K)
    t0 = time.perf_counter()
    try:
        step()
        sync()
    except Exception as err:  # noqa: BLE001
        traceback.print_exc()
        rows.add(impl="torch reference under torch.compile", case=case,
                 error=f"{type(err).__name__}: {err}"[:300])
        return
    compile_s = time.perf_counter() - t0
    rows.case("torch reference under torch.compile", step, rounds, case=case,
              compile_s=round(compile_s, 1))


# ----------------------------------------------------------------------------------------------
# P2: compaction against copy_ bandwidth
# ----------------------------------------------------------------------------------------------

P2_FEATURES = 3584
P2_DRY_RUN_BATCH = 8


def part_p2(rows: Rows, rounds: int):
    import bench_compact as bc
    from avex.kernels.compact import compact

    hidden, keep = bc.make_case(P2_FEATURES)
    if not HAS_CUDA:  # the dry run: 8 samples, so that a busy CPU still ends inside the cap
        hidden, keep = hidden[:P2_DRY_RUN_BATCH], keep[:P2_DRY_RUN_BATCH]
    moved = bc.bytes_moved(keep, P2_FEATURES)
    dtype = str(bc.DTYPE).replace("torch.", "")
    case = (f"compact fwd B={hidden.shape[0]} L={bc.WIDTH} S={bc.SETS} D={P2_FEATURES} "
            f"{dtype}")

    def check(hidden, keep):
        ours = compact(hidden, keep, backend="triton")
        ref = compact(hidden, keep, backend="torch")
        ok = all(torch.equal(getattr(ours, name), getattr(ref, name))
                 for name in ("hidden", "attention_mask", "position_ids"))
        return (f"{'ok' if ok else 'MISMATCH'} at {tuple(hidden.shape)}, {keep.shape[1]} sets: "
                f"the Triton output {'equals' if ok else 'differs from'} the reference's")
    # the dry run checks a slice under the interpreter
    checked(rows, case, check, *((hidden, keep) if HAS_CUDA else (hidden[:2, :, :8], keep[:2])))
    impls = ["bool-index + pad_sequence (baseline)", "torch-reference", "triton",
             "triton gather kernel only", "copy_ of the same bytes (ceiling)",
             "clone() of the same bytes (fresh output)"]
    for impl in impls:
        if impl.startswith("triton") and not HAS_CUDA:
            rows.skip(impl, "needs CUDA (Triton on a CPU would time the interpreter)")
            continue
        fn = bc.IMPLEMENTATIONS[impl](hidden, keep)
        try:
            times = time_rounds(fn, rounds)
        except Exception as err:  # noqa: BLE001
            traceback.print_exc()
            rows.add(impl=impl, case=case, error=f"{type(err).__name__}: {err}"[:300])
            continue
        stats = summary(times)
        rows.add(impl=impl, case=case, baseline=impl.endswith("(baseline)"), **stats,
                 bytes=moved, gb_per_s=round(moved / stats["median_ms"] / 1e6, 1))


# ----------------------------------------------------------------------------------------------
# P9: one AVEX training step, and the share of it spent generating captions
# ----------------------------------------------------------------------------------------------

class Stopwatch:
    """Wraps a method so that the seconds spent inside it (device work included) add up."""

    def __init__(self, owner, name: str):
        self.seconds = 0.0
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            sync()
            t0 = time.perf_counter()
            out = inner(*args, **kwargs)
            sync()
            self.seconds += time.perf_counter() - t0
            return out
        setattr(owner, name, timed)


def part_p9(rows: Rows, steps: int, preset: str, cache_dir: str | None, batch: int,
            micro: int, retentions: list[float]):
    from avex.cache_and_captioner import resolve_asset_paths
    from avex.training.config import TrainConfig
    from avex.reward import CiderD
    from avex.training.loop import load_run_inputs
    from avex.training.steps import batch_indices, rl_loss, sample_seed

    # arm A's step (CIDEr, Top-K), the recipe P9's committed figure measured; the default's
    # fidelity reward needs y_full per clip first (python -m avex.train caches it)
    cfg = TrainConfig(benchmark_preset=preset, captioner_preset=preset, cache_dir=cache_dir,
                      batch_size=batch, micro_batch_size=micro, progress=False,
                      reward="cider", selection="topk")
    t0 = time.perf_counter()
    data_path, captioner_path = resolve_asset_paths(
        cfg.data, cfg.captioner, benchmark_preset=preset, captioner_preset=preset,
        cache_dir=cache_dir, progress=False)
    cache, captioner, policy = load_run_inputs(cfg, data_path, captioner_path, DEVICE)
    split = cache.split("train")
    clips = [split[i] for i in range(len(split))]
    cider = CiderD(corpus_references=[c.refs_av for c in clips], tokenize=True)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr)
    generation = Stopwatch(captioner, "generate_tokens")
    scoring = Stopwatch(cider, "score")
    print(f"[P9] assets ready in {time.perf_counter() - t0:.1f} s: {data_path.name}, "
          f"{len(clips)} training clips, captioner {captioner_path.name}", flush=True)

    def one_step(step: int, retention: float) -> dict:
        indices = batch_indices(step, cfg.batch_size, len(clips), cfg.seed, "rl")
        chunks = [indices[i:i + cfg.micro_batch_size]
                  for i in range(0, len(indices), cfg.micro_batch_size)]
        generation.seconds = scoring.seconds = 0.0
        sync()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        rewards = []
        for i, chunk in enumerate(chunks):
            batch_clips = [clips[j] for j in chunk]
            terms = rl_loss(cfg, policy, captioner, cider, captioner.embed(batch_clips),
                            batch_clips, sample_seed(cfg.seed, step, i), retention)
            (terms["loss"] * len(chunk) / cfg.batch_size).backward()
            rewards.append(float(terms["reward"]))
        torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
        optimizer.step()
        sync()
        return {"step_s": time.perf_counter() - start, "generation_s": generation.seconds,
                "scoring_s": scoring.seconds, "reward": statistics.mean(rewards)}

    case = (f"RL step: batch {cfg.batch_size} (micro {cfg.micro_batch_size}), "
            f"{cfg.anchors} anchors, {cfg.max_new_tokens} new tokens, {preset} benchmark")
    for retention in retentions:
        one_step(0, retention)   # warm-up: kernels compiled, allocator filled
        timed = [one_step(step, retention) for step in range(1, steps + 1)]
        med = {k: statistics.median(t[k] for t in timed) for k in timed[0]}
        rows.add(impl=f"AVEX step at {retention:.0%}", case=case, retention=retention,
                 steps=steps, step_ms=med["step_s"] * 1e3,
                 generation_ms=med["generation_s"] * 1e3,
                 generation_share=statistics.median(t["generation_s"] / t["step_s"]
                                                    for t in timed),
                 scoring_share=statistics.median(t["scoring_s"] / t["step_s"] for t in timed),
                 reward=med["reward"])


# ----------------------------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------------------------

def fmt_ms(ms: float) -> str:
    return f"{ms * 1e3:.0f} us" if ms < 1 else f"{ms:.2f} ms" if ms < 100 else f"{ms:.0f} ms"


def timing_table(part_rows: list[dict]) -> str:
    from avex.tables import markdown_table

    base = next((r["median_ms"] for r in part_rows if r.get("baseline") and "median_ms" in r),
                None)
    ceiling = next((r["median_ms"] for r in part_rows
                    if "(ceiling)" in r.get("impl", "") and "median_ms" in r), None)
    lines, notes = [], []
    for r in part_rows:
        if r.get("impl") == "check":
            notes.append(f"- check: {r['check']}")
            continue
        if "median_ms" not in r:
            lines.append([r["impl"], "-", "-", "-", "-", r.get("error") or r.get("skipped", "-")])
            continue
        extra = []
        if "gb_per_s" in r:
            extra.append(f"{r['gb_per_s']} GB/s")
            if ceiling is not None and "(ceiling)" not in r["impl"]:
                extra.append(f"{ceiling / r['median_ms']:.0%} of copy_")
        if "compile_s" in r:
            extra.append(f"first call (compile) {r['compile_s']} s")
        lines.append([r["impl"], fmt_ms(r["median_ms"]),
                      f"{fmt_ms(r['p25_ms'])} - {fmt_ms(r['p75_ms'])}", r["rounds"],
                      f"{base / r['median_ms']:.2f}x" if base else "-", "; ".join(extra)])
    table = markdown_table(["implementation", "median", "p25 - p75", "rounds",
                            "vs baseline", "notes"], lines)
    return table + ("\n\n" + "\n".join(notes) if notes else "")


def p9_table(part_rows: list[dict]) -> str:
    from avex.tables import markdown_table

    lines = []
    for r in part_rows:
        if "step_ms" not in r:
            lines.append([r.get("impl", "-"), "-", "-", "-", "-", "-",
                          r.get("error") or r.get("skipped", "-")])
            continue
        lines.append([r["impl"], r["steps"], fmt_ms(r["step_ms"]), fmt_ms(r["generation_ms"]),
                      f"{r['generation_share']:.0%}", f"{r['scoring_share']:.0%}",
                      f"mean anchor reward {r['reward']:.1f}"])
    return markdown_table(["step", "timed steps", "median step", "median generation",
                           "generation share", "CIDEr-D share", "notes"], lines)


PARTS = {"tests": "Tests: the CUDA paths of the kernel suites",
         "P1": "P1: Gumbel-Top-K + Plackett-Luce log-probability, forward and backward",
         "P2": "P2: compaction against copy_ bandwidth",
         "P9": "P9: one AVEX training step on the embedded benchmark"}


def build_table(rows_file: str, machine: str | None, tests_xml: str | None, title: str) -> str:
    rows = []
    if Path(rows_file).is_file():
        rows = [json.loads(line) for line in Path(rows_file).read_text().splitlines() if line]
    out = [f"# {title}", ""]
    if machine and Path(machine).is_file():
        out += ["```", Path(machine).read_text().strip(), "```", ""]
    exits = {r["part"]: r for r in rows if "exit" in r}
    for part, heading in PARTS.items():
        out += [f"## {heading}", ""]
        if part == "tests":
            if tests_xml and Path(tests_xml).is_file():
                sys.path.insert(0, str(Path(__file__).parent))
                from gpu_tables import tests_table
                out.append(tests_table(tests_xml))
            else:
                out.append("No test report was written.")
        else:
            part_rows = [r for r in rows if r["part"] in (part, f"{part}-compile")
                         and "exit" not in r]
            if part_rows:
                cases = dict.fromkeys(r.get("case") for r in part_rows if r.get("case"))
                out += [f"Case: {', '.join(cases)}.", ""] if cases else []
                out.append(p9_table(part_rows) if part == "P9" else timing_table(part_rows))
            else:
                out.append("No rows were written.")
        for name in (part, f"{part}-compile"):
            if name in exits and exits[name]["exit"] != 0:
                why = ("stopped at its time limit" if exits[name]["exit"] in (124, 137)
                       else f"exit status {exits[name]['exit']}")
                out += ["", f"**{name} did not finish: {why} after {exits[name]['seconds']} s** "
                            "(its log is first-light.log)."]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=("p1", "p1-compile", "p2", "p9", "table"))
    parser.add_argument("rows", help="the JSON-lines file the parts append to")
    parser.add_argument("--rounds", type=int, default=20, help="timed rounds a case (median)")
    parser.add_argument("--steps", type=int, default=5, help="P9: timed steps a retention")
    parser.add_argument("--preset", default="default", help="P9: benchmark and captioner preset")
    parser.add_argument("--cache-dir", default=None, help="P9: the embedded assets' root")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--micro-batch-size", type=int, default=16)
    parser.add_argument("--retentions", default="0.4,0.1")
    parser.add_argument("--machine", help="table: machine.txt")
    parser.add_argument("--tests", help="table: the CUDA tests' JUnit XML")
    parser.add_argument("--title", default="bench/gpu.sh first-light")
    args = parser.parse_args(argv)
    if args.rounds < 20 and HAS_CUDA:
        parser.error(f"--rounds must be at least 20 on a GPU (medians of 20 rounds); "
                     f"got {args.rounds}")
    if args.part == "table":
        print(build_table(args.rows, args.machine, args.tests, args.title), end="")
        return
    rows = Rows(args.rows, {"p1": "P1", "p1-compile": "P1-compile", "p2": "P2", "p9": "P9"}[
        args.part])
    if args.part == "p1":
        part_p1(rows, args.rounds)
    elif args.part == "p1-compile":
        part_p1_compile(rows, args.rounds)
    elif args.part == "p2":
        part_p2(rows, args.rounds)
    else:
        part_p9(rows, args.steps, args.preset, args.cache_dir, args.batch_size,
                args.micro_batch_size, [float(r) for r in args.retentions.split(",")])


if __name__ == "__main__":
    main()
