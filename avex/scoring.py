"""Caption a split under a selection method and score it as the paper does.

A *selector* (the interface of :mod:`avex.methods`) maps a micro-batch to a keep-set on the AV
axis. C_av, C_v and C_a are pycocoevalcap's CIDEr (x 100) of the same captions against the AV,
visual-only and audio-only references; each clip's own C_av, C_v and C_a come with them (their
mean is the corpus number), so that paired intervals can be computed from a results file
(:mod:`avex.intervals`). Training's end-of-run table and every experiment of
``python -m avex.evaluate`` caption and score through these functions; the sweep and that
table through one loop, :func:`caption_and_score`.
"""
from __future__ import annotations

from typing import Callable

import torch

from avex import _checks
from avex.metrics import PER_CLIP, caption_metrics_by_reference_type
from avex.progress import progress_bar, show
from avex.selection import AVLayout

Selector = Callable[[object, AVLayout, float], torch.Tensor]

__all__ = ["Selector", "keep_all", "caption_split", "score_captions", "caption_and_score"]


def keep_all(batch, layout: AVLayout, retention: float) -> torch.Tensor:
    """The full-token "selector": every AV token."""
    return layout.modality >= 0


def caption_split(captioner, clips, selector: Selector, retention: float, *,
                  batch_size: int = 64, num_beams: int = 1, max_new_tokens: int = 24,
                  progress: bool = False, desc: str = "captioning") -> list[str]:
    """One caption per clip: ``selector`` picks each batch's keep-set, the captioner captions
    the text plus the kept AV tokens (merged embeddings too, for a merging method)."""
    if not callable(selector):
        raise TypeError(f"selector must be callable (batch, layout, retention) -> keep, got "
                        f"{type(selector).__name__}")
    _checks.ratio("retention", retention)
    _checks.int_at_least("batch_size", batch_size, 1)
    _checks.int_at_least("num_beams", num_beams, 1)
    _checks.int_at_least("max_new_tokens", max_new_tokens, 1)
    captions = []
    starts = range(0, len(clips), batch_size)
    for start in progress_bar(starts, desc=desc, unit="batch", disable=not progress,
                              leave=False):
        chunk = [clips[i] for i in range(start, min(start + batch_size, len(clips)))]
        batch = captioner.embed(chunk)
        layout = AVLayout.of(batch.modality)
        keep = selector(batch, layout, retention)
        embeds = batch.inputs_embeds
        if isinstance(keep, tuple):  # Selection(keep, inputs_embeds): a merging method
            keep, embeds = keep
        sets = captioner.caption_keep_sets(embeds, batch.modality, keep[:, None],
                                           num_beams=num_beams, max_new_tokens=max_new_tokens,
                                           position_ids=batch.native_position_ids)
        captions.extend(s[0] for s in sets)
    return captions


def score_captions(captions: list[str], clips) -> dict:
    """{"C_av", "C_v", "C_a"} in CIDEr points, plus BLEU-4 and METEOR against the AV refs, and
    ``"per_clip"``: {"C_av", "C_v", "C_a"} -> each clip's CIDEr points in clip order (a list
    whose mean is the corpus number; the document frequencies are those of ``clips``' own
    references). C_v / C_a are None (and absent from ``per_clip``) when no clip has
    visual-only / audio-only references (a cache exported from captions without them); a split
    where only some clips have them is refused."""
    refs = {"AV": [c.refs_av for c in clips], "V": [c.refs_v for c in clips],
            "A": [c.refs_a for c in clips]}
    for kind in ("V", "A"):
        have = sum(bool(r) for r in refs[kind])
        if have == 0:
            del refs[kind]
        elif have < len(clips):
            missing = next(c.clip_id for c, r in zip(clips, refs[kind]) if not r)
            raise ValueError(f"{have} of {len(clips)} clips have {kind}-only references but "
                             f"clip {missing!r} has none; C_{kind.lower()} needs them for every "
                             "clip or none")
    metrics = caption_metrics_by_reference_type(captions, refs, per_clip=True)
    names = {"AV": "C_av", "V": "C_v", "A": "C_a"}

    def cider(kind):
        return 100 * metrics[kind]["CIDEr"] if kind in metrics else None
    return {"C_av": cider("AV"), "C_v": cider("V"), "C_a": cider("A"),
            "BLEU-4": 100 * metrics["AV"]["BLEU-4"], "METEOR": 100 * metrics["AV"]["METEOR"],
            "per_clip": {names[kind]: [100 * x for x in metrics[kind][PER_CLIP]]
                         for kind in refs}}


def caption_and_score(captioner, splits: dict, jobs, selector_for, *, batch_size: int = 64,
                      num_beams: int = 1, max_new_tokens: int = 24, progress: bool = False,
                      desc: str = "scoring") -> dict:
    """Caption every split of ``splits`` (name -> clips) with full tokens, then under every job,
    and score the captions (:func:`score_captions`).

    ``jobs``: (key, retention) pairs in the order to caption them; ``selector_for(key)`` builds
    the selector a key names (once a key, when first needed). A pair met again is not captioned
    again. Returns ``{(split, key, retention): (captions, scores)}``, full tokens under
    ``(split, "full", 1.0)``."""
    decode = dict(batch_size=batch_size, num_beams=num_beams, max_new_tokens=max_new_tokens)
    bar = progress_bar(total=len(splits) * (1 + len(jobs)), desc=desc, unit="setting",
                       disable=not progress)
    out = {}
    for split, clips in splits.items():
        captions = caption_split(captioner, clips, keep_all, 1.0, **decode)
        out[(split, "full", 1.0)] = (captions, score_captions(captions, clips))
        bar.update(1)
    selectors = {}
    for key, retention in jobs:
        for split, clips in splits.items():
            named = " ".join(str(k) for k in key if k is not None) if isinstance(key, tuple) \
                else str(key)
            show(bar, f"{named} @ {retention:.0%}, {split}")
            if (split, key, retention) not in out:
                if key not in selectors:
                    selectors[key] = selector_for(key)
                captions = caption_split(captioner, clips, selectors[key], retention, **decode)
                out[(split, key, retention)] = (captions, score_captions(captions, clips))
            bar.update(1)
    bar.close()
    return out
