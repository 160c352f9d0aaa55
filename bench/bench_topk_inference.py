"""Inference-time Top-K selection at the paper's size: B=64 rows, M=320 policy scores (Nv=256 +
Na=64), K in {32, 128} (10% and 40%), float32.

Baseline: ``torch.topk`` (what one would write; its tie order isn't specified).
Compared: ``gumbel_topk(sample=False)`` on the PyTorch reference, on Triton and on the CUDA C++
library (indices + the log-probability), the library's ``avex_topk_rows`` alone (indices
only, as a C++ serving stack calls it), the Triton path without argument checks
(``gumbel_topk_unchecked``) and the Triton forward kernel alone (its launcher, inputs prepared
outside the timing). The GPU entries skip without CUDA.
"""
import importlib

import pytest
import torch

from avex.kernels import gumbel_topk
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
    if impl in GPU_ONLY and DEVICE.type != "cuda":
        pytest.skip("GPU kernels: timing needs a CUDA GPU")
    scores = torch.randn(BATCH, WIDTH, device=DEVICE)
    step = IMPLEMENTATIONS[impl](scores, k)
    label(benchmark, f"inference top-k (sample=False) B={BATCH} M={WIDTH} K={k} float32",
          impl)
    out = benchmark(synchronized(step))
    chosen = out[0] if isinstance(out, tuple) else out
    want = torch.sort(scores.topk(k, dim=1).indices, dim=1).values
    assert torch.equal(torch.sort(chosen, dim=1).values, want)  # random scores: no ties
