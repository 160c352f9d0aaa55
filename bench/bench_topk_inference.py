"""Inference-time Top-K selection at the paper's size: B=64 rows, M=320 policy scores (Nv=256 +
Na=64), K in {32, 128} (10% and 40%), float32.

Baseline: ``torch.topk`` (what one would write; its tie order isn't specified).
Compared: ``gumbel_topk(sample=False)`` with no gradient wanted (indices only, the inference
path) on the PyTorch path, on Triton and on the CUDA C++ library, the library's
``avex_topk_rows`` alone (as a C++ serving stack calls it), the Triton path without argument
checks (``gumbel_topk_unchecked``) and the Triton forward kernel alone (its launcher, inputs
prepared outside the timing). The GPU entries skip without CUDA. ``test_inference_topk_paired``
is the goal's measurement: the paths alternated within each round and the median of the
per-round ratios (``avex.profiling.latency``).
"""
import importlib

import pytest
import torch

from avex.kernels import gumbel_topk
from avex.profiling.latency import alternate, timed, timing_threads, timing_threads_set
from conftest import DEVICE, label, synchronized

cuda_lib = importlib.import_module("avex.kernels.cuda_lib")
gt = importlib.import_module("avex.kernels.gumbel_topk")

BATCH, WIDTH = 64, 320
GPU_ONLY = {"triton", "cuda-library", "cuda-library topk_rows only", "triton, unchecked",
            "triton kernel only"}


def rows(scores, k):
    return (torch.full((scores.shape[0],), k, dtype=torch.int64, device=scores.device),
            torch.full((scores.shape[0],), scores.shape[1], dtype=torch.int64,
                       device=scores.device))


def unchecked(scores, k):
    k_rows, lengths = rows(scores, k)
    return lambda: gt.gumbel_topk_unchecked(scores, k_rows, k, lengths, tau=1.0, seed=0,
                                            sample=False)


def kernel_only(scores, k):
    k_rows, lengths = rows(scores, k)
    return lambda: gt._launch_gumbel_topk_fwd(scores, k_rows, k, lengths, 1.0, 0, False)[0]


def library_topk(scores, k):
    k_rows = torch.full((scores.shape[0],), k, dtype=torch.int64, device=scores.device)
    lib = cuda_lib.load()
    return lambda: lib.topk_rows(scores, k_rows, k)


IMPLEMENTATIONS = {
    "torch.topk (baseline)": lambda s, k: (lambda: s.topk(k, dim=1).indices),
    "torch-reference": lambda s, k: (lambda: gumbel_topk(s, k, sample=False, backend="torch")),
    "triton": lambda s, k: (lambda: gumbel_topk(s, k, sample=False, backend="triton")),
    "cuda-library": lambda s, k: (lambda: gumbel_topk(s, k, sample=False, backend="cuda")),
    "cuda-library topk_rows only": library_topk,
    "triton, unchecked": unchecked,
    "triton kernel only": kernel_only,
}


@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))
@pytest.mark.parametrize("k", [32, 128])
def test_inference_topk(benchmark, impl, k):
    if DEVICE.type != "cuda":
        pytest.skip("GPU kernels: timing needs a CUDA GPU" if impl in GPU_ONLY else
                    "on a CPU test_inference_topk_paired times this (alternating rounds); "
                    "pytest-benchmark's back-to-back rounds would time the machine's load")
    scores = torch.randn(BATCH, WIDTH, device=DEVICE)
    step = IMPLEMENTATIONS[impl](scores, k)
    label(benchmark, f"inference top-k (sample=False) B={BATCH} M={WIDTH} K={k} float32",
          impl)
    out = benchmark(synchronized(step))
    chosen = out[0] if isinstance(out, tuple) else out
    want = torch.sort(scores.topk(k, dim=1).indices, dim=1).values
    assert torch.equal(torch.sort(chosen, dim=1).values, want)  # random scores: no ties


PAIRED_ROUNDS, CALLS_PER_ROUND = 300, 20


@pytest.mark.parametrize("k", [32, 128])
def test_inference_topk_paired(benchmark, k):
    """The goal's measurement: ``gumbel_topk(sample=False)`` (no gradient wanted: the inference
    path, no log-probability) against ``torch.topk``, alternated within each round, the median
    of the per-round ratios."""
    scores = torch.randn(BATCH, WIDTH, device=DEVICE)
    baseline = "torch.topk (baseline)"
    calls = {baseline: lambda: scores.topk(k, dim=1).indices,
             "gumbel_topk(sample=False)": lambda: gumbel_topk(scores, k, sample=False)}
    if DEVICE.type == "cuda":
        calls["gumbel_topk(sample=False, backend='torch')"] = \
            lambda: gumbel_topk(scores, k, sample=False, backend="torch")
    label(benchmark, f"inference top-k, paired rounds, B={BATCH} M={WIDTH} K={k} float32",
          "all (whole paired measurement)")
    with timing_threads_set(DEVICE):
        runs = {name: timed(fn, DEVICE, repeat=CALLS_PER_ROUND) for name, fn in calls.items()}
        results = benchmark.pedantic(lambda: alternate(runs, rounds=PAIRED_ROUNDS, warmup=5),
                                     rounds=1, iterations=1)
    benchmark.extra_info["paired"] = dict(
        group=f"inference top-k B={BATCH} M={WIDTH} K={k} float32", baseline=baseline,
        results=results,
        what=f"{PAIRED_ROUNDS} alternating rounds of {CALLS_PER_ROUND} calls each"
             + ("" if DEVICE.type == "cuda" else f", {timing_threads()} CPU thread(s)"))
    indices, log_prob = gumbel_topk(scores, k, sample=False)
    assert log_prob is None
    assert torch.equal(indices, scores.topk(k, dim=1).indices)  # random scores: no ties
