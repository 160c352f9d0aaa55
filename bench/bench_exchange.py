"""Exchange-set construction at the paper's size: B=64 samples, M=320 AV tokens (256 visual +
64 audio), K=128 retained (Top-K of random scores), g=8, the four types (V>V, A>A, V>A, A>V).

Baseline: a per-sample, per-type Python loop (``build_exchanges_loop``).
Compared: the vectorised PyTorch reference (the CPU path) and, on CUDA, the Triton kernel
through the public ``build_exchanges`` (argument checks included: a few host syncs), through the
internal path without the checks (``build_exchanges_unchecked``, what hot loops call), and the
kernels alone (launchers only, inputs prepared outside the timing).
"""
import importlib

import pytest
import torch

from avex.kernels.exchange import EXCHANGE_TYPES, build_exchanges, build_exchanges_unchecked
from avex.kernels.exchange_ref import build_exchanges_loop, type_codes
from avex.kernels.gumbel_topk import gumbel_topk
from conftest import DEVICE, label, requires_cuda, synchronized

ex = importlib.import_module("avex.kernels.exchange")

BATCH, VISUAL, AUDIO, K, G = 64, 256, 64, 128, 8
WIDTH = VISUAL + AUDIO


def make_case(seed=0):
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(BATCH, WIDTH, generator=gen).to(DEVICE)
    modality = torch.cat([torch.zeros(BATCH, VISUAL), torch.ones(BATCH, AUDIO)], 1).long()
    indices, _ = gumbel_topk(scores, K, sample=False)
    return scores, indices, modality.to(DEVICE)


IMPLEMENTATIONS = {
    "per-sample loop (baseline)": lambda s, i, m: build_exchanges_loop(
        s, i, m, G, type_codes(EXCHANGE_TYPES))[3],
    "torch-reference": lambda s, i, m: build_exchanges(s, i, m, g=G, backend="torch").delta_f,
    "triton": lambda s, i, m: build_exchanges(s, i, m, g=G, backend="triton").delta_f,
    "triton, unchecked": lambda s, i, m: build_exchanges_unchecked(s, i, m, g=G).delta_f,
}
GPU_ONLY = {"triton", "triton, unchecked", "triton kernels only"}
CODES = type_codes(EXCHANGE_TYPES)


def kernels_only(scores, indices, modality, backward):
    """The forward kernel (and the backward kernel) through their launchers alone."""
    scores = scores.detach().contiguous()
    grad_delta = torch.ones(BATCH, len(CODES), device=scores.device)

    def step():
        removed, inserted, _, delta, _, _ = ex._launch_exchange_fwd(scores, indices, modality,
                                                                     G, CODES)
        if backward:
            ex._launch_exchange_bwd(removed, inserted, grad_delta, WIDTH, scores.dtype)
        return delta
    return step


def run_case(benchmark, impl, backward):
    if impl in GPU_ONLY and DEVICE.type != "cuda":
        pytest.skip("Triton timing needs a CUDA GPU; on a CPU it would time the interpreter")
    scores, indices, modality = make_case()
    label(benchmark, f"build_exchanges {'fwd+bwd' if backward else 'fwd'} B={BATCH} "
          f"M={WIDTH} K={K} g={G} T=4", impl)
    if impl == "triton kernels only":
        out = benchmark(synchronized(kernels_only(scores, indices, modality, backward)))
        assert out.shape == (BATCH, 4) and torch.isfinite(out).all()
        return
    scores.requires_grad_(backward)
    fn = IMPLEMENTATIONS[impl]

    def step():
        delta_f = fn(scores, indices, modality)
        if backward:
            delta_f.sum().backward()
        return delta_f

    out = benchmark(synchronized(step))
    assert out.shape == (BATCH, 4) and torch.isfinite(out).all()


ALL = [*IMPLEMENTATIONS, "triton kernels only"]


@pytest.mark.parametrize("impl", ALL)
def test_forward(benchmark, impl):
    run_case(benchmark, impl, backward=False)


@pytest.mark.parametrize("impl", ALL)
def test_forward_backward(benchmark, impl):
    run_case(benchmark, impl, backward=True)


@requires_cuda
def test_triton_matches_reference_at_benchmark_size():
    scores, indices, modality = make_case(1)
    a = build_exchanges(scores, indices, modality, g=G, backend="triton")
    b = build_exchanges(scores, indices, modality, g=G, backend="torch")
    for name in ("removed", "inserted", "group_size", "keep", "anchor"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    torch.testing.assert_close(a.delta_f, b.delta_f, rtol=1e-5, atol=1e-5)
