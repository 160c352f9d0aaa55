"""Attention-AV (balanced): the full-token prefill's text-to-AV attention, ranked within each
modality at the per-modality split K_a = round(K Na / N).

This is the selection the AVEX policy's warmup imitates
(:func:`avex.selection.balanced_attention_keep`), applied at inference: every clip first runs a
full-token prefill with eager attention (``FrozenCaptioner.text_to_av_attention``: the weight
from the prompt-suffix text tokens to each AV token, averaged over layers, heads and queries),
so its cost includes that prefill on top of the pruned one. It needs that text-to-AV attention
function (the frozen captioner's, or ``avex.captioner.frozen.text_to_av_attention`` on an LLM)
and no training.
"""
from __future__ import annotations

import torch

from avex import _checks
from avex.modality import AUDIO, VISUAL
from avex.selection import balanced_attention_keep


def attention_selector(text_to_av_attention):
    """Balanced text-to-AV attention selection (K_a = round(K Na / N), top attention within
    each modality). ``text_to_av_attention(batch)`` gives each row's full-token attention on its
    AV tokens, float [M_b] in sequence order (``FrozenCaptioner.text_to_av_attention``)."""
    @torch.no_grad()
    def select(batch, layout, retention):
        retention = _checks.ratio("retention", retention)
        attention = text_to_av_attention(batch)
        keep = torch.zeros(layout.modality.shape, dtype=torch.bool)
        for row, weights in enumerate(attention):
            modality = layout.modality[row].cpu()
            n_visual = int((modality == VISUAL).sum())
            n_audio = int((modality == AUDIO).sum())
            # the AV axis is in sequence order: video then audio, or interleaved (Qwen2.5-Omni)
            keep[row, :n_visual + n_audio] = balanced_attention_keep(
                weights.float().cpu(), n_visual, n_audio, retention,
                av_modality=modality[:n_visual + n_audio])
        return keep.to(layout.modality.device)
    return select
