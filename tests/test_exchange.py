"""build_exchanges: Triton kernel (interpreter on CPU) vs the PyTorch reference vs a per-sample
loop, the paper's feasibility rule, gradients, and argument errors."""
import importlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from avex.kernels.exchange import (EXCHANGE_TYPES, Exchanges, build_exchanges,
                                   build_exchanges_unchecked)
from avex.kernels.exchange_ref import build_exchanges_loop, type_codes
from avex.kernels.gumbel_topk import gumbel_topk
from conftest import DEVICE, poisoned_alloc, requires_cuda

# the module, not the function of the same name that avex.kernels re-exports
exchange_mod = importlib.import_module("avex.kernels.exchange")


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    monkeypatch.setattr(exchange_mod, "_alloc", poisoned_alloc)


def make_case(seed, batch, width, k, *, ties=False, missing=None, pad=0, neg_inf=0):
    """Scores, anchor indices (from deterministic Top-K, ragged K) and modality."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, width, generator=gen)
    if ties:
        scores = (scores * 2).round() / 2  # few distinct values: many ties
    modality = torch.randint(0, 2, (batch, width), generator=gen)
    if missing is not None:  # one sample has a single modality
        modality[0] = 1 - missing
    if pad:
        modality[-1, -pad:] = -1
        scores[-1, -pad:] = float("-inf")
    if neg_inf:
        scores[0, :neg_inf] = float("-inf")
    k_rows = torch.as_tensor(k).expand(batch).clone() if not isinstance(k, list) else \
        torch.tensor(k)
    selectable = (scores > float("-inf")).sum(1)
    k_rows = torch.minimum(k_rows, selectable)
    indices, _ = gumbel_topk(scores, k_rows, sample=False, backend="torch")
    return scores.to(DEVICE), indices.to(DEVICE), modality.to(DEVICE)


def assert_same(a: Exchanges, b: Exchanges, exact_delta=False):
    assert a.types == b.types
    for name in ("removed", "inserted", "group_size", "keep", "anchor"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    if exact_delta:
        assert torch.equal(a.delta_f, b.delta_f)
    else:
        torch.testing.assert_close(a.delta_f, b.delta_f, rtol=1e-6, atol=1e-6)


CASES = [
    # seed, B, M, K, g, extra
    (0, 3, 13, [5, 2, 9], 3, {}),                      # ragged K
    (1, 2, 20, 6, 8, {}),                               # g larger than a side
    (2, 3, 17, [4, 6, 3], 2, {"missing": 0}),           # a sample with no visual tokens
    (3, 2, 16, [6, 4], 3, {"missing": 1, "pad": 5}),    # no audio in one, padding in another
    (4, 2, 11, 11, 4, {}),                              # K = N: nothing to insert, all skipped
    (5, 3, 24, [7, 3, 10], 4, {"ties": True}),          # ties toward the lower index
    (6, 2, 12, 3, 1, {"neg_inf": 4}),                   # g = 1; -inf scores never inserted
    (7, 1, 33, 9, 8, {"ties": True}),                   # M not a power of two, past a block
]


@pytest.mark.parametrize("seed,batch,width,k,g,extra", CASES)
def test_kernel_matches_reference_and_loop(seed, batch, width, k, g, extra):
    scores, indices, modality = make_case(seed, batch, width, k, **extra)
    tri = build_exchanges(scores, indices, modality, g=g, backend="triton")
    ref = build_exchanges(scores, indices, modality, g=g, backend="torch")
    loop = Exchanges(*build_exchanges_loop(scores, indices, modality, g,
                                           type_codes(EXCHANGE_TYPES)), types=EXCHANGE_TYPES)
    assert_same(tri, ref)
    assert_same(ref, loop)
    for written in (tri.keep, tri.anchor):  # every byte 0 or 1, none left at the sentinel
        assert set(written.view(torch.int8).unique().tolist()) <= {0, 1}
    assert tri.delta_f.dtype == torch.float32 and not torch.isnan(tri.delta_f).any()
    # sizes are consistent with the -1 padding and the keep-sets stay at |S|
    assert torch.equal((tri.removed >= 0).sum(-1), tri.group_size)
    assert torch.equal((tri.inserted >= 0).sum(-1), tri.group_size)
    assert torch.equal(tri.keep.sum(-1), tri.anchor.sum(-1, keepdim=True).expand_as(
        tri.group_size))


def test_types_subset_and_order_follow_the_argument():
    scores, indices, modality = make_case(11, 2, 15, [6, 5], ties=True)
    order = ("av", "vv")
    tri = build_exchanges(scores, indices, modality, g=3, types=order, backend="triton")
    full = build_exchanges(scores, indices, modality, g=3, backend="torch")
    assert tri.types == order and tri.removed.shape == (2, 2, 3)
    pick = [EXCHANGE_TYPES.index(t) for t in order]
    assert torch.equal(tri.removed, full.removed[:, pick])
    assert torch.equal(tri.keep, full.keep[:, pick])
    torch.testing.assert_close(tri.delta_f, full.delta_f[:, pick])


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_hand_checked_example(backend):
    # positions:   0    1    2    3    4    5    6    7    8    9
    modality = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 0, 1, -1]], device=DEVICE)
    scores = torch.tensor([[0.5, 0.1, 0.1, 0.9, 0.3, 0.7, 0.7, 0.2, -1.0, float("-inf")]],
                          device=DEVICE)
    indices = torch.tensor([[3, 0, 1, 4, -1]], device=DEVICE)  # S = {0, 1, 3, 4}; audio: {4}
    out = build_exchanges(scores, indices, modality, g=2, backend=backend)
    vv, aa, va, av = range(4)
    # V>V: G = two lowest retained visual (0.1 at 1 and 2? 2 is not retained) -> 1 (0.1), 0 (0.5)
    assert out.removed[0, vv].tolist() == [1, 0]
    assert out.inserted[0, vv].tolist() == [7, 2]  # unselected visual: 7 (0.2) above 2 (0.1)
    torch.testing.assert_close(out.delta_f[0, vv].cpu(), torch.tensor(0.1 + 0.5 - 0.2 - 0.1))
    # A>A: only one retained audio token -> a shortage below 2 -> skipped
    assert out.group_size[0, aa] == 0 and out.removed[0, aa].tolist() == [-1, -1]
    assert out.delta_f[0, aa] == 0 and torch.equal(out.keep[0, aa], out.anchor[0])
    # V>A: inserted audio ties 0.7 at 5 and 6 -> the lower index first
    assert out.removed[0, va].tolist() == [1, 0] and out.inserted[0, va].tolist() == [5, 6]
    assert out.group_size[0, av] == 0  # A>V also has one audio token to remove
    expected_keep = torch.zeros(10, dtype=torch.bool)
    expected_keep[[3, 4, 5, 6]] = True
    assert torch.equal(out.keep[0, va].cpu(), expected_keep)
    assert out.sets().shape == (1, 5, 10) and torch.equal(out.sets()[0, 0], out.anchor[0])
    assert out.valid.tolist() == [[True, False, True, False]]


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_g_one_exchanges_single_tokens(backend):
    modality = torch.tensor([[0, 1, 0, 1]], device=DEVICE)
    scores = torch.tensor([[1.0, 2.0, 3.0, 4.0]], device=DEVICE)
    out = build_exchanges(scores, torch.tensor([[0, 1]], device=DEVICE), modality, g=1,
                          backend=backend)
    assert out.group_size.tolist() == [[1, 1, 1, 1]]
    assert out.removed[0, :, 0].tolist() == [0, 1, 0, 1]
    assert out.inserted[0, :, 0].tolist() == [2, 3, 3, 2]


def test_delta_f_gradient_float64_reference_and_loop():
    scores, indices, modality = make_case(21, 3, 14, [5, 3, 7])
    scores = scores.double().requires_grad_()
    f = lambda s: build_exchanges(s, indices, modality, g=3, backend="torch").delta_f  # noqa: E731
    assert torch.autograd.gradcheck(f, (scores,))
    loop = lambda s: build_exchanges_loop(s, indices, modality, 3,  # noqa: E731
                                          type_codes(EXCHANGE_TYPES))[3]
    assert torch.autograd.gradcheck(loop, (scores,))
    assert f(scores).dtype == torch.float64


def test_triton_backward_is_the_signed_group_sum():
    scores, indices, modality = make_case(22, 3, 18, [6, 4, 8], ties=True)
    scores.requires_grad_()
    out = build_exchanges(scores, indices, modality, g=3, backend="triton")
    weight = torch.randn(out.delta_f.shape, generator=torch.Generator().manual_seed(0))
    weight = weight.to(DEVICE)
    (grad,) = torch.autograd.grad((out.delta_f * weight).sum(), scores)
    expected = torch.zeros(3, 18, dtype=torch.float64)
    removed, inserted, w = out.removed.cpu(), out.inserted.cpu(), weight.cpu().double()
    for b in range(3):
        for t in range(4):
            expected[b, removed[b, t][removed[b, t] >= 0]] += w[b, t]
            expected[b, inserted[b, t][inserted[b, t] >= 0]] -= w[b, t]
    torch.testing.assert_close(grad.double().cpu(), expected, rtol=1e-6, atol=1e-6)
    assert expected.abs().sum() > 0  # some exchange was built


def test_bf16_scores_and_empty_batch():
    scores, indices, modality = make_case(23, 2, 12, [4, 6])
    scores = scores.bfloat16()
    tri = build_exchanges(scores, indices, modality, g=3, backend="triton")
    ref = build_exchanges(scores, indices, modality, g=3, backend="torch")
    assert_same(tri, ref)
    assert tri.delta_f.dtype == torch.float32
    narrow = build_exchanges(scores, indices.int(), modality.to(torch.int8), g=3, backend="torch")
    assert_same(narrow, ref)
    empty = build_exchanges(torch.zeros(0, 5, device=DEVICE),
                            torch.zeros(0, 2, dtype=torch.int64, device=DEVICE),
                            torch.zeros(0, 5, dtype=torch.int64, device=DEVICE), backend="triton")
    assert empty.keep.shape == (0, 4, 5) and empty.delta_f.shape == (0, 4)


def test_unchecked_path_equals_the_public_one():
    scores, indices, modality = make_case(24, 1, 6, 2)
    want = build_exchanges(scores, indices, modality, g=3)
    got = build_exchanges_unchecked(scores, indices.long(), modality, g=3)
    for name in ("removed", "inserted", "group_size", "delta_f", "keep", "anchor"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert got.types == want.types


@requires_cuda
def test_unchecked_path_makes_no_host_sync():
    scores, indices, modality = make_case(64, 2, 320, 128)
    scores = scores.detach().requires_grad_()
    build_exchanges_unchecked(scores, indices.long(), modality, g=8)  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        build_exchanges_unchecked(scores, indices.long(), modality, g=8).delta_f.sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_float64_forced_triton_is_refused():
    scores, indices, modality = make_case(24, 1, 6, 2)
    with pytest.raises(TypeError, match="float64"):
        build_exchanges(scores.double(), indices, modality, backend="triton")


@pytest.mark.parametrize("change,error,match", [
    (lambda a: a.update(modality=a["modality"][:, :-1]), ValueError, "modality must have the"),
    (lambda a: a.update(indices=a["indices"][:1]), ValueError, "indices has 1 rows"),
    (lambda a: a.update(scores=a["scores"][0]), ValueError, "scores must be 2-D"),
    (lambda a: a["modality"].__setitem__((0, 0), 2), ValueError, "modality must hold .* got 2"),
    (lambda a: a.update(g=0), ValueError, "g must be >= 1, got 0"),
    (lambda a: a.update(g=2.0), TypeError, "g must be an int"),
    (lambda a: a.update(types=("vv", "xx")), ValueError, "types must be one of"),
    (lambda a: a.update(types="vv"), TypeError, "types must be a tuple"),
    (lambda a: a.update(types=("vv", "vv")), ValueError, "must not repeat"),
    (lambda a: a.update(types=()), ValueError, "at least one"),
    (lambda a: a["scores"].__setitem__((1, 2), float("nan")), ValueError, "NaN"),
    (lambda a: a["scores"].__setitem__((1, 2), float("inf")), ValueError, r"\+inf"),
    (lambda a: a["indices"].__setitem__((0, 1), a["indices"][0, 0]), ValueError, "twice"),
    (lambda a: a["indices"].__setitem__((0, 1), 99), ValueError, "outside"),
    (lambda a: a["indices"].__setitem__((0, 0), -3), ValueError, "got -3"),
    (lambda a: a["modality"].__setitem__((0, int(a["indices"][0, 0])), -1), ValueError,
     "padding"),
    (lambda a: a.update(scores=a["scores"].long()), TypeError, "scores must be a floating"),
    (lambda a: a.update(modality=a["modality"].float()), TypeError, "modality must be an integer"),
    (lambda a: a.update(indices=a["indices"].to("meta")), ValueError, "indices is a meta tensor"),
    (lambda a: a.update(backend="cuda"), ValueError, "backend must be one of"),
])
def test_bad_input_is_rejected(change, error, match):
    scores, indices, modality = make_case(30, 2, 10, 4)
    args = {"scores": scores, "indices": indices, "modality": modality, "g": 3,
            "types": EXCHANGE_TYPES, "backend": "torch"}
    change(args)
    with pytest.raises(error, match=match):
        build_exchanges(args["scores"], args["indices"], args["modality"], g=args["g"],
                        types=args["types"], backend=args["backend"])


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), batch=st.integers(1, 3), width=st.integers(2, 24),
       g=st.integers(1, 10), ties=st.booleans(), pad=st.integers(0, 3),
       types=st.permutations(EXCHANGE_TYPES).map(lambda p: tuple(p[:2])))
def test_random_cases_agree(seed, batch, width, g, ties, pad, types):
    gen = torch.Generator().manual_seed(seed)
    k = torch.randint(0, width + 1, (batch,), generator=gen)
    scores, indices, modality = make_case(seed, batch, width, k.clamp_min(1).tolist(), ties=ties,
                                          pad=min(pad, width - 1))
    indices[k.to(DEVICE) == 0] = -1  # an empty anchor set
    tri = build_exchanges(scores, indices, modality, g=g, types=types, backend="triton")
    ref = build_exchanges(scores, indices, modality, g=g, types=types, backend="torch")
    loop = Exchanges(*build_exchanges_loop(scores, indices, modality, g, type_codes(types)),
                     types=types)
    assert_same(tri, ref)
    assert_same(ref, loop)
