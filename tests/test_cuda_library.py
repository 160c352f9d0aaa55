"""The CUDA C++ library (kernels/csrc, built by CMakeLists.txt) and its ctypes binding.

Without a GPU (CI, laptops) these tests check what can be checked: the CMake build, the
header compiled as C, a C program linked against the library, argument errors through the
binding, a clean CUDA error (never a crash) when a call reaches the missing GPU, and the kernel
bodies' algorithms, run thread by thread on the CPU by the host-simulation build
(libavex_prune_hostsim.so), against the same PyTorch reference as the Triton kernels. The
kernels themselves run only in the tests marked ``requires_cuda``.

If the library isn't built, the tests skip and say so, except under AVEX_REQUIRE_CUDA_BUILD=1
(CI), where a missing build fails.
"""
import importlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from avex.kernels import compact, gumbel_topk, plackett_luce_log_prob
from avex.kernels.compact_ref import compact_ref
from avex.kernels.gumbel_topk import MAX_TRITON_WIDTH
from avex.kernels.gumbel_topk_ref import gumbel_topk_ref

from conftest import poisoned_alloc, requires_cuda

cuda_lib = importlib.import_module("avex.kernels.cuda_lib")

REPO = Path(__file__).resolve().parents[1]
BUILD = cuda_lib.library_path().parent
INCLUDE = REPO / "kernels" / "csrc" / "include"


def _built(name: str) -> Path:
    path = BUILD / name
    if not path.is_file():
        if os.environ.get("AVEX_REQUIRE_CUDA_BUILD") == "1":
            pytest.fail(f"{path} is missing: `cmake -S . -B build && cmake --build build` "
                        "should have built it")
        pytest.skip(f"{path} not built (cmake -S . -B build && cmake --build build; needs nvcc)")
    return path


@pytest.fixture(scope="module")
def hostsim():
    _built(cuda_lib.HOSTSIM_NAME)
    return cuda_lib.load(host_simulation=True)


@pytest.fixture(scope="module")
def library():
    _built(cuda_lib.LIBRARY_NAME)
    return cuda_lib.load()


@pytest.fixture(params=["forward", "reverse", "scrambled"])
def thread_order(request, hostsim):
    """Each simulated step runs its threads in this order. A result that changes with it means
    a race between the threads of one step, which the real GPU could hit."""
    order = ["forward", "reverse", "scrambled"].index(request.param)
    assert hostsim.raw.avex_hostsim_set_thread_order(order) == 0
    yield request.param
    hostsim.raw.avex_hostsim_set_thread_order(0)


@pytest.fixture
def poisoned(monkeypatch):
    monkeypatch.setattr(cuda_lib, "_alloc", poisoned_alloc)


# ----------------------------------------------------------------------------------------------
# Build, header, linking: no GPU needed
# ----------------------------------------------------------------------------------------------

def test_cmake_built_every_target():
    for name in (cuda_lib.LIBRARY_NAME, cuda_lib.HOSTSIM_NAME, "avex_prune_example",
                 "avex_header_check"):
        assert _built(name).stat().st_size > 0


def test_header_compiles_as_strict_c():
    compiler = shutil.which("cc") or shutil.which("gcc")
    cuda_include = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
    if compiler is None or not (cuda_include / "cuda_runtime_api.h").is_file():
        if os.environ.get("AVEX_REQUIRE_CUDA_BUILD") == "1":
            pytest.fail("a C compiler and the CUDA headers are needed for this check")
        pytest.skip("needs a C compiler and the CUDA toolkit's headers")
    # CUDA's own headers are system headers (-isystem), as CMake includes them.
    source = '#include "avex_prune.h"\nint main(void) { return (int)AVEX_SUCCESS; }\n'
    result = subprocess.run(
        [compiler, "-std=c99", "-Wall", "-Wextra", "-pedantic", "-Werror", "-fsyntax-only",
         f"-I{INCLUDE}", "-isystem", str(cuda_include), "-x", "c", "-"],
        input=source, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_c_program_links_and_gets_error_codes():
    """avex_header_check is a C program linked against libavex_prune; its checks are host-side
    argument errors, so it runs here."""
    result = subprocess.run([str(_built("avex_header_check"))], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "AVEX_ERROR_NULL_POINTER: avex_topk_rows: scores is NULL" in result.stdout


def test_status_names_match_the_binding(library, hostsim):
    for lib in (library, hostsim):
        for status, name in enumerate(cuda_lib.STATUS_NAMES):
            assert lib.status_name(status) == name
        assert lib.status_name(99) == "AVEX_UNKNOWN_STATUS"
    assert hostsim.raw.avex_hostsim_set_thread_order(3) == -1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path; a GPU is here")
def test_without_a_gpu_calls_fail_cleanly(library):
    """Valid arguments reach the CUDA runtime, which finds no GPU: an error code, no crash."""
    scores = torch.zeros(2, 8)
    k = torch.ones(2, dtype=torch.int64)
    out = torch.empty(2, 1, dtype=torch.int64)
    status = library.raw.avex_topk_rows(scores.data_ptr(), 2, 8, None, k.data_ptr(), 1, 1.0,
                                        out.data_ptr(), None)
    assert library.status_name(status) == "AVEX_ERROR_CUDA"
    assert "cudaGetDevice failed" in library.last_error_message()
    example = subprocess.run([str(_built("avex_prune_example"))], capture_output=True, text=True)
    assert example.returncode == 1 and "failed" in example.stderr, example.stderr


# ----------------------------------------------------------------------------------------------
# Top-K: host simulation of the kernel bodies against the reference
# ----------------------------------------------------------------------------------------------

def _topk_case(seed, batch, width, *, ties=False, neg_inf=0.0, ragged=False, k_mode="random"):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(batch, width, generator=g)
    if ties:
        scores = torch.randint(-3, 3, (batch, width), generator=g).float()
    if neg_inf:
        scores[torch.rand(batch, width, generator=g) < neg_inf] = float("-inf")
    lengths = (torch.randint(0, width + 1, (batch,), generator=g) if ragged
               else torch.full((batch,), width))
    valid = (torch.arange(width) < lengths[:, None]) & (scores > float("-inf"))
    selectable = valid.sum(1)
    keep_rows = selectable > 0
    scores, lengths, selectable = scores[keep_rows], lengths[keep_rows], selectable[keep_rows]
    if k_mode == "one":
        k = torch.ones_like(selectable)
    elif k_mode == "all":
        k = selectable.clone()
    else:
        k = 1 + (torch.rand(len(selectable), generator=g) * selectable).long().clamp_max(
            selectable - 1)
    return scores, k, lengths


TOPK_CASES = [
    # seed, batch, width, options
    (0, 1, 1, {}),
    (1, 3, 7, {}),
    (2, 4, 33, {"ties": True}),
    (3, 5, 100, {"neg_inf": 0.3}),
    (4, 6, 320, {"ragged": True}),
    (5, 3, 257, {"ragged": True, "neg_inf": 0.2, "ties": True}),
    (6, 2, 1000, {"k_mode": "one"}),
    (7, 2, 1000, {"k_mode": "all", "ties": True}),
    (8, 2, 1500, {"ragged": True}),
    (9, 1, 5000, {"neg_inf": 0.5}),
]


@pytest.mark.parametrize("tau", [1.0, 0.5, 0.07])
@pytest.mark.parametrize("seed,batch,width,options", TOPK_CASES)
def test_topk_simulation_matches_reference(hostsim, thread_order, poisoned, seed, batch, width,
                                           options, tau):
    scores, k, lengths = _topk_case(seed, batch, width, **options)
    kmax = int(k.max())
    want, _ = gumbel_topk_ref(scores, k, kmax, lengths, tau, 0, False)
    got = hostsim.topk_rows(scores, k, kmax, lengths, tau)
    hostsim.check_device_errors()
    assert torch.equal(got, want)


def test_topk_simulation_extremes(hostsim, thread_order):
    """Large scores with a small tau, -0.0 against +0.0, and the widest row."""
    scores = torch.tensor([[1e4, 1e4 - 0.03, -1e4, 1e4, -0.0, 0.0, 3.0, -0.0]])
    k = torch.tensor([8])
    for tau in (0.05, 1.0):
        want, _ = gumbel_topk_ref(scores, k, 8, torch.tensor([8]), tau, 0, False)
        assert torch.equal(hostsim.topk_rows(scores, k, 8, None, tau), want)
    wide = torch.randn(1, cuda_lib.TOPK_MAX_WIDTH, generator=torch.Generator().manual_seed(0))
    k = torch.tensor([100])
    want, _ = gumbel_topk_ref(wide, k, 100, torch.tensor([wide.shape[1]]), 1.0, 0, False)
    assert torch.equal(hostsim.topk_rows(wide, k, 100), want)


def test_topk_kmax_above_a_rows_k_pads_with_minus_one(hostsim):
    scores = torch.randn(3, 12)
    k = torch.tensor([1, 5, 12])
    got = hostsim.topk_rows(scores, k, 12)
    want, _ = gumbel_topk_ref(scores, k, 12, torch.full((3,), 12), 1.0, 0, False)
    assert torch.equal(got, want)
    assert (got[0, 1:] == -1).all() and (got[2] >= 0).all()


@pytest.mark.parametrize("mapped", [False, True])
def test_mark_kept_simulation_matches_a_scatter(hostsim, mapped):
    g = torch.Generator().manual_seed(5)
    scores, k, lengths = _topk_case(6, 5, 40, ragged=True, neg_inf=0.1)
    indices = hostsim.topk_rows(scores, k, int(k.max()), lengths)
    batch, seq_len = scores.shape[0], 70
    token_index = (6 + torch.stack([torch.randperm(60, generator=g)[:40] for _ in range(batch)])
                   if mapped else None)
    keep = torch.rand(batch, seq_len, generator=g) < 0.1   # e.g. text tokens already set
    want = keep.clone()
    for row in range(batch):
        columns = indices[row][indices[row] >= 0]
        want[row, token_index[row, columns] if mapped else columns] = True
    hostsim.mark_kept(indices, keep, 40, token_index)
    hostsim.check_device_errors()
    assert torch.equal(keep, want)


def test_mark_kept_bad_input(hostsim, library):
    indices = torch.tensor([[0, 2, -1], [1, 5, 3]])
    for lib in (library, hostsim):
        keep = torch.zeros(2, 8, dtype=torch.bool)
        raw = lib.raw.avex_mark_kept
        assert lib.status_name(raw(None, 2, 3, 6, None, keep.data_ptr(), 8, None)) == \
            "AVEX_ERROR_NULL_POINTER"
        assert "kmax = 3 exceeds width = 2" in (raw(indices.data_ptr(), 2, 3, 2, None,
                                                    keep.data_ptr(), 8, None),
                                                lib.last_error_message())[1]
        assert lib.status_name(raw(indices.data_ptr(), 2, 3, 6, None, keep.data_ptr(), 4,
                                   None)) == "AVEX_ERROR_INVALID_SIZE"
        assert "width = 6 must be <= seq_len = 4" in lib.last_error_message()
        assert lib.status_name(raw(indices.data_ptr(), -2, 3, 6, None, keep.data_ptr(), 8,
                                   None)) == "AVEX_ERROR_INVALID_SIZE"
    # Only the kernel sees the values: a chosen column past the width, a position past seq_len.
    keep = torch.zeros(2, 8, dtype=torch.bool)
    hostsim.mark_kept(indices, keep, 5)
    with pytest.raises(cuda_lib.CudaLibraryError,
                       match=r"row 1 chooses column 5, outside \[-1, width = 5\)"):
        hostsim.check_device_errors()
    token_index = torch.tensor([[0, 1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12]])
    hostsim.mark_kept(indices, keep, 6, token_index)
    with pytest.raises(cuda_lib.CudaLibraryError,
                       match=r"row 1 maps a chosen column to position 8, outside \[0, seq_len = 8\)"):
        hostsim.check_device_errors()


# ----------------------------------------------------------------------------------------------
# Compaction: host simulation against the reference
# ----------------------------------------------------------------------------------------------

COMPACT_OPTIONS = [("varlen", "original", "right"), ("varlen", "contiguous", "right"),
                   ("padded", "original", "right"), ("padded", "contiguous", "left")]


def _assert_compacted_equal(got, want):
    names = ("hidden", "position_ids", "index", "cu_seqlens", "max_seqlen", "attention_mask")
    for name, g, w in zip(names, got, want):
        if isinstance(w, torch.Tensor):
            assert g.dtype == w.dtype and torch.equal(g, w), name
        else:
            assert g == w, name


@pytest.mark.parametrize("layout,positions,side", COMPACT_OPTIONS)
@pytest.mark.parametrize("seed,batch,sets,width,features,p,dtype", [
    (0, 1, 1, 1, 1, 1.0, torch.float32),
    (1, 2, 1, 7, 3, 0.5, torch.float32),
    (2, 3, 4, 33, 8, 0.4, torch.bfloat16),
    (3, 2, 2, 100, 5, 0.0, torch.float32),
    (4, 2, 3, 344, 64, 0.4, torch.float16),
    (5, 1, 9, 1100, 24, 0.3, torch.float64),
    (6, 40, 1, 50, 2, 0.7, torch.bfloat16),
    (7, 3, 1, 2049, 1, 0.95, torch.float32),
])
def test_compact_simulation_matches_reference(hostsim, thread_order, poisoned, seed, batch, sets,
                                              width, features, p, dtype, layout, positions, side):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(batch, width, features, generator=g).to(dtype)
    keep = torch.rand(batch, sets, width, generator=g) < p
    got = hostsim.compact(hidden, keep, layout=layout, positions=positions, padding_side=side)
    hostsim.check_device_errors()
    _assert_compacted_equal(got, compact_ref(hidden, keep, layout, positions, side))


def test_compact_simulation_empty_inputs(hostsim, thread_order):
    for shape in [(0, 1, 5), (2, 1, 0), (2, 3, 4)]:
        hidden = torch.randn(shape[0], shape[2], 3)
        keep = torch.zeros(shape, dtype=torch.bool)
        for layout in ("varlen", "padded"):
            got = hostsim.compact(hidden, keep, layout=layout)
            hostsim.check_device_errors()
            _assert_compacted_equal(got, compact_ref(hidden, keep, layout, "original", "right"))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float16])
def test_compact_simulation_odd_row_sizes(hostsim, poisoned, dtype):
    """Rows of 3 and of 6 bytes, which no wide word divides."""
    hidden = torch.randint(0, 255, (2, 9, 3)).to(dtype)
    keep = torch.rand(2, 1, 9) < 0.5
    for layout in ("varlen", "padded"):
        got = hostsim.compact(hidden, keep, layout=layout)
        _assert_compacted_equal(got, compact_ref(hidden, keep, layout, "original", "right"))


# ----------------------------------------------------------------------------------------------
# Bad input through the binding: host-side checks (both builds) and device-side checks
# ----------------------------------------------------------------------------------------------

def _topk_call(lib, **change):
    scores = torch.zeros(2, 8)
    k = torch.ones(2, dtype=torch.int64)
    out = torch.empty(2, 8, dtype=torch.int64)
    args = dict(scores=scores.data_ptr(), batch=2, width=8, lengths=None, k=k.data_ptr(),
                kmax=1, tau=1.0, indices=out.data_ptr(), stream=None)
    args.update(change)
    status = lib.raw.avex_topk_rows(*args.values())
    return lib.status_name(status), lib.last_error_message()


@pytest.mark.parametrize("change,status,message", [
    ({"scores": None}, "AVEX_ERROR_NULL_POINTER", "scores is NULL"),
    ({"k": None}, "AVEX_ERROR_NULL_POINTER", "k is NULL"),
    ({"indices": None}, "AVEX_ERROR_NULL_POINTER", "indices is NULL"),
    ({"batch": -1}, "AVEX_ERROR_INVALID_SIZE", "batch must be >= 0, got -1"),
    ({"width": -8}, "AVEX_ERROR_INVALID_SIZE", "width must be >= 0, got -8"),
    ({"kmax": -2}, "AVEX_ERROR_INVALID_SIZE", "kmax must be >= 0, got -2"),
    ({"kmax": 9}, "AVEX_ERROR_K_OUT_OF_RANGE", "kmax must lie in [1, width = 8], got 9"),
    ({"kmax": 0}, "AVEX_ERROR_K_OUT_OF_RANGE", "got 0"),
    ({"tau": 0.0}, "AVEX_ERROR_INVALID_VALUE", "tau must be finite and > 0, got 0"),
    ({"tau": float("nan")}, "AVEX_ERROR_INVALID_VALUE", "tau must be finite"),
    ({"width": 20000, "scores": 1}, "AVEX_ERROR_UNSUPPORTED", "width = 20000"),
])
@pytest.mark.parametrize("which", ["library", "hostsim"])
def test_topk_bad_input_gives_an_error_code(request, which, change, status, message):
    lib = request.getfixturevalue(which)
    got_status, got_message = _topk_call(lib, **change)
    assert got_status == status
    assert message in got_message and got_message.startswith("avex_topk_rows: ")


def _compact_call(lib, fn, **change):
    hidden = torch.zeros(2, 6, 4)
    keep = torch.ones(2, 6, dtype=torch.uint8)
    out = torch.empty(12, 4)
    ids = torch.empty(12, dtype=torch.int64)
    cu = torch.empty(3, dtype=torch.int32)
    args = dict(hidden=hidden.data_ptr(), element_size=4, batch=2, seq_len=6, hidden_size=4,
                keep=keep.data_ptr(), num_sets=1, positions=0)
    if fn == "avex_compact_varlen":
        args.update(capacity=12)
    else:
        args.update(side=0, padded_width=6)
    args.update(out=out.data_ptr(), position_ids=ids.data_ptr(), index=ids.data_ptr(),
                cu_seqlens=cu.data_ptr(), last=None, stream=None)
    args.update(change)
    status = getattr(lib.raw, fn)(*args.values())
    return lib.status_name(status), lib.last_error_message()


@pytest.mark.parametrize("change,status,message", [
    ({"hidden": None}, "AVEX_ERROR_NULL_POINTER", "hidden is NULL"),
    ({"keep": None}, "AVEX_ERROR_NULL_POINTER", "keep is NULL"),
    ({"cu_seqlens": None}, "AVEX_ERROR_NULL_POINTER", "cu_seqlens is NULL"),
    ({"out": None}, "AVEX_ERROR_NULL_POINTER", "out_hidden is NULL"),
    ({"index": None}, "AVEX_ERROR_NULL_POINTER", "index is NULL"),
    ({"batch": -2}, "AVEX_ERROR_INVALID_SIZE", "batch must be >= 0, got -2"),
    ({"seq_len": -1}, "AVEX_ERROR_INVALID_SIZE", "seq_len must be >= 0, got -1"),
    ({"hidden_size": -4}, "AVEX_ERROR_INVALID_SIZE", "hidden_size must be >= 0, got -4"),
    ({"element_size": 0}, "AVEX_ERROR_INVALID_SIZE", "element_size must be >= 1, got 0"),
    ({"num_sets": -1}, "AVEX_ERROR_INVALID_SIZE", "num_sets must be >= 0, got -1"),
    ({"positions": 7}, "AVEX_ERROR_INVALID_VALUE", "positions must be"),
    ({"batch": 2**40, "seq_len": 2**30}, "AVEX_ERROR_INVALID_SIZE", "exceeds"),
])
@pytest.mark.parametrize("fn", ["avex_compact_varlen", "avex_compact_padded"])
@pytest.mark.parametrize("which", ["library", "hostsim"])
def test_compact_bad_input_gives_an_error_code(request, which, fn, change, status, message):
    lib = request.getfixturevalue(which)
    got_status, got_message = _compact_call(lib, fn, **change)
    assert got_status == status, got_message
    assert message in got_message and got_message.startswith(fn + ": ")


@pytest.mark.parametrize("which", ["library", "hostsim"])
def test_compact_layout_specific_bad_input(request, which):
    lib = request.getfixturevalue(which)
    assert _compact_call(lib, "avex_compact_varlen", capacity=-1)[0] == "AVEX_ERROR_INVALID_SIZE"
    assert "capacity = 4294967296 is above" in _compact_call(
        lib, "avex_compact_varlen", capacity=2**32)[1]
    status, message = _compact_call(lib, "avex_compact_padded", side=2)
    assert status == "AVEX_ERROR_INVALID_VALUE" and "side must be" in message
    status, message = _compact_call(lib, "avex_compact_padded", padded_width=-6)
    assert status == "AVEX_ERROR_INVALID_SIZE" and "padded_width must be >= 0, got -6" in message


def test_device_side_errors_are_reported_by_check(hostsim):
    """Errors only the kernels can see (a row's K above its tokens, lengths out of range, a
    capacity too small) come back from avex_check_device_errors, with the row and values."""
    scores = torch.tensor([[0.0, 1.0, float("-inf"), 2.0], [1.0, 2.0, 3.0, 4.0]])
    cases = [
        (torch.tensor([4, 4]), None, "AVEX_ERROR_K_OUT_OF_RANGE", "k[0] = 4, outside [1, 3]"),
        (torch.tensor([1, 0]), None, "AVEX_ERROR_K_OUT_OF_RANGE", "k[1] = 0, outside [1, 4]"),
        (torch.tensor([1, 1]), torch.tensor([2, 5]), "AVEX_ERROR_INVALID_VALUE",
         "lengths[1] = 5, outside [0, width = 4]"),
    ]
    for k, lengths, status, message in cases:
        out = torch.empty(2, 4, dtype=torch.int64)
        assert hostsim.raw.avex_topk_rows(
            scores.data_ptr(), 2, 4, None if lengths is None else lengths.data_ptr(),
            k.data_ptr(), 4, 1.0, out.data_ptr(), None) == 0
        with pytest.raises(cuda_lib.CudaLibraryError) as info:
            hostsim.check_device_errors()
        assert info.value.name == status and message in str(info.value)
        hostsim.check_device_errors()  # the record was cleared

    status, message = _compact_call(hostsim, "avex_compact_varlen", capacity=5)
    assert status == "AVEX_SUCCESS", message
    with pytest.raises(cuda_lib.CudaLibraryError, match="hold 12 tokens, more than capacity = 5"):
        hostsim.check_device_errors()
    _compact_call(hostsim, "avex_compact_padded", padded_width=4)
    with pytest.raises(cuda_lib.CudaLibraryError, match="longest keep-set holds 6 tokens, more "
                                                         "than padded_width = 4"):
        hostsim.check_device_errors()


def test_binding_rejects_wrong_devices_and_dtypes(hostsim):
    with pytest.raises(TypeError, match="scores must have dtype torch.float32"):
        hostsim.topk_rows(torch.zeros(2, 4, dtype=torch.float64), torch.ones(2).long(), 1)
    with pytest.raises(ValueError, match="keep must be on a cpu device"):
        hostsim.compact(torch.zeros(1, 4, 2), torch.ones(1, 1, 4, dtype=torch.bool,
                                                         device="meta"))


def test_backend_cuda_needs_cuda_tensors():
    with pytest.raises(ValueError, match="backend='cuda' .* needs CUDA tensors, got tensors on cpu"):
        compact(torch.zeros(1, 4, 2), torch.ones(1, 4, dtype=torch.bool), backend="cuda")
    with pytest.raises(ValueError, match="needs CUDA tensors"):
        gumbel_topk(torch.zeros(1, 4), 1, sample=False, backend="cuda")
    # Only compact and gumbel_topk have a CUDA library path.
    with pytest.raises(ValueError, match=r"backend must be one of \('auto', 'triton', 'torch'\)"):
        plackett_luce_log_prob(torch.zeros(1, 4), torch.tensor([[0]]), backend="cuda")


@pytest.fixture
def cuda_paths_on_hostsim(monkeypatch, hostsim):
    """Route backend='cuda' of compact and gumbel_topk to the host simulation, on CPU tensors:
    the Python glue (outputs, autograd, the log-probability) runs here as it would on a GPU."""
    compact_module = importlib.import_module("avex.kernels.compact")
    topk_module = importlib.import_module("avex.kernels.gumbel_topk")
    monkeypatch.setattr(compact_module, "load_cuda_library", lambda: hostsim)
    monkeypatch.setattr(topk_module, "load_cuda_library", lambda: hostsim)
    monkeypatch.setattr(compact_module, "resolve_backend", lambda *a, **k: "cuda")
    resolve = topk_module.resolve_row_backend  # plackett_luce_log_prob keeps its own choice
    monkeypatch.setattr(topk_module, "resolve_row_backend",
                        lambda backend, scores, *, op, **k: "cuda" if backend == "cuda" else
                        resolve(backend, scores, op=op, **k))


@pytest.mark.parametrize("layout,positions,side", COMPACT_OPTIONS)
def test_backend_cuda_glue_forward_and_float64_gradients(cuda_paths_on_hostsim, layout,
                                                         positions, side):
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(2, 11, 5, dtype=torch.float64, generator=g, requires_grad=True)
    keep = torch.rand(2, 3, 11, generator=g) < 0.5
    got = compact(hidden, keep, layout=layout, positions=positions, padding_side=side,
                  backend="cuda")
    want = compact_ref(hidden, keep, layout, positions, side)
    _assert_compacted_equal(tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in got),
                            tuple(t.detach() if isinstance(t, torch.Tensor) else t for t in want))
    assert torch.autograd.gradcheck(
        lambda h: compact(h, keep, layout=layout, positions=positions, padding_side=side,
                          backend="cuda").hidden, (hidden,))


def test_backend_cuda_glue_topk_and_log_prob(cuda_paths_on_hostsim):
    scores, k, lengths = _topk_case(4, 4, 12, ragged=True, neg_inf=0.2)
    scores = scores.double().requires_grad_()
    with pytest.raises(ValueError, match="deterministic Top-K only; pass sample=False"):
        gumbel_topk(scores, k, lengths=lengths, backend="cuda")
    indices, log_prob = gumbel_topk(scores.float(), k, tau=0.5, lengths=lengths, sample=False,
                                    backend="cuda", log_prob=True)
    want, want_logp = gumbel_topk_ref(scores.detach().float(), k, int(k.max()), lengths, 0.5, 0,
                                      False)
    assert torch.equal(indices, want)
    torch.testing.assert_close(log_prob, want_logp)
    # The log-probability is differentiable through plackett_luce_log_prob (float64 here).
    idx, _ = gumbel_topk(scores, k, lengths=lengths, sample=False, backend="cuda")
    assert torch.autograd.gradcheck(
        lambda s: plackett_luce_log_prob(s, idx, lengths=lengths), (scores,))


def test_missing_library_says_how_to_build_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="cmake -S . -B build"):
        cuda_lib.CudaLibrary(tmp_path / "libavex_prune.so")


def test_library_path_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("AVEX_CUDA_LIB", str(tmp_path / "x" / "libavex_prune.so"))
    assert cuda_lib.library_path() == tmp_path / "x" / "libavex_prune.so"
    assert cuda_lib.library_path(True) == tmp_path / "x" / cuda_lib.HOSTSIM_NAME


# ----------------------------------------------------------------------------------------------
# On a GPU: the library against the reference and the Triton path
# ----------------------------------------------------------------------------------------------

@requires_cuda
@pytest.mark.parametrize("tau", [1.0, 0.5])
@pytest.mark.parametrize("seed,batch,width,options", TOPK_CASES)
def test_cuda_topk_matches_reference_and_triton(library, seed, batch, width, options, tau):
    scores, k, lengths = _topk_case(seed, batch, width, **options)
    want, want_logp = gumbel_topk_ref(scores, k, int(k.max()), lengths, tau, 0, False)
    s, kd, ld = scores.cuda(), k.cuda(), lengths.cuda()
    got, logp = gumbel_topk(s, kd, tau=tau, lengths=ld, sample=False, backend="cuda",
                            log_prob=True)
    library.check_device_errors()
    assert torch.equal(got.cpu(), want)
    torch.testing.assert_close(logp.cpu(), want_logp, rtol=1e-5, atol=1e-4)
    if width <= MAX_TRITON_WIDTH:   # wider rows: the Triton path refuses (tested on the CPU)
        triton_idx, _ = gumbel_topk(s, kd, tau=tau, lengths=ld, sample=False, backend="triton")
        assert torch.equal(triton_idx.cpu(), want)


@requires_cuda
@pytest.mark.parametrize("width,k", [(1, 1), (320, 128), (1000, 1000), (5000, 37)])
def test_cuda_topk_without_lengths_or_log_prob(library, width, k):
    """The call inference makes (no lengths, no log-probability) takes gumbel_topk's shortcut
    through torch.topk: with backend="cuda" it must still reach the library, at any width the
    library takes. It once refused every width there (the shortcut asked the dispatch for the
    library without its width limit)."""
    gen = torch.Generator().manual_seed(width)
    scores = torch.randn(3, width, generator=gen)
    want, _ = gumbel_topk_ref(scores, torch.full((3,), k), k, torch.full((3,), width), 1.0, 0,
                              False)
    got, logp = gumbel_topk(scores.cuda(), k, sample=False, backend="cuda")
    library.check_device_errors()
    assert logp is None
    assert torch.equal(got.cpu(), want)


@requires_cuda
@pytest.mark.parametrize("layout,positions,side", COMPACT_OPTIONS)
@pytest.mark.parametrize("batch,sets,width,features,dtype", [
    (1, 1, 1, 1, torch.float32), (2, 3, 33, 8, torch.bfloat16), (2, 1, 344, 3584, torch.bfloat16),
    (1, 9, 1100, 24, torch.float64), (3, 1, 2049, 3, torch.float16)])
def test_cuda_compact_matches_reference_and_triton(library, monkeypatch, batch, sets, width,
                                                   features, dtype, layout, positions, side):
    monkeypatch.setattr(cuda_lib, "_alloc", poisoned_alloc)
    hidden = torch.randn(batch, width, features, device="cuda").to(dtype)
    keep = torch.rand(batch, sets, width, device="cuda") < 0.4
    got = compact(hidden, keep, layout=layout, positions=positions, padding_side=side,
                  backend="cuda")
    library.check_device_errors()
    want = compact_ref(hidden, keep, layout, positions, side)
    _assert_compacted_equal(got, want)
    _assert_compacted_equal(got, compact(hidden, keep, layout=layout, positions=positions,
                                         padding_side=side, backend="triton"))


@requires_cuda
def test_cuda_compact_backward_and_device_errors(library):
    hidden = torch.randn(2, 50, 16, device="cuda", dtype=torch.float64, requires_grad=True)
    keep = torch.rand(2, 3, 50, device="cuda") < 0.5
    out = compact(hidden, keep, layout="varlen", backend="cuda").hidden
    ref_hidden = hidden.detach().clone().requires_grad_()
    ref = compact_ref(ref_hidden, keep, "varlen", "original", "right")[0]
    grad = torch.randn_like(out)
    out.backward(grad)
    ref.backward(grad)
    torch.testing.assert_close(hidden.grad, ref_hidden.grad)

    scores = torch.randn(2, 6, device="cuda")
    k = torch.tensor([2, 7], device="cuda")
    library.topk_rows(scores, k, 6)
    with pytest.raises(cuda_lib.CudaLibraryError, match=r"k\[1\] = 7, outside \[1, 6\]"):
        library.check_device_errors()


@requires_cuda
def test_cuda_topk_then_mark_kept_matches_a_scatter(library):
    scores, k, lengths = _topk_case(11, 8, 320, ragged=True, neg_inf=0.05)
    indices = library.topk_rows(scores.cuda(), k.cuda(), int(k.max()), lengths.cuda())
    keep = torch.zeros(scores.shape[0], 344, dtype=torch.bool, device="cuda")
    keep[:, :6] = True
    token_index = (6 + torch.arange(320)).expand(scores.shape[0], 320).contiguous().cuda()
    library.mark_kept(indices, keep, 320, token_index)
    library.check_device_errors()
    want, _ = gumbel_topk_ref(scores, k, int(k.max()), lengths, 1.0, 0, False)
    expected = torch.zeros(scores.shape[0], 344, dtype=torch.bool)
    expected[:, :6] = True
    for row in range(len(want)):
        expected[row, 6 + want[row][want[row] >= 0]] = True
    assert torch.equal(keep.cpu(), expected)
