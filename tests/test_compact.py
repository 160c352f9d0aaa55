"""compact: Triton kernels (interpreter on CPU) vs the PyTorch reference vs the naive baseline,
both layouts, both position modes, both padding sides, gradients, dtypes and argument errors."""
import importlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from avex.kernels.compact import Compacted, compact
from avex.kernels.compact_ref import compact_naive
from conftest import DEVICE, poisoned_alloc

# the module, not the function of the same name that avex.kernels re-exports
compact_mod = importlib.import_module("avex.kernels.compact")


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    monkeypatch.setattr(compact_mod, "_alloc", poisoned_alloc)


def make_case(seed, batch, sets, width, features, p=0.5, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, width, features, generator=gen).to(dtype)
    keep = torch.rand(batch, sets, width, generator=gen) < p
    return hidden.to(DEVICE), keep.to(DEVICE)


def assert_same(a: Compacted, b: Compacted):
    assert torch.equal(a.hidden, b.hidden)
    for name in ("position_ids", "index", "cu_seqlens"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.max_seqlen == b.max_seqlen
    assert (a.attention_mask is None) == (b.attention_mask is None)
    if a.attention_mask is not None:
        assert torch.equal(a.attention_mask, b.attention_mask)


OPTIONS = [(layout, positions, side) for layout in ("padded", "varlen")
           for positions in ("original", "contiguous") for side in ("right", "left")
           if layout == "padded" or side == "right"]


@pytest.mark.parametrize("layout,positions,side", OPTIONS)
@pytest.mark.parametrize("seed,batch,sets,width,features", [
    (0, 3, 5, 13, 40),   # S = 5, ragged, D not a multiple of the block
    (1, 4, 1, 9, 24),    # S = 1
])
def test_kernel_matches_reference(seed, batch, sets, width, features, layout, positions, side):
    hidden, keep = make_case(seed, batch, sets, width, features)
    keep[1, 0] = False           # an empty set
    keep[0, -1] = True           # a set that keeps everything (K = N)
    tri = compact(hidden, keep, layout=layout, positions=positions, padding_side=side,
                  backend="triton")
    ref = compact(hidden, keep, layout=layout, positions=positions, padding_side=side,
                  backend="torch")
    assert_same(tri, ref)
    assert tri.cu_seqlens.dtype == torch.int32 and tri.cu_seqlens[0] == 0
    assert tri.max_seqlen == int(keep.sum(-1).max())


def test_two_dim_keep_and_the_naive_baseline():
    hidden, keep = make_case(2, 3, 1, 11, 20)
    flat = keep[:, 0]
    out = compact(hidden, flat, backend="triton")  # [B, L] keep -> S = 1
    naive_hidden, naive_mask = compact_naive(hidden, keep)
    assert torch.equal(out.hidden, naive_hidden)
    assert torch.equal(out.attention_mask, naive_mask)
    assert out.hidden.shape[0] == 3


def test_layouts_and_positions_agree_with_each_other():
    hidden, keep = make_case(3, 2, 3, 10, 12)
    var = compact(hidden, keep, layout="varlen", backend="triton")
    left = compact(hidden, keep, layout="padded", padding_side="left", backend="triton")
    right = compact(hidden, keep, layout="padded", positions="contiguous", backend="triton")
    for r in range(6):
        lo, hi = int(var.cu_seqlens[r]), int(var.cu_seqlens[r + 1])
        n = hi - lo
        b, s = divmod(r, 3)
        kept_cols = torch.nonzero(keep[b, s]).flatten()
        assert torch.equal(var.hidden[lo:hi], hidden[b, kept_cols])
        assert torch.equal(var.position_ids[lo:hi], kept_cols)
        assert torch.equal(var.index[lo:hi], b * 10 + kept_cols)
        assert torch.equal(left.hidden[r, left.max_seqlen - n:], var.hidden[lo:hi])
        assert not left.hidden[r, :left.max_seqlen - n].any()
        assert left.attention_mask[r].tolist() == [0] * (left.max_seqlen - n) + [1] * n
        assert right.position_ids[r, :n].tolist() == list(range(n))
        assert not right.position_ids[r, n:].any() and (right.index[r, n:] == -1).all()


def test_wide_rows_loop_over_feature_blocks():
    hidden, keep = make_case(4, 2, 2, 6, compact_mod.COPY_MAX_WIDTH + 37)
    for layout in ("padded", "varlen"):
        assert_same(compact(hidden, keep, layout=layout, backend="triton"),
                    compact(hidden, keep, layout=layout, backend="torch"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dtypes_forward_exact_backward_accumulated(dtype):
    hidden, keep = make_case(5, 2, 4, 9, 16, p=0.7, dtype=dtype)
    hidden.requires_grad_()
    tri = compact(hidden, keep, backend="triton")
    ref = compact(hidden, keep, backend="torch")
    assert tri.hidden.dtype == dtype
    assert_same(tri, ref)
    weight = torch.randn(tri.hidden.shape, generator=torch.Generator().manual_seed(1))
    (grad,) = torch.autograd.grad((tri.hidden * weight.to(DEVICE, dtype)).sum(), hidden)
    assert grad.dtype == dtype
    # exact answer: each row's gradient is the sum over the sets that kept it
    expected = torch.zeros(hidden.shape, dtype=torch.float64)
    rounded, index = weight.to(dtype).double(), tri.index.cpu()
    expected.view(-1, 16).index_add_(0, index[index >= 0], rounded[index >= 0])
    tol = {torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 1e-3}[dtype]
    torch.testing.assert_close(grad.double().cpu(), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("layout", ["padded", "varlen"])
def test_gradients_float64(layout):
    hidden, keep = make_case(6, 2, 5, 5, 2, dtype=torch.float64)
    hidden.requires_grad_()
    for backend in ("triton", "torch"):
        f = lambda h: compact(h, keep, layout=layout, backend=backend).hidden  # noqa: E731
        assert torch.autograd.gradcheck(f, (hidden,))


def test_all_empty_and_empty_batch():
    hidden, keep = make_case(7, 2, 3, 5, 4)
    keep[:] = False
    for backend in ("triton", "torch"):
        out = compact(hidden, keep, backend=backend)
        assert out.hidden.shape == (6, 0, 4) and out.max_seqlen == 0
        var = compact(hidden, keep, layout="varlen", backend=backend)
        assert var.hidden.shape == (0, 4) and var.cu_seqlens.tolist() == [0] * 7
    empty = compact(torch.zeros(0, 5, 4, device=DEVICE),
                    torch.zeros(0, 2, 5, dtype=torch.bool, device=DEVICE),
                    backend="triton")
    assert empty.hidden.shape == (0, 0, 4)


def test_sets_read_one_copy_of_the_sample():
    """The S sets index into hidden itself: the gather index points at rows of the [B*L, D]
    input (never at an S-fold copy), and the backward sums the sets' gradients per row."""
    hidden, keep = make_case(8, 2, 5, 6, 4)
    keep[:, :, 2] = True  # every set keeps token 2 of each sample
    hidden.requires_grad_()
    out = compact(hidden, keep, layout="varlen", backend="triton")
    assert int(out.index.max()) < 2 * 6
    (grad,) = torch.autograd.grad(out.hidden.sum(), hidden)
    assert torch.equal(grad[:, 2].cpu(), torch.full((2, 4), 5.0))


@pytest.mark.parametrize("change,error,match", [
    (lambda a: a.update(keep=a["keep"][:, :, :-1]), ValueError, "keep must have shape"),
    (lambda a: a.update(keep=a["keep"][:1]), ValueError, "keep must have shape"),
    (lambda a: a.update(keep=a["keep"][:, :0]), ValueError, "at least one set"),
    (lambda a: a.update(keep=a["keep"].long()), TypeError, "keep must be a bool"),
    (lambda a: a.update(keep=a["keep"][0, 0]), ValueError, "keep must be 2-D or 3-D"),
    (lambda a: a.update(hidden=a["hidden"][0]), ValueError, "hidden must be 3-D"),
    (lambda a: a.update(hidden=a["hidden"].long()), TypeError, "hidden must be a floating"),
    (lambda a: a.update(layout="packed"), ValueError, "layout must be one of"),
    (lambda a: a.update(positions="absolute"), ValueError, "positions must be one of"),
    (lambda a: a.update(padding_side="top"), ValueError, "padding_side must be one of"),
    (lambda a: a.update(keep=a["keep"].to("meta")), ValueError, "keep is a meta tensor"),
    (lambda a: a.update(backend="gpu"), ValueError, "backend must be one of"),
])
def test_bad_input_is_rejected(change, error, match):
    hidden, keep = make_case(9, 2, 3, 5, 4)
    args = {"hidden": hidden, "keep": keep, "layout": "padded", "positions": "original",
            "padding_side": "right", "backend": "torch"}
    change(args)
    with pytest.raises(error, match=match):
        compact(args["hidden"], args["keep"], layout=args["layout"],
                positions=args["positions"], padding_side=args["padding_side"],
                backend=args["backend"])


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**16), batch=st.integers(1, 3), sets=st.integers(1, 4),
       width=st.integers(1, 20), features=st.integers(1, 70), p=st.floats(0.0, 1.0),
       option=st.sampled_from(OPTIONS))
def test_random_cases_agree(seed, batch, sets, width, features, p, option):
    layout, positions, side = option
    hidden, keep = make_case(seed, batch, sets, width, features, p=p)
    assert_same(compact(hidden, keep, layout=layout, positions=positions, padding_side=side,
                        backend="triton"),
                 compact(hidden, keep, layout=layout, positions=positions, padding_side=side,
                         backend="torch"))
