"""Test set-up. Without CUDA, Triton kernels run on the CPU through the interpreter; the
variable has to be set before any kernel module is imported."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
# first: ``python -m pytest`` puts the checkout's root on sys.path, and avex takes it off before
# a test imports transformers (whose PyPI ``kernels`` the root's kernels/ would shadow)
import avex  # noqa: E402,F401
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


# Tolerance for outputs of one model over two layouts of the same tokens (a compacted batch vs
# the masked full sequence, a packed prefill vs a padded one), by (device, dtype):
# - CPU float32: SDPA's math path sums each row in the same order whatever the padding: 1e-5;
# - CUDA float32: the fused SDPA kernels (memory-efficient, cuDNN) split the key axis into
#   tiles by sequence length, so the two layouts sum in different orders and may use TF32
#   internally: 1e-4 (flash-attention's own tests allow this order for float32);
# - half precision anywhere: one bf16 ulp of the logits' magnitude (~1) is 8e-3: 2e-2.
LAYOUT_ATOL = {("cpu", torch.float32): 1e-5, ("cuda", torch.float32): 1e-4,
               ("cpu", torch.bfloat16): 2e-2, ("cuda", torch.bfloat16): 2e-2,
               ("cpu", torch.float16): 2e-2, ("cuda", torch.float16): 2e-2}


def layout_atol(dtype=torch.float32, device=DEVICE) -> float:
    return LAYOUT_ATOL[(torch.device(device).type, dtype)]


# The tiny embedded benchmark and a tiny captioner trained on it, built once per test run and
# shared by every module that needs them (tests read them; one that writes into the cache passes
# its own cache_dir).

@pytest.fixture(scope="session")
def tiny_cache_dir(tmp_path_factory):
    """A cache root holding ``benchmarks/embedded-tiny-seed0`` and its ``tiny`` captioner."""
    # imported here, not at the top: the kernel tests run without loading transformers
    from avex.captioner.train import ensure_captioner

    root = tmp_path_factory.mktemp("avex-cache")
    # as python -m avex.train --benchmark-preset tiny --captioner-preset tiny builds them
    ensure_captioner("tiny", "tiny", cache_dir=root, progress=False)
    return root


@pytest.fixture(scope="session")
def tiny_benchmark(tiny_cache_dir):
    """The tiny benchmark's feature cache directory (already built: this only finds it)."""
    from avex.data import ensure_benchmark

    return ensure_benchmark("tiny", cache_dir=tiny_cache_dir, progress=False)


@pytest.fixture(scope="session")
def tiny_captioner(tiny_cache_dir, tiny_benchmark):
    """The tiny captioner's directory (``FrozenCaptioner.load`` takes it)."""
    from avex.paths import default_captioner_path

    return default_captioner_path(tiny_benchmark.name, "tiny", tiny_cache_dir)


def poisoned_alloc(shape, dtype, device):
    """Stand-in for a kernel module's ``_alloc``: outputs start as NaN / -7, so an element the
    kernel never writes fails the comparison (the interpreter catches no out-of-bounds)."""
    fill = float("nan") if dtype.is_floating_point else -7
    return torch.full(shape, fill, dtype=dtype, device=device)
