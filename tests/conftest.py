"""Test set-up. Without CUDA, Triton kernels run on the CPU through the interpreter; the
variable has to be set before any kernel module is imported."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# CI replays the same examples every run (a red run must be reproducible); locally, each run
# draws new ones.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "default")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                   reason="needs a CUDA GPU; none on this machine")


@pytest.fixture
def device():
    return DEVICE


def poisoned_alloc(shape, dtype, device):
    """Stand-in for a kernel module's ``_alloc``: outputs start as NaN / -7, so an element the
    kernel never writes fails the comparison (the interpreter catches no out-of-bounds)."""
    fill = float("nan") if dtype.is_floating_point else -7
    return torch.full(shape, fill, dtype=dtype, device=device)
