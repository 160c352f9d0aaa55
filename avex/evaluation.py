"""Caption a split under a selection method and score it as the paper does.

A *selector* maps a micro-batch to keep-sets on the AV axis:
``selector(batch, layout, retention) -> bool [B, M]``, or a ``(keep, inputs_embeds)`` pair
(``avex.baselines.Selection``) when the method also rewrites the kept tokens' embeddings (token
merging). ``avex.baselines`` holds every method behind this interface. C_av, C_v and C_a are
pycocoevalcap's CIDEr (x 100) of the same captions against the AV, visual-only and audio-only
references.
"""
from __future__ import annotations

import zlib
from typing import Callable

import torch
from tqdm.auto import tqdm

from avex.rollout import AVLayout, caption_keep_sets

Selector = Callable[[object, AVLayout, float], torch.Tensor]


def keep_all(batch, layout: AVLayout, retention: float) -> torch.Tensor:
    return layout.modality >= 0


def random_selector(seed: int) -> Selector:
    """K random AV tokens per clip, reproducible from ``seed`` and the batch's clip ids."""
    def select(batch, layout, retention):
        keep = torch.zeros_like(layout.modality, dtype=torch.bool)
        for row, (clip_id, k) in enumerate(zip(batch.clip_ids, layout.budget(retention))):
            # crc32, not hash(): str hashes change from one process to the next
            gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{clip_id}".encode()))
            n = int(layout.counts[row])
            keep[row, torch.randperm(n, generator=gen)[:int(k)]] = True
        return keep
    return select


def policy_selector(policy) -> Selector:
    """Deterministic Top-K of the policy's scores (the inference path)."""
    from avex.kernels import gumbel_topk

    @torch.no_grad()
    def select(batch, layout, retention):
        scores = layout.gather(policy(batch.inputs_embeds, batch.modality))
        idx, _ = gumbel_topk(scores, layout.budget(retention), sample=False)
        return indices_to_keep(idx, scores.shape[1])
    return select


def indices_to_keep(idx: torch.Tensor, width: int) -> torch.Tensor:
    """int64 [B, K] indices (-1 past a row's K) -> bool [B, width]. The -1 slots write into a
    spare column, so they cannot clear a chosen column 0."""
    spare = torch.where(idx >= 0, idx, torch.full_like(idx, width))
    keep = torch.zeros(idx.shape[0], width + 1, dtype=torch.bool, device=idx.device)
    return keep.scatter_(1, spare, True)[:, :width]


def caption_split(captioner, clips, selector: Selector, retention: float, *,
                  batch_size: int = 64, num_beams: int = 1, max_new_tokens: int = 24,
                  progress: bool = False, desc: str = "captioning") -> list[str]:
    captions = []
    starts = range(0, len(clips), batch_size)
    for start in tqdm(starts, desc=desc, unit="batch", disable=not progress, leave=False):
        chunk = [clips[i] for i in range(start, min(start + batch_size, len(clips)))]
        batch = captioner.embed(chunk)
        layout = AVLayout.of(batch.modality)
        keep = selector(batch, layout, retention)
        embeds = batch.inputs_embeds
        if isinstance(keep, tuple):  # (keep, inputs_embeds): a merging method
            keep, embeds = keep
        sets = caption_keep_sets(captioner, embeds, batch.modality, keep[:, None],
                                 num_beams=num_beams, max_new_tokens=max_new_tokens)
        captions.extend(s[0] for s in sets)
    return captions


def score_captions(captions: list[str], clips) -> dict[str, float]:
    """{"C_av", "C_v", "C_a"} in CIDEr points, plus BLEU-4 and METEOR against the AV refs."""
    from avex.metrics import caption_metrics_by_reference_type

    refs = {"AV": [c.refs_av for c in clips], "V": [c.refs_v for c in clips],
            "A": [c.refs_a for c in clips]}
    metrics = caption_metrics_by_reference_type(captions, refs)
    return {"C_av": 100 * metrics["AV"]["CIDEr"], "C_v": 100 * metrics["V"]["CIDEr"],
            "C_a": 100 * metrics["A"]["CIDEr"], "BLEU-4": 100 * metrics["AV"]["BLEU-4"],
            "METEOR": 100 * metrics["AV"]["METEOR"]}
