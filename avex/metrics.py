"""Caption metrics for the evaluation tables: BLEU-4, METEOR and CIDEr from pycocoevalcap itself.

The numbers reported in tables must be comparable with the literature, so nothing here is
re-implemented: captions go through pycocoevalcap's ``PTBTokenizer`` (Stanford CoreNLP, Java),
then its ``Bleu(4)``, ``Meteor`` (Java) and ``Cider`` scorers, exactly as the COCO caption
evaluation does (references and candidates tokenised in separate calls). Values are
pycocoevalcap's raw corpus scores: BLEU-4 and METEOR in [0, 1], CIDEr on its x10 scale (tables
usually print them x100).

The paper evaluates one set of candidates against three reference types, audio-visual, visual-only
and audio-only (C_av, C_v, C_a): :func:`caption_metrics_by_reference_type` does that with one
tokenisation of the candidates. One METEOR process serves every call of a run.

For the training reward, use :class:`avex.reward.CiderD`, which computes the same CIDEr-D without
Java, thousands of times faster.

Where Java or pycocoevalcap is missing (the GPU image has neither), the metrics degrade instead
of failing: CIDEr comes from :class:`avex.reward.CiderD` over :mod:`avex.ptb_tokenizer`'s
tokens (both proven equal to pycocoevalcap's in tests/test_reward.py), and BLEU-4 and METEOR
are NaN, with the reason given once as a warning and by :func:`unavailable_metrics`.

CIDEr is a mean over clips: with ``per_clip=True`` each set also carries every clip's CIDEr
(``PER_CLIP``), whose mean is the corpus CIDEr on both paths. The document frequencies behind
each clip's score are those of the whole scored corpus, so a resample of the per-clip scores
(a bootstrap) keeps them fixed rather than re-scoring.
"""
from __future__ import annotations

import atexit
import contextlib
import importlib.util
import math
import os
import re
import shutil
import sys
import tempfile
import threading
import warnings

from avex import _checks, ptb_tokenizer
from avex.reward import CiderD

__all__ = ["caption_metrics", "caption_metrics_by_reference_type", "METRIC_NAMES", "PER_CLIP",
           "java_tools_missing", "unavailable_metrics"]

METRIC_NAMES = ("BLEU-4", "METEOR", "CIDEr")
#: the key of each clip's CIDEr (a tuple in clip order) when ``per_clip=True`` asks for it
PER_CLIP = "CIDEr per clip"

# PTBTokenizer writes one caption per line and reads its output back line by line; any of these
# inside a caption would shift every later caption onto the wrong clip
_LINE_BREAKS = re.compile(r"[\n\r\u2028\u2029\u000B\u000C\u0085]")


def _check_captions(name: str, value) -> list[str]:
    return [_LINE_BREAKS.sub(" ", c) for c in _checks.str_list(name, value)]


def _check_references(name: str, value, count: int) -> list[list[str]]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a list of lists of str, got {type(value).__name__}")
    if len(value) != count:
        raise ValueError(f"{name} has {len(value)} entries but candidates has {count}; pass "
                         "one reference list per candidate")
    out = []
    for i, refs in enumerate(value):
        refs = _check_captions(f"{name}[{i}]", refs)
        if not refs:
            raise ValueError(f"{name}[{i}] is an empty list; every candidate needs at least "
                             "one reference caption")
        out.append(refs)
    return out


def java_tools_missing() -> str | None:
    """Why pycocoevalcap's scorers can't run here (None where they can): pycocoevalcap not
    installed, Java not on PATH, or both, each named."""
    try:
        installed = importlib.util.find_spec("pycocoevalcap.bleu.bleu") is not None
    except (ImportError, ValueError):
        installed = False
    why = []
    if not installed:
        why.append("pycocoevalcap is not installed (pip install pycocoevalcap)")
    if shutil.which("java") is None:
        why.append("Java is not on PATH (pycocoevalcap's PTBTokenizer and METEOR are Java "
                   "programs); install a JRE, e.g. openjdk-17-jre")
    return "; ".join(why) or None


def unavailable_metrics() -> dict[str, str]:
    """Metric name -> why this machine can't compute it ({} when every metric is there).

    BLEU-4 and METEOR need pycocoevalcap and Java; CIDEr is always there (without them, from
    :class:`avex.reward.CiderD`, which equals pycocoevalcap's ``Cider``)."""
    why = java_tools_missing()
    return {"BLEU-4": why, "METEOR": why} if why else {}


def cider_source() -> str:
    """Where this machine's reported CIDEr comes from, for a table's caption."""
    missing = unavailable_metrics()
    if not missing:
        return "pycocoevalcap"
    return ("avex.reward.CiderD, equal to pycocoevalcap's Cider; BLEU-4 and METEOR unavailable: "
            + missing["BLEU-4"])


_warned: set = set()


def _without_java(candidates: list[str], checked: dict, missing: dict, per_clip: bool) -> dict:
    """CIDEr from CiderD over the pure-Python PTB tokens (one tokenizer call per caption set,
    as pycocoevalcap makes); BLEU-4 and METEOR NaN."""
    reason = missing["BLEU-4"]
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"BLEU-4 and METEOR are reported as NaN: {reason}. CIDEr comes from "
                      "avex.reward.CiderD (equal to pycocoevalcap's Cider).", stacklevel=3)
    tokens = ptb_tokenizer.tokenize_all(candidates)
    out = {}
    for name, refs in checked.items():
        flat = ptb_tokenizer.tokenize_all([r for clip in refs for r in clip])
        grouped, start = [], 0
        for clip in refs:
            grouped.append(flat[start:start + len(clip)])
            start += len(clip)
        clip_scores = CiderD().score(tokens, grouped)
        out[name] = {"BLEU-4": math.nan, "METEOR": math.nan,
                     "CIDEr": float(clip_scores.mean())}
        if per_clip:
            out[name][PER_CLIP] = tuple(float(x) for x in clip_scores)
    return out


_meteor = None
_meteor_lock = threading.Lock()


def _shared_meteor():
    """One METEOR process for the whole run: it takes ~10 s to load its paraphrase tables, and
    an evaluation sweep scores many configurations."""
    global _meteor
    with _meteor_lock:
        if _meteor is None or _meteor.meteor_p.poll() is not None:
            from pycocoevalcap.meteor.meteor import Meteor
            _meteor = Meteor()
            # nobody reads METEOR's stderr pipe; a long-lived process must not block on it full
            threading.Thread(target=_meteor.meteor_p.stderr.read, daemon=True).start()
        return _meteor


class _Closed:
    """What a closed METEOR scorer becomes: pycocoevalcap's ``Meteor.__del__`` takes the
    scorer's lock, which a ``compute_score`` interrupted by Ctrl-C still holds, so it would
    wait forever (then flush a pipe nobody reads, then wait on the process)."""


@atexit.register
def _close_meteor() -> None:
    """Kill the METEOR process (SIGKILL: whatever it is doing) and never wait on it or on
    the scorer's lock, so Ctrl-C during an evaluation exits at once."""
    global _meteor
    meteor, _meteor = _meteor, None
    if meteor is None:
        return
    process = meteor.meteor_p
    meteor.__class__ = _Closed
    process.kill()
    # stdin's flush meets a dead reader (EPIPE) rather than blocking; stderr is left to the
    # thread that reads it, which sees its end now
    for pipe in (process.stdin, process.stdout):
        try:
            pipe.close()
        except OSError:
            pass


def _tokenized(captions_per_clip: list[list[str]]) -> dict[int, list[str]]:
    """One PTBTokenizer call over every caption, keyed by clip index."""
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer
    with _stderr_shown_only_on_error():  # Java reports "tokenized N tokens" on every call
        return PTBTokenizer().tokenize({i: [{"caption": c} for c in caps]
                                        for i, caps in enumerate(captions_per_clip)})


#: reference sets tokenised lately (their captions -> PTBTokenizer's output); a sweep or a
#: training table scores every setting against the same references
_REFERENCE_TOKENS: dict[tuple, dict] = {}
_REFERENCE_TOKENS_KEPT = 6
_reference_lock = threading.Lock()


def _tokenized_references(references: list[list[str]]) -> dict[int, list[str]]:
    """:func:`_tokenized` of a reference set, from one PTBTokenizer call per distinct set in
    a process: the tokenizer is deterministic, so the same captions give the same tokens, and
    each later call costs a copy instead of a Java start and a pass over every reference."""
    key = tuple(tuple(refs) for refs in references)
    with _reference_lock:
        stored = _REFERENCE_TOKENS.get(key)
    if stored is None:
        stored = _tokenized(references)
        with _reference_lock:
            while len(_REFERENCE_TOKENS) >= _REFERENCE_TOKENS_KEPT:
                del _REFERENCE_TOKENS[next(iter(_REFERENCE_TOKENS))]
            _REFERENCE_TOKENS[key] = stored
    return {i: list(tokens) for i, tokens in stored.items()}


@contextlib.contextmanager
def _stderr_shown_only_on_error():
    """Send the process's stderr (fd 2, which subprocesses inherit) to a temporary file, and
    replay it only if the block raises."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            captured.seek(0)
            sys.stderr.write(captured.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _in_background(function, *args):
    """Start ``function(*args)`` on a daemon thread (one that never holds up the exit of a
    process stopped with Ctrl-C); the returned callable waits for its result, or raises
    its exception."""
    outcome = {}

    def run():
        try:
            outcome["value"] = function(*args)
        except BaseException as error:   # handed to the caller, which re-raises it
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def result():
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]
    return result


def _score(gts: dict, res: dict, meteor, per_clip: bool) -> dict:
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    # Cider lists its per-clip scores in the order of gts' keys: make that the clip order
    gts = {i: gts[i] for i in range(len(res))}
    # METEOR runs in its Java process while BLEU and CIDEr run here: each scorer reads only
    # gts and res, so the scores are those of running them one after another
    meteor_score = _in_background(meteor.compute_score, gts, res)
    bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
    cider, clip_scores = Cider().compute_score(gts, res)
    meteor_score, _ = meteor_score()
    out = {"BLEU-4": float(bleu[3]), "METEOR": float(meteor_score), "CIDEr": float(cider)}
    if per_clip:
        out[PER_CLIP] = tuple(float(x) for x in clip_scores)
    return out


def caption_metrics_by_reference_type(candidates, reference_sets, *,
                                      per_clip: bool = False) -> dict[str, dict]:
    """BLEU-4, METEOR and CIDEr of ``candidates`` against each set of references.

    Args:
        candidates: one generated caption per clip.
        reference_sets: name -> references, e.g. ``{"AV": av_refs, "V": v_refs, "A": a_refs}``;
            each references value holds one non-empty list of captions per clip, aligned with
            ``candidates``.
        per_clip: also return each clip's CIDEr under :data:`PER_CLIP`.

    Returns:
        name -> ``{"BLEU-4": ..., "METEOR": ..., "CIDEr": ...}``, each set scored on its own
        (its own CIDEr document frequencies, from that set's references of these clips), as
        C_av, C_v and C_a in the paper. BLEU-4 and METEOR are NaN where
        :func:`unavailable_metrics` says why. With ``per_clip``, ``PER_CLIP`` holds one CIDEr
        per candidate, in order; their mean is ``"CIDEr"``.
    """
    _checks.flag("per_clip", per_clip)
    candidates = _check_captions("candidates", candidates)
    if not candidates:
        raise ValueError("candidates is an empty list; the metrics need at least one caption")
    if not isinstance(reference_sets, dict):
        raise TypeError("reference_sets must be a dict of name -> references, got "
                        f"{type(reference_sets).__name__}")
    if not reference_sets:
        raise ValueError("reference_sets is an empty dict; pass at least one reference set")
    checked = {}
    for name, refs in reference_sets.items():
        if not isinstance(name, str):
            raise TypeError(f"reference_sets keys must be str, got {type(name).__name__}: "
                            f"{name!r}")
        checked[name] = _check_references(f"reference_sets[{name!r}]", refs, len(candidates))
    missing = unavailable_metrics()
    if missing:
        return _without_java(candidates, checked, missing, per_clip)

    res = _tokenized([[c] for c in candidates])
    meteor = _shared_meteor()
    return {name: _score(_tokenized_references(refs), res, meteor, per_clip)
            for name, refs in checked.items()}


def caption_metrics(candidates, references) -> dict[str, float]:
    """BLEU-4, METEOR and CIDEr of ``candidates[i]`` against ``references[i]`` over the corpus,
    computed by pycocoevalcap (its PTBTokenizer, Bleu, Meteor and Cider)."""
    candidates = _check_captions("candidates", candidates)
    if not candidates:
        raise ValueError("candidates is an empty list; the metrics need at least one caption")
    references = _check_references("references", references, len(candidates))
    return caption_metrics_by_reference_type(candidates, {"refs": references})["refs"]
