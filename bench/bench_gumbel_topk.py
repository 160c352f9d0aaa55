"""Gumbel-Top-K + Plackett-Luce log-prob at the paper's size: B=64, M=320 (Nv=256 + Na=64).

Baseline: the textbook PyTorch loop (K rounds of argmax, then one logsumexp per step).
Compared: the vectorised PyTorch reference (the CPU path); on CUDA the same reference under
``torch.compile`` (what a user would try first), the public ``gumbel_topk`` on Triton (argument
checks included: one host sync and ~15 small launches), the internal path without the checks
(``gumbel_topk_unchecked``, what hot loops call), and the Triton kernels alone (launchers only,
inputs prepared outside the timing).
"""
import importlib

import pytest
import torch

from avex.kernels import gumbel_topk
from avex.kernels.gumbel_topk_ref import gumbel_topk_ref, gumbel_topk_stepwise
from conftest import DEVICE, label, requires_cuda, synchronized

gt = importlib.import_module("avex.kernels.gumbel_topk")

BATCH, WIDTH = 64, 320
GPU_ONLY = {"torch-reference under torch.compile", "triton", "triton, unchecked",
            "triton kernels only"}


def rows(scores, k):
    k_rows = torch.full((BATCH,), k, dtype=torch.int64, device=scores.device)
    lengths = torch.full((BATCH,), WIDTH, dtype=torch.int64, device=scores.device)
    return k_rows, lengths


def stepwise(scores, k):
    k_rows, lengths = rows(scores, k)
    return gumbel_topk_stepwise(scores, k_rows, k, lengths, 1.0, 0, True)


_compiled_reference = torch.compile(gumbel_topk_ref, dynamic=False) if DEVICE.type == "cuda" \
    else None


def compiled_reference(scores, k):
    k_rows, lengths = rows(scores, k)
    return _compiled_reference(scores, k_rows, k, lengths, 1.0, 0, True)


def unchecked(scores, k):
    k_rows, lengths = rows(scores, k)
    return gt.gumbel_topk_unchecked(scores, k_rows, k, lengths, tau=1.0, seed=0, sample=True)


class KernelsOnly:
    """The forward kernel, and for fwd+bwd the backward kernel, called through their launchers
    with every input prepared once: what the kernels cost without checks or autograd."""

    def __init__(self, scores, k):
        self.scores, self.k = scores.detach().contiguous(), k
        self.k_rows, self.lengths = rows(scores, k)
        self.grad_logp = torch.ones(BATCH, device=scores.device)

    def forward(self):
        return gt._launch_gumbel_topk_fwd(self.scores, self.k_rows, self.k, self.lengths, 1.0,
                                          0, True)

    def forward_backward(self):
        indices, denominators, logp = self.forward()
        gt._launch_pl_bwd(self.scores, indices, self.k_rows, self.lengths, denominators, 1.0,
                          self.grad_logp)
        return indices, logp


IMPLEMENTATIONS = {
    "stepwise-loop (baseline)": stepwise,
    "torch-reference": lambda s, k: gumbel_topk(s, k, seed=0, backend="torch"),
    "torch-reference under torch.compile": compiled_reference,
    "triton": lambda s, k: gumbel_topk(s, k, seed=0, backend="triton"),
    "triton, unchecked": unchecked,
}


def run_case(benchmark, impl, k, backward):
    if impl in GPU_ONLY and DEVICE.type != "cuda":
        pytest.skip("GPU entry: Triton on a CPU would time the interpreter, and torch.compile "
                    "is compared on the GPU only")
    scores = torch.randn(BATCH, WIDTH, device=DEVICE, requires_grad=backward)
    label(benchmark, f"gumbel_topk {'fwd+bwd' if backward else 'fwd'} B={BATCH} M={WIDTH} "
          f"K={k}", impl)
    if impl == "triton kernels only":
        kernels = KernelsOnly(scores, k)
        out = benchmark(synchronized(kernels.forward_backward if backward else kernels.forward))
        assert torch.isfinite(out[-1]).all()
        return
    fn = IMPLEMENTATIONS[impl]

    def step():
        _, log_prob = fn(scores, k)
        if backward:
            log_prob.sum().backward()
        return log_prob

    out = benchmark(synchronized(step))
    assert torch.isfinite(out).all()


ALL = [*IMPLEMENTATIONS, "triton kernels only"]


@pytest.mark.parametrize("impl", ALL)
@pytest.mark.parametrize("k", [32, 64, 128])
def test_forward(benchmark, impl, k):
    run_case(benchmark, impl, k, backward=False)


@pytest.mark.parametrize("impl", ALL)
@pytest.mark.parametrize("k", [32, 64, 128])
def test_forward_backward(benchmark, impl, k):
    run_case(benchmark, impl, k, backward=True)


@requires_cuda
def test_triton_matches_reference_at_benchmark_size():
    scores = torch.randn(BATCH, WIDTH, device="cuda")
    a = gumbel_topk(scores, 128, seed=3, backend="triton")
    b = gumbel_topk(scores, 128, seed=3, backend="torch")
    assert torch.equal(a[0], b[0])
    torch.testing.assert_close(a[1], b[1], rtol=1e-5, atol=1e-5)
    kernels = KernelsOnly(scores, 128)
    kernels_indices = gt._launch_gumbel_topk_fwd(scores, kernels.k_rows, 128, kernels.lengths,
                                                 1.0, 3, True)[0]
    assert torch.equal(kernels_indices, a[0])
