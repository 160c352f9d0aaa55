"""Benchmark set-up shared by every bench file.

Without CUDA the Triton kernels would only run under the interpreter, which times Python, not
the kernel; so on a CPU machine the benchmarks compare PyTorch paths and the Triton entries
skip with that reason.
"""
import os

import pytest
import torch

# before any bench file imports transformers: the checkout's root off sys.path (avex/__init__.py)
import avex  # noqa: F401

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # lets modules import; Triton entries skip

DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")
requires_cuda = pytest.mark.skipif(
    not HAS_CUDA, reason="Triton timing needs a CUDA GPU; on a CPU it would time the interpreter")


def synchronized(fn):
    """Wrap ``fn`` so each timed call waits for the device to finish its work."""
    if not HAS_CUDA:
        return fn

    def run(*args, **kwargs):
        out = fn(*args, **kwargs)
        torch.cuda.synchronize()
        return out
    return run


def label(benchmark, group: str, impl: str) -> None:
    """Name an entry for bench/summarize.py: its group, its implementation, whether it is the
    group's baseline (the name ends in "(baseline)"), and the GPU it ran on."""
    benchmark.group = group
    benchmark.extra_info["impl"] = impl
    benchmark.extra_info["baseline"] = impl.endswith("(baseline)")
    if HAS_CUDA:
        benchmark.extra_info["device_name"] = torch.cuda.get_device_name()


@pytest.fixture
def device():
    return DEVICE
