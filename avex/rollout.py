"""From policy scores to captions: the audio-visual axis, keep-sets, one batched generation.

The policy and the frozen LLM see the sequence layout [B, L] (text, video, audio, padding);
sampling and exchanges work on the audio-visual axis [B, M] (each row's AV tokens in order of
appearance, video then audio, padded with modality -1). ``AVLayout`` maps between the two.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from avex.modality import AUDIO, PAD, VISUAL
from avex.pruning import expand_av_keep, generate, prune_inputs
from avex.selection import num_kept


@dataclass
class AVLayout:
    positions: torch.Tensor  # int64 [B, M]: sequence position of each AV token, -1 past the row
    modality: torch.Tensor   # int64 [B, M]: VISUAL, AUDIO, or PAD past the row

    @classmethod
    def of(cls, modality: torch.Tensor) -> "AVLayout":
        is_av = (modality == VISUAL) | (modality == AUDIO)
        counts = is_av.sum(1)
        width = max(int(counts.max()), 1) if len(counts) else 1
        # stable sort puts AV positions first, in order of appearance
        order = torch.sort((~is_av).to(torch.int8), dim=1, stable=True).indices[:, :width]
        present = torch.arange(width, device=modality.device) < counts[:, None]
        positions = torch.where(present, order, torch.full_like(order, -1))
        av_modality = torch.where(present, modality.gather(1, order), torch.full_like(order, PAD))
        return cls(positions, av_modality)

    @property
    def counts(self) -> torch.Tensor:
        return (self.modality != PAD).sum(1)

    def budget(self, retention: float) -> torch.Tensor:
        """K = round(rho * N) per row (at least 1)."""
        return num_kept(retention, self.counts)

    def gather(self, per_position: torch.Tensor, fill=float("-inf")) -> torch.Tensor:
        """[B, L] values -> [B, M] on the AV axis, ``fill`` past each row's AV tokens."""
        values = per_position.gather(1, self.positions.clamp_min(0))
        return values.masked_fill(self.modality == PAD, fill)


def decode_captions(tokens: torch.Tensor, tokenizer, eos_token_id: int) -> list[str]:
    texts = []
    for row in tokens.tolist():
        if eos_token_id in row:
            row = row[:row.index(eos_token_id)]
        texts.append(" ".join(tokenizer.decode(row, skip_special_tokens=True).split()))
    return texts


@torch.no_grad()
def caption_keep_sets(captioner, inputs_embeds: torch.Tensor, modality: torch.Tensor,
                      av_keep: torch.Tensor, *, num_beams: int = 1,
                      max_new_tokens: int = 24) -> list[list[str]]:
    """Caption every keep-set of every sample in one batched generation.

    ``av_keep`` is bool [B, S, M] on the AV axis (e.g. ``Exchanges.sets()``); the S sets of a
    sample are compacted from its one copy of ``inputs_embeds``. Returns captions [B][S].
    """
    batch, sets = av_keep.shape[:2]
    pruned = prune_inputs(inputs_embeds, modality, keep=expand_av_keep(av_keep, modality))
    eos = captioner.eos_token_id
    pad = captioner.tokenizer.pad_token_id
    tokens = generate(captioner.model, pruned, max_new_tokens=max_new_tokens,
                      num_beams=num_beams, do_sample=False, eos_token_id=eos,
                      pad_token_id=eos if pad is None else pad)
    flat = decode_captions(tokens, captioner.tokenizer, eos)
    return [flat[b * sets:(b + 1) * sets] for b in range(batch)]
