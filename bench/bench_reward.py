"""CIDEr-D reward at training size: 64 clips x 5 candidates (anchor + counterfactuals), each
scored against its clip's 5 references (320 candidate captions, 8-20 words).

Baseline: pycocoevalcap's ``Cider`` (the reference implementation) on the same input.
Compared: ``avex.reward.CiderD`` with fixed corpus document frequencies (the training path) and
with per-call frequencies (pycocoevalcap's behaviour). The fixed corpus is the 320 reference lists
exactly as ``Cider`` sees them (one document per candidate), so all three must give the same
numbers, and each timed run is checked against pycocoevalcap's scores to 1e-9.
"""
import importlib.util
import random

import numpy as np
import pytest

from avex.reward import CiderD
from conftest import label

CLIPS, CANDIDATES_PER_CLIP, REFS_PER_CLIP = 64, 5, 5
GROUP = f"cider-d {CLIPS} clips x {CANDIDATES_PER_CLIP} candidates x {REFS_PER_CLIP} refs"


def make_batch(seed=0):
    """Caption-like text: a Zipf-distributed vocabulary, 8-20 words, and candidates that reuse
    words and phrases of their clip's references as a captioner's output would."""
    rng = random.Random(seed)
    vocab = [f"word{i}" for i in range(2000)]
    weights = [1.0 / (rank + 1) for rank in range(len(vocab))]

    def caption():
        return rng.choices(vocab, weights, k=rng.randint(8, 20))

    candidates, references = [], []
    for _ in range(CLIPS):
        refs = [" ".join(caption()) for _ in range(REFS_PER_CLIP)]
        for _ in range(CANDIDATES_PER_CLIP):
            source = rng.choice(refs).split()
            start = rng.randrange(len(source) // 2)
            candidates.append(" ".join(source[start:start + rng.randint(4, 10)] + caption()[:6]))
            references.append(refs)
    return candidates, references


CANDS, REFS = make_batch()


HAS_PYCOCOEVALCAP = importlib.util.find_spec("pycocoevalcap") is not None


@pytest.fixture(scope="module")
def expected():
    """pycocoevalcap's scores; without it (the GPU image), the per-call CiderD's, which
    tests/test_reward.py proves equal to them (the baseline row then skips)."""
    if not HAS_PYCOCOEVALCAP:
        return ciderd_per_call()()
    from pycocoevalcap.cider.cider import Cider
    gts = {i: refs for i, refs in enumerate(REFS)}
    res = {i: [c] for i, c in enumerate(CANDS)}
    return np.asarray(Cider().compute_score(gts, res)[1])


def pycocoevalcap_cider():
    from pycocoevalcap.cider.cider import Cider
    gts = {i: refs for i, refs in enumerate(REFS)}
    res = {i: [c] for i, c in enumerate(CANDS)}
    return lambda: np.asarray(Cider().compute_score(gts, res)[1])


def ciderd_fixed_corpus():
    scorer = CiderD(REFS)              # document frequencies fixed once, outside the timing
    return lambda: scorer.score(CANDS, REFS)


def ciderd_per_call():
    scorer = CiderD()
    return lambda: scorer.score(CANDS, REFS)


IMPLEMENTATIONS = {
    "pycocoevalcap Cider (baseline)": pycocoevalcap_cider,
    "CiderD, fixed corpus df": ciderd_fixed_corpus,
    "CiderD, per-call df": ciderd_per_call,
}


@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))
def test_cider_d(benchmark, impl, expected):
    if impl.startswith("pycocoevalcap") and not HAS_PYCOCOEVALCAP:
        pytest.skip("pycocoevalcap is not installed (the GPU image lacks it; this CPU-only "
                    "benchmark is measured where it is)")
    label(benchmark, GROUP, impl)
    scores = benchmark(IMPLEMENTATIONS[impl]())
    assert scores.shape == (CLIPS * CANDIDATES_PER_CLIP,)
    np.testing.assert_allclose(scores, expected, rtol=0, atol=1e-9)
    assert scores.mean() > 0.1        # the batch has real overlap, so agreement means something
