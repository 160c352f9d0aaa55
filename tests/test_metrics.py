"""Caption metrics come from pycocoevalcap itself; these tests check the plumbing (per-set
scoring, tokenisation in the COCO way) and that its CIDEr is the reward's CIDEr-D."""
import importlib.util
import math
import sys

import numpy as np
import pytest

from avex import metrics
from avex.metrics import (METRIC_NAMES, PER_CLIP, caption_metrics,
                          caption_metrics_by_reference_type)
from avex.ptb_tokenizer import tokenize_all
from avex.reward import CiderD

CANDIDATES = [
    "A dog is barking loudly in the yard.",
    "A man plays the guitar and sings.",
    "Rain falls on a tin roof while thunder rumbles.",
    "Two children laugh as a ball bounces.",
    "A car engine starts and drives away!",
    "Birds chirp in the forest at dawn.",
]
AV_REFS = [
    ["A dog barks loudly in a yard.", "A brown dog is barking outside.", "A dog barks at a fence."],
    ["A man is playing a guitar and singing.", "Someone strums a guitar while singing.",
     "A man sings with his guitar."],
    ["Rain is falling on a metal roof as thunder rolls.", "Heavy rain on a tin roof.",
     "Thunder rumbles while rain hits the roof."],
    ["Kids are laughing while a ball bounces.", "Two children play with a bouncing ball.",
     "Children laugh and bounce a ball."],
    ["A car starts its engine and drives off.", "An engine revs and a car leaves.",
     "A car's engine starts, then it drives away."],
    ["Birds are chirping in a forest in the morning.", "Birdsong fills the woods at dawn.",
     "Many birds chirp among the trees."],
]
V_REFS = [
    ["A brown dog stands in a grassy yard.", "A dog near a wooden fence."],
    ["A man holds a guitar on a stage.", "A musician with an acoustic guitar."],
    ["A tin roof under a dark sky.", "Water runs down a metal roof."],
    ["Two kids play with a red ball.", "Children in a playground."],
    ["A silver car pulls out of a driveway.", "A car drives down the road."],
    ["Trees in a forest at sunrise.", "Sunlight through the trees."],
]
A_REFS = [
    ["Loud barking.", "A dog barks repeatedly."],
    ["Guitar music and a male voice singing.", "Strumming and singing."],
    ["Rain pattering and thunder.", "Rain and distant thunder."],
    ["Children laughing and a ball bouncing.", "Laughter and thumps."],
    ["An engine starts and revs.", "A car engine accelerating."],
    ["Birds chirping.", "Many birds singing."],
]
# each candidate among its own references: BLEU-4 and METEOR near their maximum
SELF_REFS = [[c] + refs[:1] for c, refs in zip(CANDIDATES, AV_REFS)]


@pytest.fixture(scope="module")
def per_set():
    """One evaluation over four reference sets (the Java tools start once for all tests)."""
    return caption_metrics_by_reference_type(
        CANDIDATES, {"AV": AV_REFS, "V": V_REFS, "A": A_REFS, "self": SELF_REFS})


def test_every_set_gets_the_three_metrics(per_set):
    missing = metrics.unavailable_metrics()   # {} here and in CI; BLEU-4, METEOR on the GPU image
    assert list(per_set) == ["AV", "V", "A", "self"]
    for name, set_metrics in per_set.items():
        assert tuple(set_metrics) == METRIC_NAMES
        assert all(isinstance(v, float) for v in set_metrics.values())
        available = {k: v for k, v in set_metrics.items() if k not in missing}
        assert all(math.isfinite(v) and v >= 0 for v in available.values())
        assert all(math.isnan(set_metrics[k]) for k in missing)   # degraded: NaN, not a guess
        assert all(available.get(k, 0) <= 1 for k in ("BLEU-4", "METEOR"))


def test_sets_are_scored_separately(per_set):
    # the candidates describe sound and image together: AV references fit best
    assert per_set["AV"]["CIDEr"] > per_set["V"]["CIDEr"]
    assert len({m["CIDEr"] for m in per_set.values()}) == 4


def test_bleu_and_meteor_rank_the_sets(per_set):
    missing = metrics.java_tools_missing()
    if missing:
        pytest.skip(f"BLEU-4 and METEOR are NaN here: {missing}")
    assert per_set["AV"]["METEOR"] > per_set["A"]["METEOR"]
    assert per_set["self"]["BLEU-4"] > 0.99 and per_set["self"]["METEOR"] > 0.9


def test_single_set_call_equals_the_per_set_call(per_set):
    assert caption_metrics(CANDIDATES, AV_REFS) == per_set["AV"]


def test_pycocoevalcap_cider_equals_the_reward(per_set):
    """pycocoevalcap tokenises the candidates in one PTBTokenizer call and the references (clip
    by clip, in order) in another; tokenize_all reproduces both, and CiderD then gives the same
    per-caption CIDEr-D, whose mean is the reported CIDEr."""
    for name, refs in (("AV", AV_REFS), ("V", V_REFS), ("A", A_REFS)):
        flat = tokenize_all([r for clip in refs for r in clip])
        sizes = np.cumsum([0] + [len(clip) for clip in refs])
        tok_refs = [flat[a:b] for a, b in zip(sizes[:-1], sizes[1:])]
        reward = CiderD().score(tokenize_all(CANDIDATES), tok_refs)
        assert abs(reward.mean() - per_set[name]["CIDEr"]) < 1e-9


@pytest.fixture(scope="module")
def per_clip():
    return caption_metrics_by_reference_type(CANDIDATES, {"AV": AV_REFS, "V": V_REFS},
                                             per_clip=True)


def test_per_clip_cider_averages_to_the_corpus_cider(per_set, per_clip):
    """Each clip's CIDEr, in clip order: their mean is the reported CIDEr, and each equals the
    reward's CIDEr-D of that caption (same document frequencies: the scored clips')."""
    for name, refs in (("AV", AV_REFS), ("V", V_REFS)):
        clips = per_clip[name][PER_CLIP]
        assert len(clips) == len(CANDIDATES) and len(set(clips)) > 1
        assert abs(np.mean(clips) - per_set[name]["CIDEr"]) < 1e-12
        assert per_clip[name]["CIDEr"] == per_set[name]["CIDEr"]
        flat = tokenize_all([r for clip in refs for r in clip])
        sizes = np.cumsum([0] + [len(clip) for clip in refs])
        reward = CiderD().score(tokenize_all(CANDIDATES),
                                [flat[a:b] for a, b in zip(sizes[:-1], sizes[1:])])
        np.testing.assert_allclose(clips, reward, rtol=0, atol=1e-9)


def test_score_captions_gives_each_clips_scores():
    from types import SimpleNamespace

    from avex.scoring import score_captions

    clips = [SimpleNamespace(clip_id=f"c{i}", refs_av=av, refs_v=v, refs_a=a)
             for i, (av, v, a) in enumerate(zip(AV_REFS, V_REFS, A_REFS))]
    scores = score_captions(CANDIDATES, clips)
    assert set(scores["per_clip"]) == {"C_av", "C_v", "C_a"}
    for key in ("C_av", "C_v", "C_a"):
        assert len(scores["per_clip"][key]) == len(clips)
        assert abs(np.mean(scores["per_clip"][key]) - scores[key]) < 1e-9   # x100, both


@pytest.mark.parametrize("call,error,pattern", [
    (lambda: caption_metrics(["a"], [["a"], ["b"]]), ValueError,
     r"references has 2 entries but candidates has 1"),
    (lambda: caption_metrics([], []), ValueError, r"candidates is an empty list"),
    (lambda: caption_metrics(["a", 7], [["a"], ["b"]]), TypeError,
     r"candidates\[1\] must be a str, got int"),
    (lambda: caption_metrics(["a"], [[]]), ValueError, r"references\[0\] is an empty list"),
    (lambda: caption_metrics(["a"], [["ok", None]]), TypeError,
     r"references\[0\]\[1\] must be a str, got NoneType"),
    (lambda: caption_metrics_by_reference_type(["a"], [["a"]]), TypeError,
     r"reference_sets must be a dict of name -> references, got list"),
    (lambda: caption_metrics_by_reference_type(["a"], {}), ValueError,
     r"reference_sets is an empty dict"),
    (lambda: caption_metrics_by_reference_type(["a"], {"AV": [["a"]], "V": [["a"], ["b"]]}),
     ValueError, r"reference_sets\['V'\] has 2 entries but candidates has 1"),
    (lambda: caption_metrics_by_reference_type(["a"], {1: [["a"]]}), TypeError,
     r"reference_sets keys must be str, got int"),
    (lambda: caption_metrics_by_reference_type(["a"], {"AV": [["a"]]}, per_clip="yes"),
     TypeError, r"per_clip must be True or False, got str: .yes."),
])
def test_bad_input_is_rejected_before_java_starts(call, error, pattern):
    with pytest.raises(error, match=pattern):
        call()


# --- the GPU image: no Java, no pycocoevalcap ------------------------------------------------

@pytest.fixture(params=["no pycocoevalcap", "no java"])
def without_java_tools(request, monkeypatch, tmp_path):
    """Simulates the GPU image: pycocoevalcap can't be imported, or no java is on PATH."""
    if request.param == "no pycocoevalcap":
        for name in [m for m in sys.modules if m.startswith("pycocoevalcap")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.setitem(sys.modules, "pycocoevalcap", None)  # import fails
    else:
        monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no java
    monkeypatch.setattr(metrics, "_warned", set())
    return request.param


def test_metrics_degrade_without_java_or_pycocoevalcap(without_java_tools, per_set):
    missing = metrics.unavailable_metrics()
    assert set(missing) == {"BLEU-4", "METEOR"}
    # each missing tool is named (on the GPU image both are)
    assert ("pycocoevalcap is not installed" if without_java_tools == "no pycocoevalcap"
            else "Java is not on PATH") in missing["BLEU-4"]
    with pytest.warns(UserWarning, match="BLEU-4 and METEOR are reported as NaN"):
        degraded = caption_metrics_by_reference_type(
            CANDIDATES, {"AV": AV_REFS, "V": V_REFS, "A": A_REFS})
    for name, scores in degraded.items():
        assert tuple(scores) == METRIC_NAMES
        assert math.isnan(scores["BLEU-4"]) and math.isnan(scores["METEOR"])
        # CIDEr from CiderD over the Python PTB tokens: pycocoevalcap's number (with Java)
        assert abs(scores["CIDEr"] - per_set[name]["CIDEr"]) < 1e-9


def test_per_clip_cider_without_java_is_pycocoevalcaps(without_java_tools, per_clip):
    """The fallback gives the same per-clip numbers, whose mean is its corpus CIDEr."""
    with pytest.warns(UserWarning, match="BLEU-4 and METEOR are reported as NaN"):
        degraded = caption_metrics_by_reference_type(
            CANDIDATES, {"AV": AV_REFS, "V": V_REFS}, per_clip=True)
    for name in ("AV", "V"):
        clips = degraded[name][PER_CLIP]
        assert abs(np.mean(clips) - degraded[name]["CIDEr"]) < 1e-12
        np.testing.assert_allclose(clips, per_clip[name][PER_CLIP], rtol=0, atol=1e-9)


def test_every_metric_is_available_here():
    """pycocoevalcap is a dependency of the package, so where it is installed (here, CI) Java
    must be too; the tests above simulate their absence. The GPU image's stack
    (``make test-gpu-image``) has neither."""
    if importlib.util.find_spec("pycocoevalcap") is None:
        pytest.skip(f"the metrics degrade here (tested above): {metrics.java_tools_missing()}")
    assert metrics.unavailable_metrics() == {}


def test_closing_an_interrupted_meteor_kills_it_without_waiting():
    """Ctrl-C inside pycocoevalcap's Meteor.compute_score leaves the scorer's lock held; the
    close at exit must kill the process and return at once, not wait on that lock (issue 34:
    a 9-minute hang after Ctrl-C)."""
    import subprocess
    import threading

    pytest.importorskip("pycocoevalcap")
    from pycocoevalcap.meteor.meteor import Meteor

    stuck = object.__new__(Meteor)   # a METEOR that never answers, as one stopped mid-score
    stuck.meteor_p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE)
    stuck.lock = threading.Lock()
    stuck.lock.acquire()
    stuck.meteor_p.stdin.write(b"EVAL ||| 1 2 3\n")   # unflushed, as an interrupted write
    metrics._meteor, process = stuck, stuck.meteor_p
    del stuck
    closing = threading.Thread(target=metrics._close_meteor, daemon=True)
    closing.start()
    closing.join(timeout=10)
    assert not closing.is_alive(), "closing METEOR waited on its lock or its process"
    assert process.wait(timeout=10) == -9 and metrics._meteor is None


def test_a_reference_set_is_tokenised_once_and_scores_as_if_fresh(monkeypatch):
    """The references of every setting of a sweep are the same: they go through PTBTokenizer
    once, and a later call scores exactly as with a fresh tokenisation; other references
    (another set, or the same clips' captions changed) are tokenised anew."""
    if metrics.java_tools_missing():
        pytest.skip(f"the Java path is not taken here: {metrics.java_tools_missing()}")
    monkeypatch.setattr(metrics, "_REFERENCE_TOKENS", {})
    fresh = caption_metrics_by_reference_type(CANDIDATES, {"AV": AV_REFS, "V": V_REFS})
    calls = []
    tokenized = metrics._tokenized
    monkeypatch.setattr(metrics, "_tokenized", lambda caps: calls.append(caps) or tokenized(caps))
    again = caption_metrics_by_reference_type(list(CANDIDATES),
                                              {"AV": [list(r) for r in AV_REFS], "V": V_REFS})
    assert again == fresh
    assert calls == [[[c] for c in CANDIDATES]]   # the candidates only
    changed = [list(r) for r in AV_REFS]
    changed[2][1] = "Heavy rain on a tin roof and a dog."
    calls.clear()
    other = caption_metrics_by_reference_type(CANDIDATES, {"AV": changed})
    assert calls[1] == changed and other["AV"]["CIDEr"] != fresh["AV"]["CIDEr"]
    # a caller that edits the tokens it got does not edit what the next call reads
    stored = metrics._tokenized_references(AV_REFS)
    stored[0].append("extra")
    assert metrics._tokenized_references(AV_REFS)[0] == tokenized(AV_REFS)[0]


def test_meteor_beside_bleu_and_cider_scores_as_one_after_another():
    if metrics.java_tools_missing():
        pytest.skip(f"the Java path is not taken here: {metrics.java_tools_missing()}")
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider

    gts, res = metrics._tokenized(AV_REFS), metrics._tokenized([[c] for c in CANDIDATES])
    meteor = metrics._shared_meteor()
    in_turn = {"BLEU-4": Bleu(4).compute_score(gts, res, verbose=0)[0][3],
               "METEOR": meteor.compute_score(gts, res)[0],
               "CIDEr": Cider().compute_score(gts, res)[0]}
    assert metrics._score(gts, res, meteor, False) == {k: float(v) for k, v in in_turn.items()}


def test_the_background_scorer_returns_the_value_or_raises_the_error():
    assert metrics._in_background(lambda a, b: a + b, 2, 3)() == 5
    with pytest.raises(KeyError, match="lost"):
        metrics._in_background(lambda: {}["lost"])()
