"""Set-aware picks (the default recipe's selection), one Triton launch against the PyTorch
step loop, at the embedded benchmark's size and at a real clip's.

Baseline: ``set_aware_indices(backend="torch")``, the reference: K sequential steps of about
ten tensor operations each (what one would write). Compared: ``backend="triton"`` (the host's
one batched cosine GEMM plus one kernel launch for all K picks), and plain Top-K
(``gumbel_topk(sample=False)``) on the same scores, for what set-aware selection adds to it.
Sizes: ``benchmark`` B=16 rows of M=80 tokens (an evaluation batch), policy width 128;
``video`` B=1, M=2000 (1728 visual + 272 audio), width 768 (the paper preset's policy); greedy
at 10/20/40%. ``training``: the RL step's draw, B=128 rows (16 clips x 8 anchors) of M=80,
sampled, K=16. float32. The Triton entries skip without CUDA (the interpreter would time
Python); on a CPU the reference and Top-K rows run.
"""
import pytest
import torch

from avex.kernels import gumbel_topk
from avex.set_selection import set_aware_indices
from conftest import DEVICE, label, synchronized

REDUNDANCY, TAU = 4.0, 0.5
#: name -> (rows, tokens, width, budgets, sample)
SIZES = {"benchmark": (16, 80, 128, (8, 16, 32), False),
         "video": (1, 2000, 768, (200, 400, 800), False),
         "training": (128, 80, 128, (16,), True)}
CASES = [(name, k) for name, (_, _, _, budgets, _) in SIZES.items() for k in budgets]
IMPLEMENTATIONS = ("torch step loop (baseline)", "triton", "top-k (no set-aware)")


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("size,k", CASES)
def test_set_aware_picks(benchmark, impl, size, k):
    if impl == "triton" and DEVICE.type != "cuda":
        pytest.skip("Triton timing needs a CUDA GPU; on a CPU it would time the interpreter")
    rows, width, features, _, sample = SIZES[size]
    gen = torch.Generator().manual_seed(k)
    scores = torch.randn(rows, width, generator=gen).to(DEVICE)
    hidden = torch.randn(rows, width, features, generator=gen).to(DEVICE)
    budget = torch.full((rows,), k, dtype=torch.int64, device=DEVICE)
    if impl.startswith("top-k"):
        def step():
            return gumbel_topk(scores, budget, tau=TAU, seed=1, sample=sample,
                               log_prob=False)[0]
    else:
        backend = "torch" if impl.startswith("torch") else "triton"

        def step():
            return set_aware_indices(scores, hidden, budget, redundancy=REDUNDANCY, tau=TAU,
                                     seed=1, sample=sample, backend=backend)
    label(benchmark, f"set-aware picks {size}: B={rows} M={width} D={features} K={k} "
                     f"{'sampled' if sample else 'greedy'}", impl)
    picks = benchmark(synchronized(step))
    # every row: K distinct tokens (tests/test_set_aware_kernel.py checks them exactly)
    assert picks.shape == (rows, k)
    assert all(len(set(row.tolist())) == k for row in picks.cpu())
