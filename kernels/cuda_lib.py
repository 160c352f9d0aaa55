"""ctypes binding of the CUDA C++ library (``kernels/csrc``, built by the top-level CMakeLists).

``compact(..., backend="cuda")`` and ``gumbel_topk(..., sample=False, backend="cuda")`` call it.
The library is found at ``$AVEX_CUDA_LIB`` if set, else in ``build/`` at the repository root
(``cmake -S . -B build && cmake --build build``).

:class:`CudaLibrary` takes torch tensors, checks them, passes raw pointers and the current
stream, and turns a non-zero ``avex_status`` into :class:`CudaLibraryError` carrying the
library's message. The same class drives ``libavex_prune_hostsim.so`` (``host_simulation=True``):
the same C API and kernel bodies, run on the CPU on CPU tensors, which is how the tests check
the CUDA code's algorithms on machines without a GPU.
"""
from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import torch

__all__ = ["CudaLibrary", "CudaLibraryError", "load", "library_path", "STATUS_NAMES"]

REPO_ROOT = Path(__file__).resolve().parents[1]
LIBRARY_NAME = "libavex_prune.so"
HOSTSIM_NAME = "libavex_prune_hostsim.so"
TOPK_MAX_WIDTH = 16384  # AVEX_TOPK_MAX_WIDTH in avex_prune.h

STATUS_NAMES = ("AVEX_SUCCESS", "AVEX_ERROR_NULL_POINTER", "AVEX_ERROR_INVALID_SIZE",
                "AVEX_ERROR_INVALID_VALUE", "AVEX_ERROR_K_OUT_OF_RANGE", "AVEX_ERROR_CAPACITY",
                "AVEX_ERROR_UNSUPPORTED", "AVEX_ERROR_CUDA")
POSITIONS = {"original": 0, "contiguous": 1}
PADDING_SIDES = {"right": 0, "left": 1}

_i64, _f32, _ptr, _int = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p, ctypes.c_int
_SIGNATURES = {
    "avex_status_name": ([_int], ctypes.c_char_p),
    "avex_last_error_message": ([], ctypes.c_char_p),
    "avex_check_device_errors": ([_ptr], _int),
    "avex_topk_rows": ([_ptr, _i64, _i64, _ptr, _ptr, _i64, _f32, _ptr, _ptr], _int),
    "avex_mark_kept": ([_ptr, _i64, _i64, _i64, _ptr, _ptr, _i64, _ptr], _int),
    "avex_compact_varlen": ([_ptr, _i64, _i64, _i64, _i64, _ptr, _i64, _int, _i64, _ptr, _ptr,
                             _ptr, _ptr, _ptr, _ptr], _int),
    "avex_compact_padded": ([_ptr, _i64, _i64, _i64, _i64, _ptr, _i64, _int, _int, _i64, _ptr,
                             _ptr, _ptr, _ptr, _ptr, _ptr], _int),
}


class CudaLibraryError(RuntimeError):
    """A non-zero ``avex_status``: ``.status`` (int), ``.name`` and the library's message."""

    def __init__(self, status: int, message: str):
        self.status = status
        self.name = STATUS_NAMES[status] if 0 <= status < len(STATUS_NAMES) else str(status)
        super().__init__(f"{self.name}: {message}")


def library_path(host_simulation: bool = False) -> Path:
    """Where the library is looked for (it may not exist)."""
    name = HOSTSIM_NAME if host_simulation else LIBRARY_NAME
    override = os.environ.get("AVEX_CUDA_LIB")
    if override:
        path = Path(override)
        return path.with_name(name) if host_simulation else path
    return REPO_ROOT / "build" / name


class CudaLibrary:
    """The C API on torch tensors. ``raw`` is the ctypes handle, for calls with bad arguments."""

    def __init__(self, path: str | os.PathLike, *, host_simulation: bool = False):
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"the AVEX-Prune CUDA library was not found at {path}; build it with "
                "`cmake -S . -B build && cmake --build build` in the repository root, or set "
                "AVEX_CUDA_LIB to its path")
        self.path = path
        self.host_simulation = host_simulation
        self.device_type = "cpu" if host_simulation else "cuda"
        self.raw = ctypes.CDLL(str(path))
        for name, (argtypes, restype) in _SIGNATURES.items():
            fn = getattr(self.raw, name)
            fn.argtypes, fn.restype = argtypes, restype

    # -- errors -----------------------------------------------------------------------------

    def status_name(self, status: int) -> str:
        return self.raw.avex_status_name(status).decode()

    def last_error_message(self) -> str:
        return self.raw.avex_last_error_message().decode()

    def check(self, status: int) -> None:
        if status != 0:
            raise CudaLibraryError(status, self.last_error_message())

    def stream(self, device: torch.device):
        if self.host_simulation:
            return None
        return ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)

    def check_device_errors(self, device: torch.device | None = None) -> None:
        """Synchronize and raise what a kernel found wrong in device data (a K, a capacity)."""
        if device is None and not self.host_simulation:
            device = torch.device("cuda", torch.cuda.current_device())
        self.check(self.raw.avex_check_device_errors(self.stream(device)))

    # -- ops --------------------------------------------------------------------------------

    def _tensor(self, name: str, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        if t.device.type != self.device_type:
            raise ValueError(f"{name} must be on a {self.device_type} device for "
                             f"{self.path.name}, got {t.device}")
        if t.dtype != dtype:
            raise TypeError(f"{name} must have dtype {dtype}, got {t.dtype}")
        return t.contiguous()

    def topk_rows(self, scores: torch.Tensor, k_rows: torch.Tensor, kmax: int,
                  lengths: torch.Tensor | None = None, tau: float = 1.0) -> torch.Tensor:
        """int64 [B, kmax]: each row's top ``k_rows[b]`` positions, best first, -1 after.
        Arguments as ``avex_topk_rows``; ``scores`` float32 [B, M]."""
        scores = self._tensor("scores", scores, torch.float32)
        k_rows = self._tensor("k_rows", k_rows, torch.int64)
        if lengths is not None:
            lengths = self._tensor("lengths", lengths, torch.int64)
        batch, width = scores.shape
        indices = _alloc((batch, kmax), torch.int64, scores.device)
        self.check(self.raw.avex_topk_rows(
            scores.data_ptr(), batch, width, None if lengths is None else lengths.data_ptr(),
            k_rows.data_ptr(), kmax, float(tau), indices.data_ptr(), self.stream(scores.device)))
        return indices

    def mark_kept(self, indices: torch.Tensor, keep: torch.Tensor, width: int,
                  token_index: torch.Tensor | None = None) -> torch.Tensor:
        """Sets ``keep[b, token_index[b, indices[b, r]]] = True`` in place (``avex_mark_kept``);
        ``keep`` bool [B, L], contiguous; ``token_index`` int64 [B, width] or None."""
        indices = self._tensor("indices", indices, torch.int64)
        if keep.dtype != torch.bool or not keep.is_contiguous():
            raise ValueError(f"keep must be a contiguous bool tensor (it is written in place), "
                             f"got dtype {keep.dtype}, contiguous={keep.is_contiguous()}")
        self._tensor("keep", keep, torch.bool)
        if token_index is not None:
            token_index = self._tensor("token_index", token_index, torch.int64)
        batch, kmax = indices.shape
        self.check(self.raw.avex_mark_kept(
            indices.data_ptr(), batch, kmax, width,
            None if token_index is None else token_index.data_ptr(), keep.data_ptr(),
            keep.shape[1], self.stream(keep.device)))
        return keep

    def compact(self, hidden: torch.Tensor, keep: torch.Tensor, *, layout: str = "varlen",
                positions: str = "original", padding_side: str = "right",
                lengths: torch.Tensor | None = None):
        """(hidden, position_ids, index, cu_seqlens, max_seqlen, attention_mask) as
        :func:`avex.kernels.compact` returns them. ``keep`` bool [B, S, L]; ``lengths`` (the
        kept tokens per set, if already known) sizes the outputs exactly."""
        hidden = hidden.contiguous()
        if hidden.device.type != self.device_type:
            raise ValueError(f"hidden must be on a {self.device_type} device for "
                             f"{self.path.name}, got {hidden.device}")
        keep = self._tensor("keep", keep, torch.bool)
        batch, num_sets, seq_len = keep.shape
        features, device = hidden.shape[-1], hidden.device
        if lengths is None:
            lengths = keep.reshape(batch * num_sets, seq_len).sum(1)
        total, max_seqlen = (torch.stack([lengths.sum(), lengths.max()]).tolist()
                             if lengths.numel() else (0, 0))
        n_seqs = batch * num_sets
        cu_seqlens = _alloc((n_seqs + 1,), torch.int32, device)
        padded = layout == "padded"
        shape = (n_seqs, max_seqlen) if padded else (total,)
        out = _alloc((*shape, features), hidden.dtype, device)
        position_ids = _alloc(shape, torch.int64, device)
        index = _alloc(shape, torch.int64, device)
        common = (hidden.data_ptr(), hidden.element_size(), batch, seq_len, features,
                  keep.data_ptr(), num_sets, POSITIONS[positions])
        stream = self.stream(device)
        if padded:
            attention_mask = _alloc(shape, torch.int64, device)
            status = self.raw.avex_compact_padded(
                *common, PADDING_SIDES[padding_side], max_seqlen, out.data_ptr(),
                position_ids.data_ptr(), index.data_ptr(), cu_seqlens.data_ptr(),
                attention_mask.data_ptr(), stream)
        else:
            attention_mask = None
            status = self.raw.avex_compact_varlen(
                *common, total, out.data_ptr(), position_ids.data_ptr(), index.data_ptr(),
                cu_seqlens.data_ptr(), None, stream)
        self.check(status)
        return out, position_ids, index, cu_seqlens, max_seqlen, attention_mask


def _alloc(shape, dtype, device):
    """Output buffers; tests swap in a NaN/sentinel filler to catch unwritten elements."""
    return torch.empty(shape, dtype=dtype, device=device)


@functools.lru_cache(maxsize=None)
def load(host_simulation: bool = False) -> CudaLibrary:
    """The library at :func:`library_path`, loaded once per process."""
    return CudaLibrary(library_path(host_simulation), host_simulation=host_simulation)
