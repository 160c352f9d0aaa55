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
