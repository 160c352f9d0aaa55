"""Backend dispatch and launch-size helpers shared by the kernels."""
from __future__ import annotations

import functools
import os

import torch

BACKENDS = ("auto", "triton", "torch")

# The widest row the row kernels (Gumbel-Top-K, exchanges) take: they hold a row in registers,
# and wider blocks spill and take minutes to compile (the Gumbel forward at 16384 spilled
# 2-4 KB a thread and took over a minute for sm_90). Wider rows go to the PyTorch reference
# under backend="auto"; the CUDA library (shared memory) takes up to 16384.
ROW_KERNEL_MAX_WIDTH = 4096


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def interpreting() -> bool:
    """True when Triton kernels run on the CPU through the interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def resolve_backend(backend: str, device: torch.device, *, op: str,
                    cuda_library: bool = False) -> str:
    """Pick the implementation: CUDA tensors go to Triton, everything else to the reference.

    ``backend="triton"`` forces the kernel, which on a CPU tensor needs ``TRITON_INTERPRET=1``
    set before ``avex.kernels`` is imported. ``backend="cuda"`` is the CUDA C++ library
    (``kernels/csrc``, see ``cuda_lib.py``), for the ops that have it (``cuda_library=True``);
    ``"auto"`` never picks it.
    """
    allowed = BACKENDS + ("cuda",) if cuda_library else BACKENDS
    if backend not in allowed:
        raise ValueError(f"backend must be one of {allowed}, got {backend!r}")
    if backend == "torch":
        return "torch"
    if backend == "cuda":
        if device.type != "cuda":
            raise ValueError(f"{op}: backend='cuda' (the CUDA C++ library) needs CUDA tensors, "
                             f"got tensors on {device}")
        return "cuda"
    if backend == "auto":
        return "triton" if device.type == "cuda" and triton_available() else "torch"
    if not triton_available():
        raise RuntimeError(f"{op}: backend='triton' was asked for but triton is not installed")
    if device.type != "cuda" and not interpreting():
        raise ValueError(
            f"{op}: backend='triton' got tensors on {device}; the Triton path needs CUDA tensors, "
            "or TRITON_INTERPRET=1 set before importing avex.kernels to run on the CPU")
    return "triton"


def resolve_row_backend(backend: str, scores: torch.Tensor, *, op: str, max_width: int,
                        cuda_max_width: int | None = None) -> str:
    """``resolve_backend`` for kernels that hold one float32 row of ``scores`` in registers.

    Under ``"auto"``, float64 scores and rows wider than ``max_width`` go to the reference; a
    forced ``"triton"`` (or ``"cuda"``, up to ``cuda_max_width``) says why it can't take them.
    ``cuda_max_width``: the widest row the op's CUDA C++ library path takes; None where the op
    has no such path (one argument, so that a caller can't offer the library without its limit).
    """
    # The dtype is refused before the device is looked at: the same call gets the same
    # error with or without a GPU on the machine.
    if scores.dtype == torch.float64 and backend == "cuda":
        raise TypeError(f"{op}: the CUDA library ranks in float32; got scores of dtype "
                        "torch.float64 (use backend='torch' for float64)")
    if scores.dtype == torch.float64 and backend == "triton":
        raise TypeError(f"{op}: the Triton path computes in float32; got scores of dtype "
                        "torch.float64 (use backend='torch' for float64)")
    path = resolve_backend(backend, scores.device, op=op,
                           cuda_library=cuda_max_width is not None)
    if path == "cuda":
        if scores.shape[1] > cuda_max_width:
            raise ValueError(f"{op}: the CUDA library sorts a row in shared memory and takes at "
                             f"most {cuda_max_width} tokens, got {scores.shape[1]}")
    if path != "triton":
        return path
    if scores.dtype == torch.float64:
        return "torch"
    if scores.shape[1] > max_width:
        if backend == "triton":
            raise ValueError(f"{op}: the Triton path holds a row in registers and takes at most "
                             f"{max_width} tokens, got {scores.shape[1]}")
        return "torch"
    return path


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def row_launch_config(block: int) -> dict:
    """num_warps for a kernel that holds one row of ``block`` elements in registers."""
    if block <= 256:
        warps = 2
    elif block <= 1024:
        warps = 4
    elif block <= 4096:
        warps = 8
    else:
        warps = 16
    return {"num_warps": warps}


def first_true(mask: torch.Tensor) -> tuple[int, ...]:
    """The index of the first True of ``mask`` (row-major), for an error message that names
    the row and the position; only called once a check has failed."""
    return tuple(torch.nonzero(mask)[0].tolist())


def ranked_row_launch_config(block: int) -> dict:
    """num_warps for the kernels that rank a row in registers (Gumbel-Top-K, exchanges): as
    :func:`row_launch_config`, but 16 warps above 2048. At 4096 with 8 warps, the ptxas of
    Triton 3.6 (the GPU image's) caps them at 128 registers a thread and spills 12-36 bytes;
    with 16 warps they need 55-130 registers and spill on neither Triton 3.6 nor 3.9
    (tests/test_triton_compile.py checks)."""
    return {"num_warps": 16} if block > 2048 else row_launch_config(block)
