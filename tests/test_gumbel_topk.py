"""Gumbel-Top-K / Plackett-Luce: Triton kernel vs PyTorch reference vs a stepwise float64 loop."""
import importlib
import math
import os
import shutil
import sysconfig
import warnings
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from avex.kernels import gumbel_topk, plackett_luce_log_prob
from avex.kernels.gumbel_topk_ref import (gumbel_noise, gumbel_topk_ref, gumbel_topk_stepwise,
                                          plackett_luce_log_prob_stepwise)
from conftest import DEVICE, requires_cuda, poisoned_alloc

# the module, not the function of the same name that avex.kernels re-exports
gt = importlib.import_module("avex.kernels.gumbel_topk")
kernel_utils = importlib.import_module("avex.kernels._utils")


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    monkeypatch.setattr(gt, "_alloc", poisoned_alloc)


def make_case(gen, batch, width, *, kind="normal", ragged=False, neg_inf=False, per_row_k=False,
              k=None, dtype=torch.float32):
    if kind == "normal":
        scores = torch.randn(batch, width, generator=gen, dtype=torch.float64)
    elif kind == "ties":  # few distinct values: many exact ties
        scores = torch.randint(-2, 3, (batch, width), generator=gen).double()
    elif kind == "extreme":
        scores = (torch.rand(batch, width, generator=gen, dtype=torch.float64) * 2 - 1) * 1e4
    scores = scores.to(dtype)
    lengths = (torch.randint(1, width + 1, (batch,), generator=gen) if ragged
               else torch.full((batch,), width))
    if neg_inf:
        drop = torch.rand(batch, width, generator=gen) < 0.3
        drop[:, 0] = False  # every row keeps at least one selectable token
        scores = scores.masked_fill(drop, float("-inf"))
    valid = ((torch.arange(width) < lengths[:, None]) & (scores > float("-inf"))).sum(1)
    if per_row_k:
        k_rows = (torch.rand(batch, generator=gen) * valid).long().clamp(1)
        k_arg = k_rows
    else:
        k_arg = int(valid.min()) if k is None else min(k, int(valid.min()))
    return scores.to(DEVICE), k_arg if isinstance(k_arg, int) else k_arg.to(DEVICE), \
        lengths.to(DEVICE)


def assert_kernel_matches_reference(scores, k, lengths, tau, seed, sample):
    idx_t, lp_t = gumbel_topk(scores, k, tau=tau, lengths=lengths, seed=seed, sample=sample,
                              backend="triton", log_prob=True)
    idx_r, lp_r = gumbel_topk(scores, k, tau=tau, lengths=lengths, seed=seed, sample=sample,
                              backend="torch", log_prob=True)
    assert torch.equal(idx_t, idx_r)
    assert torch.isfinite(lp_t).all()
    torch.testing.assert_close(lp_t, lp_r, rtol=1e-5, atol=1e-5)
    pl_t = plackett_luce_log_prob(scores, idx_r, tau=tau, lengths=lengths, backend="triton")
    torch.testing.assert_close(pl_t, lp_r, rtol=1e-5, atol=1e-5)


SHAPES = [(1, 1), (3, 7), (4, 37), (2, 64), (3, 100), (2, 320)]


@pytest.mark.parametrize("batch,width", SHAPES)
@pytest.mark.parametrize("sample", [True, False])
def test_kernel_matches_reference_shapes(batch, width, sample):
    gen = torch.Generator().manual_seed(batch * 1000 + width)
    scores, k, lengths = make_case(gen, batch, width, ragged=True, per_row_k=True)
    assert_kernel_matches_reference(scores, k, lengths, 0.7, 11, sample)


@pytest.mark.parametrize("kind", ["ties", "extreme"])
@pytest.mark.parametrize("neg_inf", [False, True])
def test_kernel_matches_reference_hard_values(kind, neg_inf):
    gen = torch.Generator().manual_seed(7)
    scores, k, lengths = make_case(gen, 4, 45, kind=kind, neg_inf=neg_inf, ragged=True,
                                   per_row_k=True)
    tau = 0.05 if kind == "extreme" else 1.0
    for sample in (True, False):
        assert_kernel_matches_reference(scores, k, lengths, tau, 3, sample)


@pytest.mark.parametrize("which", ["one", "all"])
def test_kernel_k_equals_one_and_m(which):
    gen = torch.Generator().manual_seed(1)
    scores = torch.randn(3, 29, generator=gen).to(DEVICE)
    k = 1 if which == "one" else 29
    for sample in (True, False):
        assert_kernel_matches_reference(scores, k, None, 1.3, 5, sample)
    if which == "all":  # K = M chooses every token exactly once
        idx, _ = gumbel_topk(scores, 29, seed=5, backend="triton")
        assert torch.equal(idx.sort(1).values, torch.arange(29, device=DEVICE).expand(3, 29))


def test_ties_break_toward_lower_index():
    scores = torch.tensor([[0.0, 2.0, 2.0, 1.0, 2.0, -0.0]], device=DEVICE)
    for backend in ("triton", "torch"):
        idx, _ = gumbel_topk(scores, 6, sample=False, backend=backend)
        assert idx.tolist() == [[1, 2, 4, 3, 0, 5]]


# the interpreter is slow: few, varied examples (AVEX_HYPOTHESIS_EXAMPLES=300 searches longer)
@settings(max_examples=int(os.environ.get("AVEX_HYPOTHESIS_EXAMPLES", 20)), deadline=None)
@given(batch=st.integers(1, 4), width=st.integers(1, 70), tau=st.sampled_from([0.05, 0.5, 2.0]),
       seed=st.integers(0, 2**40), sample=st.booleans(), ragged=st.booleans(),
       neg_inf=st.booleans(), kind=st.sampled_from(["normal", "ties", "extreme"]),
       data_seed=st.integers(0, 2**31))
def test_kernel_matches_reference_random(batch, width, tau, seed, sample, ragged, neg_inf, kind,
                                         data_seed):
    gen = torch.Generator().manual_seed(data_seed)
    scores, k, lengths = make_case(gen, batch, width, kind=kind, ragged=ragged, neg_inf=neg_inf,
                                   per_row_k=True)
    assert_kernel_matches_reference(scores, k, lengths, tau, seed, sample)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kernel_half_precision_inputs(dtype):
    gen = torch.Generator().manual_seed(3)
    scores, k, lengths = make_case(gen, 3, 40, ragged=True, per_row_k=True, dtype=dtype)
    assert_kernel_matches_reference(scores, k, lengths, 0.5, 9, True)


# --- the reference against an independent stepwise float64 loop ------------------------------

@pytest.mark.parametrize("kind", ["normal", "ties", "extreme"])
def test_reference_matches_stepwise_loop_float64(kind):
    gen = torch.Generator().manual_seed(21)
    scores, k, lengths = make_case(gen, 6, 50, kind=kind, ragged=True, neg_inf=True,
                                   per_row_k=True, dtype=torch.float64)
    tau = 0.05 if kind == "extreme" else 0.8
    kmax = int(k.max())
    for sample in (True, False):
        idx_r, lp_r = gumbel_topk(scores, k, tau=tau, lengths=lengths, seed=4, sample=sample,
                                  backend="torch", log_prob=True)
        idx_s, lp_s = gumbel_topk_stepwise(scores, k.long(), kmax, lengths.long(), tau, 4, sample)
        assert torch.equal(idx_r, idx_s)
        torch.testing.assert_close(lp_r, lp_s, rtol=1e-10, atol=1e-9)


def test_float32_stays_accurate_at_extreme_scores():
    """|s| = 1e4 and tau = 0.05 (logits of 2e5): float32 kernel and reference vs float64 loop."""
    gen = torch.Generator().manual_seed(5)
    base = (torch.rand(4, 64, generator=gen, dtype=torch.float64) * 2 - 1) * 1e4
    base[:2, :32] = 1e4   # a tied block at the top
    base[2, 1:] = -1e4    # one token far above a tied remainder
    scores32 = base.float()
    k = torch.tensor([40, 20, 30, 64])
    for backend in ("triton", "torch"):
        idx, lp = gumbel_topk(scores32.to(DEVICE), k.to(DEVICE), tau=0.05, seed=2,
                              backend=backend)
        exact = plackett_luce_log_prob_stepwise(scores32.double(), idx.cpu(), k,
                                                torch.full((4,), 64), 0.05)
        assert torch.isfinite(lp).all()
        # a naive float32 L_t = logsumexp would be off by ~0.5 here (ulp(4e5) = 0.03 per step)
        torch.testing.assert_close(lp.cpu().double(), exact, rtol=1e-6, atol=1e-5)


def test_noise_is_reproduced_by_the_reference():
    noise = gumbel_noise(123, 3, 17)
    assert torch.isfinite(noise).all()
    # sampled Top-K on zero scores is exactly the Top-K of the noise
    idx, _ = gumbel_topk(torch.zeros(3, 17, device=DEVICE), 17, seed=123, backend="triton")
    assert torch.equal(idx.cpu(), noise.argsort(dim=1, descending=True, stable=True))


# --- gradients ------------------------------------------------------------------------------

def test_reference_gradcheck_float64():
    gen = torch.Generator().manual_seed(8)
    scores = torch.randn(3, 9, generator=gen, dtype=torch.float64)
    scores[1, 6:] = float("-inf")
    lengths = torch.tensor([9, 9, 7])
    k = torch.tensor([4, 2, 7])
    scores.requires_grad_()

    def sampled(s):
        return gumbel_topk(s, k, tau=0.6, lengths=lengths, seed=1, backend="torch")[1]
    idx, _ = gumbel_topk(scores, k, tau=0.6, lengths=lengths, seed=1, backend="torch")

    def given_order(s):
        return plackett_luce_log_prob(s, idx, tau=0.6, lengths=lengths, backend="torch")
    assert torch.autograd.gradcheck(sampled, (scores,))
    assert torch.autograd.gradcheck(given_order, (scores,))


@pytest.mark.parametrize("kind", ["normal", "ties", "extreme"])
def test_fused_backward_matches_reference_gradient(kind):
    gen = torch.Generator().manual_seed(12)
    scores, k, lengths = make_case(gen, 5, 37, kind=kind, ragged=True, neg_inf=True,
                                   per_row_k=True)
    tau = 0.05 if kind == "extreme" else 0.9
    weights = torch.randn(5, generator=gen).to(DEVICE)
    grads = {}
    for backend in ("triton", "torch"):
        s = (scores.double() if backend == "torch" else scores).clone().requires_grad_()
        idx, lp = gumbel_topk(s, k, tau=tau, lengths=lengths, seed=6, backend=backend)
        (lp * weights.to(lp.dtype)).sum().backward()
        grads[backend] = s.grad.double()
        s2 = s.detach().clone().requires_grad_()
        (plackett_luce_log_prob(s2, idx, tau=tau, lengths=lengths, backend=backend)
         * weights.to(lp.dtype)).sum().backward()
        torch.testing.assert_close(s2.grad, s.grad)
    assert torch.isfinite(grads["triton"]).all()
    scale = 1.0 / tau
    torch.testing.assert_close(grads["triton"], grads["torch"], rtol=1e-4, atol=1e-5 * scale)
    # padding and -inf positions get no gradient
    invalid = (torch.arange(37, device=DEVICE) >= lengths[:, None]) | (scores == float("-inf"))
    assert (grads["triton"][invalid] == 0).all()


# --- sampling semantics ------------------------------------------------------------------------

def test_sample_frequencies_follow_plackett_luce():
    """exp(log_prob) of an ordered pair equals how often the sampler draws it."""
    scores = torch.tensor([[1.0, 0.2, -0.5, 0.0]]).expand(40000, 4).contiguous()
    idx, lp = gumbel_topk(scores, 2, tau=0.8, seed=99, backend="torch")
    pairs, counts = torch.unique(idx, dim=0, return_counts=True)
    for pair, count in zip(pairs, counts):
        row = (idx == pair).all(1).nonzero()[0, 0]
        expected = math.exp(float(lp[row]))
        observed = float(count) / idx.shape[0]
        assert abs(observed - expected) < 4 * math.sqrt(expected * (1 - expected) / 40000) + 1e-3


def test_seed_controls_the_noise():
    scores = torch.zeros(2, 50)
    a = gumbel_topk(scores, 10, seed=1)[0]
    assert torch.equal(a, gumbel_topk(scores, 10, seed=1)[0])
    assert not torch.equal(a, gumbel_topk(scores, 10, seed=2)[0])
    torch.manual_seed(0)
    b = gumbel_topk(scores, 10)[0]
    torch.manual_seed(0)
    assert torch.equal(b, gumbel_topk(scores, 10)[0])


def test_per_row_k_pads_with_minus_one():
    scores = torch.randn(3, 10)
    idx, _ = gumbel_topk(scores, torch.tensor([1, 4, 2]), sample=False)
    assert idx.shape == (3, 4)
    assert (idx[0, 1:] == -1).all() and (idx[2, 2:] == -1).all() and (idx[1] >= 0).all()


# --- the inference path: sample=False, no gradient wanted --------------------------------------

def reference_indices(scores, k, lengths, tau):
    batch, width = scores.shape
    k_rows = k if isinstance(k, torch.Tensor) else torch.full((batch,), k)
    lengths = torch.full((batch,), width) if lengths is None else lengths
    return gumbel_topk_ref(scores, k_rows.long(), int(k_rows.max()), lengths.long(), tau, 0,
                           False)[0]


@settings(max_examples=int(os.environ.get("AVEX_HYPOTHESIS_EXAMPLES", 150)), deadline=None)
@given(batch=st.integers(1, 9), width=st.integers(1, 130),
       tau=st.sampled_from([1.0, 0.05, 0.7, 3.0]), ragged=st.booleans(), neg_inf=st.booleans(),
       kind=st.sampled_from(["normal", "ties", "extreme"]), per_row_k=st.booleans(),
       k_kind=st.sampled_from(["any", "one", "all"]),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
       data_seed=st.integers(0, 2**31))
def test_inference_path_ranks_as_the_reference(batch, width, tau, ragged, neg_inf, kind,
                                               per_row_k, k_kind, dtype, data_seed):
    """Ties to the lower index, -inf never chosen, ragged rows, per-row K, K=1 and K=M: the
    fast path (torch.topk plus one check) or its fallback gives the reference's indices."""
    gen = torch.Generator().manual_seed(data_seed)
    scores, k, lengths = make_case(gen, batch, width, kind=kind, ragged=ragged, neg_inf=neg_inf,
                                   per_row_k=per_row_k, dtype=dtype)
    scores, lengths = scores.cpu(), lengths.cpu()
    if isinstance(k, torch.Tensor):
        k = k.cpu()
    elif k_kind != "any":   # K = 1, or every selectable token of the tightest row
        k = 1 if k_kind == "one" else k
    use_lengths = lengths if ragged else None
    idx, log_prob = gumbel_topk(scores, k, tau=tau, lengths=use_lengths, sample=False)
    assert log_prob is None
    assert torch.equal(idx, reference_indices(scores, k, use_lengths, tau))


HOST_CHECKS = ["c", "numpy"]


def use_host_check(monkeypatch, check):
    """Run the fast path's tie check in C (the extension, as installed) or in NumPy (its
    reference, and the fallback without a C compiler)."""
    if check == "c":
        if gt._gumbel_topk_host is None:
            pytest.skip("the C extension avex.kernels._gumbel_topk_host isn't built (no C "
                        "compiler at install); test_host_extension_is_built_where_a_compiler_is says why")
    else:
        monkeypatch.setattr(gt, "_gumbel_topk_host", None)


def test_host_extension_is_built_where_a_compiler_is():
    # setup.py builds it as optional; with a compiler on the machine, a missing build is a bug
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    header = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    if shutil.which(compiler) is None or not os.path.exists(header):
        pytest.skip(f"no C compiler ({compiler!r}) or no {header} here: the NumPy check "
                    "stands in")
    assert gt._gumbel_topk_host is not None, (
        "avex.kernels._gumbel_topk_host is missing although a C compiler is installed: "
        "reinstall (pip install -e .) and read the build log")


@settings(max_examples=int(os.environ.get("AVEX_HYPOTHESIS_EXAMPLES", 150)) * 2, deadline=None)
@given(batch=st.integers(1, 3), width=st.integers(1, 40), kmax=st.integers(1, 40),
       tau=st.sampled_from([1.0, 0.05, 0.7, 3.0]), per_row_k=st.booleans(),
       dtype=st.sampled_from([torch.float32, torch.float64]),
       special=st.sampled_from(["none", "tie", "near tie", "-inf", "+inf", "nan"]),
       data_seed=st.integers(0, 2**31))
def test_host_check_in_c_equals_numpy(batch, width, kmax, tau, per_row_k, dtype, special,
                                      data_seed):
    """The C pass and its NumPy reference agree on topk's sorted blocks [B, min(K+1, M)]:
    ties, keys that only tie after the shift, -inf (fewer than K selectable), +inf and NaN
    maxima, K=1, K=M, per-row K; small batches so that both answers occur."""
    if gt._gumbel_topk_host is None:
        pytest.skip("the C extension isn't built; test_host_extension_is_built_where_a_compiler_is says why")
    gen = torch.Generator().manual_seed(data_seed)
    kmax = min(kmax, width)
    scores = torch.randn(batch, width, generator=gen, dtype=torch.float64).to(dtype)
    row, col = int(torch.randint(batch, ())), int(torch.randint(width, ()))
    if special == "tie" and width > 1:
        scores[row, col] = scores[row, (col + 1) % width]
    elif special == "near tie" and width > 2:   # distinct, but their keys (s - 1e4) round to one float32
        scores[row, :2] = torch.tensor([1e-3, 9e-4], dtype=dtype)
        scores[row, -1] = 1e4
    elif special in ("-inf", "+inf", "nan"):
        scores[row, col:] = float(special) if special != "nan" else float("nan")
    values = scores.topk(min(kmax + 1, width), dim=1).values
    k_rows = (torch.randint(1, kmax + 1, (batch,), generator=gen) if per_row_k else None)
    if k_rows is not None:
        k_rows[0] = kmax
    want = bool(gt._keys_fall_strictly_numpy(values, tau, kmax, k_rows))
    assert gt._keys_fall_strictly(values, tau, kmax, k_rows) is want
    if k_rows is not None:   # any integer dtype for the per-row K
        assert gt._keys_fall_strictly(values, tau, kmax, k_rows.int()) is want


@pytest.mark.parametrize("check", HOST_CHECKS)
@pytest.mark.parametrize("kind", ["normal", "ties", "extreme"])
def test_inference_fast_path_is_taken_exactly_without_ties(kind, check, monkeypatch):
    use_host_check(monkeypatch, check)
    gen = torch.Generator().manual_seed(5)
    scores, _, _ = make_case(gen, 64, 320, kind=kind)
    scores = scores.cpu()
    keys = scores.sort(dim=1, descending=True).values
    keys = keys - keys[:, :1]
    taken_by_k = {}
    for k in (1, 32, 128, 320):
        top = keys[:, :k + 1]
        distinct = bool((top[:, 1:] != top[:, :-1]).all())
        got = gt._topk_inference(scores, k, 1.0, "auto")
        assert (got is not None) == distinct, (kind, k)
        taken_by_k[k] = distinct
        if got is not None:
            assert torch.equal(got, reference_indices(scores, k, None, 1.0))
    assert taken_by_k[32] == (kind != "ties")   # the fast path does get used


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_inference_takes_the_fast_path_on_every_device(backend, monkeypatch):
    """gumbel_topk(sample=False) without lengths or log-probability: on this machine's device
    (CUDA on a GPU) the auto and torch backends answer from torch.topk when no tie can decide,
    and equal the reference; the general paths are not called."""
    def general(*args, **kwargs):
        raise AssertionError("the general path ran")
    monkeypatch.setattr(gt._GumbelTopK, "apply", general)
    monkeypatch.setattr(gt, "gumbel_topk_indices_ref", general)
    gen = torch.Generator().manual_seed(9)
    for width, k in ((1, 1), (37, 5), (320, 128), (320, 320)):
        scores = torch.randn(6, width, generator=gen)
        got, logp = gumbel_topk(scores.to(DEVICE), k, sample=False, backend=backend)
        assert logp is None and got.device.type == torch.device(DEVICE).type
        assert torch.equal(got.cpu(), reference_indices(scores, k, None, 1.0))


@pytest.mark.parametrize("check", HOST_CHECKS)
def test_inference_fast_path_sees_ties_the_shift_creates(check, monkeypatch):
    use_host_check(monkeypatch, check)
    # distinct scores whose keys (s - max) / tau round to the same float32: the reference
    # ranks them as tied (lower index first), so the fast path must hand them over
    scores = torch.tensor([[1e-3, 9e-4, 1e4, -5.0]])
    assert scores[0, 0] > scores[0, 1]
    assert gt._topk_inference(scores, 2, 1.0, "auto") is None
    idx, _ = gumbel_topk(scores, 3, sample=False)
    assert torch.equal(idx, reference_indices(scores, 3, None, 1.0))
    scores = torch.tensor([[9e-4, 1e-3, 1e4, -5.0]])   # lower index is the smaller score
    assert gumbel_topk(scores, 2, sample=False)[0].tolist() == [[2, 0]]


@pytest.mark.parametrize("check", HOST_CHECKS)
def test_inference_fast_path_check_is_quiet_on_infinities_and_nan(check, monkeypatch):
    use_host_check(monkeypatch, check)
    # NumPy warns on inf - inf (the C pass has no warnings); a user's warnings filter must not
    # turn a padded or degenerate row into an exception
    inf, nan = float("inf"), float("nan")
    rows = {"+inf": [[inf, 1.0, 0.0, -1.0]], "all -inf": [[-inf] * 4],
            "-inf padding": [[2.0, -inf, -inf, 1.0]], "nan": [[nan, 1.0, 0.0, -1.0]]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name, row in rows.items():
            for k in (1, 2, 4):
                got = gt._topk_inference(torch.tensor(row), k, 0.7, "auto")
                if name == "-inf padding" and k < 4:   # two selectable tokens
                    assert got.tolist() == [[0, 3][:k]], (name, k)
                else:   # a NaN key, or fewer than K selectable: the general path decides
                    assert got is None, (name, k)


def test_log_prob_output_on_each_path():
    gen = torch.Generator().manual_seed(8)
    scores = torch.randn(3, 20, generator=gen, dtype=torch.float64)
    want_idx, want_lp = gumbel_topk_ref(scores, torch.full((3,), 5), 5, torch.full((3,), 20),
                                        1.0, 0, False)
    idx, lp = gumbel_topk(scores, 5, sample=False)                  # inference: not computed
    assert lp is None and torch.equal(idx, want_idx)
    idx, lp = gumbel_topk(scores, 5, sample=False, log_prob=True)   # on request
    assert torch.equal(idx, want_idx) and torch.equal(lp, want_lp)
    leaf = scores.clone().requires_grad_()
    idx, lp = gumbel_topk(leaf, 5, sample=False)                    # a gradient is wanted
    assert torch.equal(idx, want_idx) and torch.equal(lp.detach(), want_lp)
    lp.sum().backward()
    assert leaf.grad is not None and torch.isfinite(leaf.grad).all()
    with torch.no_grad():
        assert gumbel_topk(leaf, 5, sample=False)[1] is None
    assert gumbel_topk(scores, 5, seed=1)[1] is not None           # sampling: computed
    idx, lp = gumbel_topk(scores, 5, seed=1, log_prob=False)
    assert lp is None and torch.equal(idx, gumbel_topk(scores, 5, seed=1)[0])
    with pytest.raises(TypeError, match="log_prob must be None, True or False, got 'yes'"):
        gumbel_topk(scores, 5, log_prob="yes")


@pytest.mark.parametrize("call,error,match", [
    (lambda s: gumbel_topk(s, 0, sample=False), ValueError, "k must be >= 1"),
    (lambda s: gumbel_topk(s, 9, sample=False), ValueError, "k = 9 for row 0 exceeds"),
    (lambda s: gumbel_topk(s.masked_fill(s > 0, float("-inf")), 8, sample=False), ValueError,
     "k = 8 for row 0 exceeds"),
    (lambda s: gumbel_topk(s, torch.tensor([2, 0]), sample=False), ValueError, "k must be >= 1"),
    (lambda s: gumbel_topk(s.masked_fill(s > 0, float("nan")), 2, sample=False), ValueError,
     "NaN"),
    (lambda s: gumbel_topk(s.masked_fill(s > 0, float("inf")), 2, sample=False), ValueError,
     r"\+inf"),
    (lambda s: gumbel_topk(s, 2, tau=0.0, sample=False), ValueError, "tau must be"),
    (lambda s: gumbel_topk(s, 2.5, sample=False), TypeError, "k must be an int"),
    (lambda s: gumbel_topk(s[0], 2, sample=False), ValueError, "scores must be 2-D"),
    (lambda s: gumbel_topk(s, 2, sample=False, backend="cuda-ish"), ValueError,
     "backend must be one of"),
])
def test_inference_path_rejects_bad_input_as_the_general_path(call, error, match):
    scores = torch.randn(2, 8)
    scores[:, 0] = 1.0   # a positive score in every row, so the masks above bite
    with pytest.raises(error, match=match):
        call(scores)


# --- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("call,error,match", [
    (lambda s: gumbel_topk(s, 0), ValueError, "k must be >= 1"),
    (lambda s: gumbel_topk(s, 9), ValueError, "k = 9 for row 0 exceeds"),
    (lambda s: gumbel_topk(s, 2, lengths=torch.tensor([8, 1])), ValueError, "k = 2 for row 1"),
    (lambda s: gumbel_topk(s, 2, tau=0.0), ValueError, "tau must be a finite number > 0, got 0.0"),
    (lambda s: gumbel_topk(s, 2, tau=-1), ValueError, "tau"),
    # keys (s - max) / tau past float32: the lower ones turn -inf and tie (a wrong Top-K)
    (lambda s: gumbel_topk(torch.tensor([[3e38, -3e38, -1e38, -2e38]] * 2), 2), ValueError,
     r"scores of row \d span .* divided by tau = 1 that passes the ranking keys' range"),
    (lambda s: gumbel_topk(s, 2, tau=1e-39), ValueError, "divided by tau = 1e-39"),
    (lambda s: gumbel_topk(s, 2, tau=1e300), ValueError, r"tau must be below 3.4e\+38"),
    (lambda s: gumbel_topk(s.masked_fill(s > 0, float("nan")), 2), ValueError, "NaN"),
    (lambda s: gumbel_topk(s.masked_fill(s > 0, float("inf")), 2), ValueError, r"\+inf"),
    (lambda s: gumbel_topk(s[0], 2), ValueError, r"scores must be 2-D, got shape \[8\]"),
    (lambda s: gumbel_topk(s.long(), 2), TypeError, "scores must be a floating-point"),
    (lambda s: gumbel_topk(s, 2, lengths=torch.tensor([9, 3])), ValueError,
     r"lengths must lie in \[0, 8\].*got 9"),
    (lambda s: gumbel_topk(s, 2, lengths=torch.tensor([3, -1])), ValueError, "got -1"),
    (lambda s: gumbel_topk(s, 2, lengths=torch.tensor([3])), ValueError, "lengths must have shape"),
    (lambda s: gumbel_topk(s, 2, lengths=torch.tensor([3, 3], device="meta")), ValueError,
     "lengths is a meta tensor"),
    (lambda s: gumbel_topk(s, 2.5), TypeError, "k must be an int"),
    (lambda s: gumbel_topk(s, torch.tensor([1, 2, 3])), ValueError, r"k must have shape \[2\]"),
    (lambda s: gumbel_topk(s, 2, seed=-3), ValueError, "seed must lie in"),
    (lambda s: gumbel_topk(s, 2, backend="cuda-ish"), ValueError, "backend must be one of"),
    (lambda s: gumbel_topk(s.double(), 2, backend="triton"), TypeError, "float64"),
    (lambda s: plackett_luce_log_prob(s, torch.tensor([[0, 0], [1, 2]])), ValueError,
     "same position twice"),
    (lambda s: plackett_luce_log_prob(s, torch.tensor([[-1, 0], [1, 2]])), ValueError,
     "-1 padding only"),
    (lambda s: plackett_luce_log_prob(s, torch.tensor([[0, 8], [1, 2]])), ValueError,
     "outside its row's valid length"),
])
def test_bad_input_is_rejected_with_a_clear_error(call, error, match):
    scores = torch.randn(2, 8)
    with pytest.raises(error, match=match):
        call(scores)


@pytest.mark.parametrize("backend", ["triton", "cuda"])
def test_float64_error_is_the_same_with_a_gpu_present(monkeypatch, backend):
    """With CUDA present TRITON_INTERPRET is unset, so a CPU tensor fails the device check;
    the dtype is refused first, so the error doesn't depend on the machine."""
    monkeypatch.setattr(kernel_utils, "interpreting", lambda: False)
    with pytest.raises(TypeError, match="float64"):
        gumbel_topk(torch.randn(2, 8, dtype=torch.float64), 2, sample=backend == "triton",
                    backend=backend)
    with pytest.raises(ValueError, match="needs CUDA tensors"):  # float32 on a CPU: the device
        gumbel_topk(torch.randn(2, 8), 2, backend="triton")


def test_rows_wider_than_the_kernel_limit_go_to_the_reference():
    """Under "auto", CUDA rows up to ROW_KERNEL_MAX_WIDTH take the kernel, wider ones the
    reference (the kernel holds a row in registers; wider blocks spill); a forced "triton"
    says why it refuses."""
    limit = kernel_utils.ROW_KERNEL_MAX_WIDTH
    assert gt.MAX_TRITON_WIDTH == limit

    def on_cuda(width):  # what the dispatch reads of a tensor, on a machine without a GPU
        return SimpleNamespace(device=torch.device("cuda"), dtype=torch.float32,
                               shape=(2, width))

    assert kernel_utils.resolve_row_backend("auto", on_cuda(limit), op="t",
                                            max_width=limit) == "triton"
    assert kernel_utils.resolve_row_backend("auto", on_cuda(limit + 1), op="t",
                                            max_width=limit) == "torch"
    with pytest.raises(ValueError, match=f"at most {limit} tokens, got {limit + 1}"):
        kernel_utils.resolve_row_backend("triton", on_cuda(limit + 1), op="t", max_width=limit)


def test_the_cuda_library_takes_rows_up_to_its_own_limit():
    """backend="cuda" is offered only with the library's width limit: rows up to it go to the
    library (wider than the Triton limit too), wider ones are refused, and an op without a
    library path refuses the backend."""
    cuda_limit = gt.CUDA_TOPK_MAX_WIDTH
    assert cuda_limit > gt.MAX_TRITON_WIDTH

    def on_cuda(width):
        return SimpleNamespace(device=torch.device("cuda"), dtype=torch.float32,
                               shape=(2, width))

    for width in (1, 320, gt.MAX_TRITON_WIDTH + 1, cuda_limit):
        assert kernel_utils.resolve_row_backend(
            "cuda", on_cuda(width), op="t", max_width=gt.MAX_TRITON_WIDTH,
            cuda_max_width=cuda_limit) == "cuda"
    with pytest.raises(ValueError, match=f"at most {cuda_limit} tokens, got {cuda_limit + 1}"):
        kernel_utils.resolve_row_backend("cuda", on_cuda(cuda_limit + 1), op="t",
                                         max_width=gt.MAX_TRITON_WIDTH, cuda_max_width=cuda_limit)
    with pytest.raises(ValueError, match="backend must be one of"):
        kernel_utils.resolve_row_backend("cuda", on_cuda(8), op="t", max_width=8)


@pytest.mark.parametrize("sample", [True, False])
def test_unchecked_path_equals_the_public_one(sample):
    gen = torch.Generator().manual_seed(21)
    scores = torch.randn(5, 37, generator=gen).to(DEVICE)
    k = torch.randint(1, 12, (5,), generator=gen).to(DEVICE)
    lengths = torch.randint(12, 38, (5,), generator=gen).to(DEVICE)
    want = gumbel_topk(scores, k, tau=0.7, lengths=lengths, seed=4, sample=sample, log_prob=True)
    got = gt.gumbel_topk_unchecked(scores, k, int(k.max()), lengths, tau=0.7, seed=4,
                                   sample=sample)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# --- GPU ---------------------------------------------------------------------------------------

@requires_cuda
def test_unchecked_path_makes_no_host_sync():
    scores = torch.randn(64, 320, device="cuda", requires_grad=True)
    k = torch.full((64,), 128, dtype=torch.int64, device="cuda")
    lengths = torch.full((64,), 320, dtype=torch.int64, device="cuda")
    gt.gumbel_topk_unchecked(scores, k, 128, lengths, tau=1.0, seed=0, sample=True)  # compile
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _, log_prob = gt.gumbel_topk_unchecked(scores, k, 128, lengths, tau=1.0, seed=0,
                                               sample=True)
        log_prob.sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@requires_cuda
@pytest.mark.parametrize("kmax", [32, 64, 128])
def test_compiled_kernel_matches_reference_on_cuda(kmax):
    gen = torch.Generator().manual_seed(kmax)
    scores = torch.randn(64, 320, generator=gen).cuda()
    lengths = torch.randint(kmax, 321, (64,), generator=gen).cuda()
    k = torch.randint(1, kmax + 1, (64,), generator=gen).cuda()
    for sample in (True, False):
        assert_kernel_matches_reference(scores, k, lengths, 0.5, 17, sample)


def test_inference_top_k_beyond_the_key_range_is_right_or_refused():
    """Scores spanning past float32: the inference path either returns torch.topk's answer
    (its K + 1 keys still fall strictly) or refuses; it never ties them toward index 0."""
    for scores in (torch.tensor([[3e38, -3e38, -1e38, -2e38]]), torch.randn(3, 9) * 1e38):
        try:
            got = gumbel_topk(scores, 2, sample=False)[0]
        except ValueError as err:
            assert "ranking keys' range" in str(err)
        else:
            assert torch.equal(got, scores.topk(2).indices)
