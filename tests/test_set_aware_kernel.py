"""Set-aware picks: the Triton kernel (one launch for all K steps) against the PyTorch reference
beside it (kernels/set_aware_ref.py), on fresh random inputs of many shapes."""
import importlib
import itertools

import pytest
import torch

from avex.kernels import gumbel_topk
from avex.kernels.set_aware_ref import (initial_keys, set_aware_picks_ref, shift_truncated,
                                        unit_vectors)
from avex.set_selection import set_aware_indices
from conftest import DEVICE, poisoned_alloc, requires_cuda

sa = importlib.import_module("avex.kernels.set_aware")
picks_of = sa.set_aware_picks_unchecked


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    # an unwritten pick stays -7 and fails every comparison
    monkeypatch.setattr(sa, "_alloc", poisoned_alloc)


def make_case(gen, batch, width, features, *, kind="normal", pad=0.0, budgets="random",
              dtype=torch.float32):
    """scores [B, M] (-inf at a share ``pad`` of the tokens, never all of a row), hidden
    [B, M, D] and budgets int64 [B] within each row's selectable tokens."""
    if kind == "ties":     # few distinct scores and hidden states: exact ties everywhere
        scores = torch.randint(-2, 3, (batch, width), generator=gen).double()
        hidden = torch.eye(features, dtype=torch.float64)[
            torch.randint(0, features, (batch, width), generator=gen)]
    else:
        scores = torch.randn(batch, width, generator=gen, dtype=torch.float64)
        hidden = torch.randn(batch, width, features, generator=gen, dtype=torch.float64)
    drop = torch.rand(batch, width, generator=gen) < pad
    drop[:, 0] = False
    scores = scores.masked_fill(drop, float("-inf"))
    selectable = (scores > float("-inf")).sum(1)
    if budgets == "one":
        budget = torch.ones(batch, dtype=torch.int64)
    elif budgets == "all":
        budget = selectable
    else:   # ragged, a row of 0 allowed
        budget = (torch.rand(batch, generator=gen) * (selectable + 1)).long().clamp(max=selectable)
    return (scores.to(dtype).to(DEVICE), hidden.to(dtype).to(DEVICE), budget.to(DEVICE))


def replayed_keys(scores, hidden, picks, row, steps, beta, tau, seed, sample):
    """Row ``row``'s keys before step ``steps``, replaying ``picks`` by the reference's rule
    with float64 similarities: what a near-tie is measured on."""
    key = initial_keys(scores[row:row + 1], seed, sample, tau)[0].cpu()
    unit = unit_vectors(hidden[row].cpu(), torch.float64)
    redundant = torch.zeros_like(key)
    for t in range(steps):
        pick = int(picks[row, t])
        top = key[pick].clone()
        key[pick] = float("-inf")
        grown = torch.maximum(redundant, unit @ unit[pick])
        shift = (beta / tau) * (grown - redundant)
        redundant = grown
        if sample:
            moved = (shift != 0) & (key > float("-inf"))
            key = torch.where(moved, shift_truncated(key, shift, top), key)
        else:
            key = key - shift
    return key


def assert_same_picks(scores, hidden, budget, beta, tau, seed, sample, **kwargs):
    """The kernel's picks are the reference's. Where the two similarity computations (a GEMM
    there, a matrix-vector product here) could round apart, float32 hidden states may only
    differ at a pick whose two candidates' keys lie within 1e-5 of each other."""
    kernel = picks_of(scores, hidden, budget, beta=beta, tau=tau, seed=seed,
                      sample=sample, backend="triton", **kwargs)
    reference = set_aware_picks_ref(scores, hidden, budget, beta, tau, seed, sample)
    assert kernel.dtype == torch.int64 and kernel.shape == reference.shape
    assert torch.equal(kernel < 0, reference < 0)
    if torch.equal(kernel, reference):
        return
    assert hidden.dtype != torch.float64, "float64 picks must be the reference's exactly"
    for row in torch.nonzero((kernel != reference).any(1)).flatten().tolist():
        step = int(torch.nonzero(kernel[row] != reference[row])[0])
        key = replayed_keys(scores, hidden, reference, row, step, beta, tau, seed, sample)
        ours, theirs = key[int(kernel[row, step])], key[int(reference[row, step])]
        assert abs(float(ours - theirs)) <= 1e-5 * (1 + beta / tau), (row, step)


SHAPES = [(1, 1, 1), (3, 7, 5), (4, 37, 3), (2, 64, 16), (3, 80, 128), (2, 100, 7),
          (2, 320, 33)]


@pytest.mark.parametrize("batch,width,features", SHAPES)
@pytest.mark.parametrize("sample", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_kernel_matches_reference_shapes(batch, width, features, sample, dtype):
    gen = torch.Generator().manual_seed(batch * 1000 + width)
    scores, hidden, budget = make_case(gen, batch, width, features, pad=0.25, dtype=dtype)
    assert_same_picks(scores, hidden, budget, 4.0, 0.5, width, sample)


@pytest.mark.parametrize("budgets", ["one", "all"])
@pytest.mark.parametrize("sample", [False, True])
def test_kernel_k_equals_one_and_m(budgets, sample):
    gen = torch.Generator().manual_seed(3)
    scores, hidden, budget = make_case(gen, 4, 45, 6, pad=0.3, budgets=budgets,
                                       dtype=torch.float64)
    assert_same_picks(scores, hidden, budget, 2.0, 1.0, 11, sample)
    if budgets == "all":   # every selectable token, each once, no padding
        picks = picks_of(scores, hidden, budget, beta=2.0, tau=1.0, seed=11,
                         sample=sample, backend="triton")
        for row in range(4):
            chosen = picks[row][picks[row] >= 0]
            assert sorted(chosen.tolist()) == torch.nonzero(
                scores[row] > float("-inf")).flatten().tolist()


@pytest.mark.parametrize("sample", [False, True])
@pytest.mark.parametrize("beta", [0.0, 0.5, 4.0, 50.0])
@pytest.mark.parametrize("tau", [0.05, 0.5, 2.0])
def test_kernel_matches_reference_ties_and_settings(sample, beta, tau):
    """Few distinct scores and one-hot hidden states: exact ties in the first keys and in
    every update (cosines 0 or 1, exact in any summation order)."""
    gen = torch.Generator().manual_seed(int(beta * 10 + tau * 100))
    scores, hidden, budget = make_case(gen, 5, 33, 4, kind="ties", pad=0.2)
    assert_same_picks(scores, hidden, budget, beta, tau, 5, sample)


def test_ties_go_to_the_lower_index_and_a_duplicate_waits():
    """Two equal scores: the lower index first. Its exact duplicate (same hidden state) then
    drops by beta / tau (to 0), so the distinct 0.9 comes before it, and the duplicate before
    the 0.0 that 0.9's pick lowered to -1. (The interpreter's argmax always takes the lower
    index; on a GPU this checks the kernel's tie_break_left.)"""
    scores = torch.tensor([[1.0, 0.0, 1.0, 0.9]], device=DEVICE)
    hidden = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]], device=DEVICE)
    budget = torch.tensor([3], device=DEVICE)
    picks = picks_of(scores, hidden, budget, beta=1.0, tau=1.0, seed=0, sample=False,
                     backend="triton")
    assert picks.tolist() == [[0, 3, 2]]
    assert torch.equal(picks, set_aware_picks_ref(scores, hidden, budget, 1.0, 1.0, 0, False))


@pytest.mark.parametrize("sample", [False, True])
def test_beta_zero_is_gumbel_topk(sample):
    gen = torch.Generator().manual_seed(8)
    scores, hidden, _ = make_case(gen, 6, 50, 5, pad=0.2)
    budget = torch.full((6,), 9, device=DEVICE)
    picks = picks_of(scores, hidden, budget, beta=0.0, tau=0.7, seed=21,
                     sample=sample, backend="triton")
    expected, _ = gumbel_topk(scores, budget, tau=0.7, seed=21, sample=sample, backend="torch",
                              log_prob=False)
    assert torch.equal(picks, expected)


@pytest.mark.parametrize("seed", range(6))
def test_kernel_draws_the_references_sets_seed_by_seed(seed):
    gen = torch.Generator().manual_seed(100 + seed)
    scores, hidden, budget = make_case(gen, 8, 80, 24, pad=0.1, dtype=torch.float64)
    assert_same_picks(scores, hidden, budget, 4.0, 0.5, seed, True)


def test_batches_beyond_the_cosine_memory_launch_in_chunks(monkeypatch):
    gen = torch.Generator().manual_seed(4)
    scores, hidden, budget = make_case(gen, 5, 30, 4, pad=0.2, dtype=torch.float64)
    launches = []
    kernel = sa._set_aware_kernel

    class Counting:
        def __getitem__(self, grid):
            launches.append(grid)
            return kernel[grid]

    monkeypatch.setattr(sa, "_set_aware_kernel", Counting())
    monkeypatch.setattr(sa, "GRAM_BYTES", 2 * 30 * 30 * 8)   # two rows' float64 cosines
    assert_same_picks(scores, hidden, budget, 4.0, 0.5, 1, False)
    assert launches == [(2,), (2,), (1,)]


def test_an_empty_batch_and_zero_budgets():
    scores = torch.zeros(0, 5, device=DEVICE)
    hidden = torch.zeros(0, 5, 3, device=DEVICE)
    empty = picks_of(scores, hidden, torch.zeros(0, dtype=torch.int64, device=DEVICE),
                     beta=1.0, tau=1.0, seed=0, sample=False, backend="triton")
    assert empty.shape == (0, 0)
    scores, hidden = torch.randn(2, 5, device=DEVICE), torch.randn(2, 5, 3, device=DEVICE)
    none = picks_of(scores, hidden, torch.zeros(2, dtype=torch.int64, device=DEVICE),
                    beta=1.0, tau=1.0, seed=0, sample=True, backend="triton")
    assert none.shape == (2, 0)


def test_dispatch_by_backend_and_a_bad_backend_refused():
    gen = torch.Generator().manual_seed(9)
    scores, hidden, budget = make_case(gen, 3, 40, 8, pad=0.2)
    for sample in (False, True):
        picks = {backend: set_aware_indices(scores, hidden, budget, redundancy=4.0, tau=0.5,
                                            seed=2, sample=sample, backend=backend)
                 for backend in ("triton", "torch", "auto")}
        assert torch.equal(picks["triton"], picks["torch"])
        assert torch.equal(picks["auto"], picks["torch"])
    with pytest.raises(ValueError, match="backend must be one of .* got 'cuda-ish'"):
        set_aware_indices(scores, hidden, budget, redundancy=4.0, backend="cuda-ish")


@pytest.mark.parametrize("sample,width", [(False, sa.MAX_TRITON_WIDTH + 1),
                                          (True, sa.MAX_SAMPLE_WIDTH + 1)])
def test_rows_wider_than_the_kernel_takes(sample, width):
    scores, hidden = torch.randn(1, width, device=DEVICE), torch.randn(1, width, 2, device=DEVICE)
    budget = torch.tensor([2], device=DEVICE)
    with pytest.raises(ValueError, match=f"at most .* tokens .* got {width}"):
        picks_of(scores, hidden, budget, beta=1.0, tau=1.0, seed=0, sample=sample,
                 backend="triton")
    # backend="auto" takes them to the reference
    picks = picks_of(scores, hidden, budget, beta=1.0, tau=1.0, seed=0, sample=sample)
    assert torch.equal(picks, set_aware_picks_ref(scores, hidden, budget, 1.0, 1.0, 0, sample))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_hidden_states(dtype):
    """Half-precision hidden states are compared in float32, as the reference compares them."""
    gen = torch.Generator().manual_seed(12)
    scores, hidden, budget = make_case(gen, 3, 50, 16, pad=0.1)
    assert_same_picks(scores, hidden.to(dtype), budget, 4.0, 0.5, 3, False)


@requires_cuda
@pytest.mark.parametrize("sample,width", list(itertools.product([False, True], [80, 2000])))
def test_auto_takes_the_kernel_on_a_gpu(sample, width, monkeypatch):
    calls = []
    launch = sa._launch
    monkeypatch.setattr(sa, "_launch", lambda *a: calls.append(1) or launch(*a))
    gen = torch.Generator().manual_seed(width)
    scores, hidden, budget = make_case(gen, 2, width, 64, pad=0.1)
    picks = set_aware_indices(scores, hidden, budget, redundancy=4.0, tau=0.5, seed=1,
                              sample=sample)
    assert calls == [1]
    assert torch.equal(picks, picks_of(scores, hidden, budget, beta=4.0, tau=0.5,
                                       seed=1, sample=sample, backend="triton"))
    assert_same_picks(scores, hidden, budget, 4.0, 0.5, 1, sample)
