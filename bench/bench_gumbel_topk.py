"""Gumbel-Top-K + Plackett-Luce log-prob at the paper's size: B=64, M=320 (Nv=256 + Na=64).

Baseline: the textbook PyTorch loop (K rounds of argmax, then one logsumexp per step).
Compared: the vectorised PyTorch reference (the CPU path) and, on CUDA, the Triton kernel.
"""
import pytest
import torch

from avex.kernels import gumbel_topk
from avex.kernels.gumbel_topk_ref import gumbel_topk_stepwise
from conftest import DEVICE, label, requires_cuda, synchronized

BATCH, WIDTH = 64, 320


def stepwise(scores, k):
    k_rows = torch.full((BATCH,), k, device=scores.device)
    lengths = torch.full((BATCH,), WIDTH, device=scores.device)
    return gumbel_topk_stepwise(scores, k_rows, k, lengths, 1.0, 0, True)


IMPLEMENTATIONS = {
    "stepwise-loop (baseline)": stepwise,
    "torch-reference": lambda s, k: gumbel_topk(s, k, seed=0, backend="torch"),
    "triton": lambda s, k: gumbel_topk(s, k, seed=0, backend="triton"),
}


def run_case(benchmark, impl, k, backward):
    if impl == "triton" and DEVICE.type != "cuda":
        pytest.skip("Triton timing needs a CUDA GPU; on a CPU it would time the interpreter")
    fn = IMPLEMENTATIONS[impl]
    scores = torch.randn(BATCH, WIDTH, device=DEVICE, requires_grad=backward)

    def step():
        _, log_prob = fn(scores, k)
        if backward:
            log_prob.sum().backward()
        return log_prob

    label(benchmark, f"gumbel_topk {'fwd+bwd' if backward else 'fwd'} B={BATCH} M={WIDTH} "
          f"K={k}", impl)
    out = benchmark(synchronized(step))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))
@pytest.mark.parametrize("k", [32, 64, 128])
def test_forward(benchmark, impl, k):
    run_case(benchmark, impl, k, backward=False)


@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))
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
