"""What the frozen captioner reads and returns: the projector of cached features into the LM's
embedding space (:class:`AVProjector`), a batch laid out for the LM (:class:`AVBatch`), and a
teacher-forced caption's scores and inputs (:class:`TeacherForced`,
:class:`TeacherForcedInputs`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from ..modality import AUDIO, VISUAL


class AVProjector(nn.Module):
    """Maps cached features [N, d] to the LM's embedding space [N, D]: one two-layer MLP per
    modality (VideoLLaMA 2 has separate visual and audio projectors), or the identity when the
    cache already holds LM-space features (d == D, as a real backbone's projector outputs are)."""

    def __init__(self, feature_dim: int, hidden_size: int, kind: str = "mlp"):
        super().__init__()
        if kind not in ("mlp", "identity"):
            raise ValueError(f"projector kind must be 'mlp' or 'identity', got {kind!r}")
        if kind == "identity" and feature_dim != hidden_size:
            raise ValueError(f"an identity projector needs feature_dim == hidden_size, got "
                             f"feature_dim={feature_dim}, hidden_size={hidden_size}")
        self.feature_dim, self.hidden_size, self.kind = feature_dim, hidden_size, kind
        if kind == "mlp":
            def mlp():
                return nn.Sequential(nn.Linear(feature_dim, hidden_size), nn.GELU(),
                                     nn.Linear(hidden_size, hidden_size))
            self.visual, self.audio = mlp(), mlp()
        else:
            self.visual, self.audio = nn.Identity(), nn.Identity()

    def forward(self, features: torch.Tensor, modality: int) -> torch.Tensor:
        if features.shape[-1] != self.feature_dim:
            raise ValueError(f"features have dim {features.shape[-1]} but the projector expects "
                             f"feature_dim={self.feature_dim}")
        return (self.visual if modality == VISUAL else self.audio)(features)


@dataclass
class AVBatch:
    """A batch laid out for the LM. Rows are left-padded; ``position_ids`` count real tokens from
    0 (pads get 0). ``av_counts[b]`` = (Nv, Na) of row b."""

    inputs_embeds: torch.Tensor      # [B, L, D]
    attention_mask: torch.Tensor     # [B, L] int64, 1 = real token
    modality: torch.Tensor           # [B, L] int64: -1 pad, 0 visual, 1 audio, 2 text
    position_ids: torch.Tensor       # [B, L] int64
    clip_ids: list
    av_counts: list
    # the model's own positions of clips exported from it ([3, B, L] for M-RoPE), else None
    native_position_ids: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.inputs_embeds.shape[0]

    def av_positions(self, row: int) -> torch.Tensor:
        """Sequence positions of row ``row``'s AV tokens, video first then audio."""
        mod = self.modality[row]
        return torch.nonzero((mod == VISUAL) | (mod == AUDIO)).flatten()


class TeacherForced(NamedTuple):
    """A caption teacher-forced under keep-sets (:meth:`FrozenCaptioner.teacher_forced`):
    B samples, S sets each, T = the longest target's steps.

    ``token_log_prob`` [B, S, T]: log p(target token t | the set, the tokens before it), 0 past
    a target's end; ``margin`` [B, S, T]: the target token's logit minus the best other
    token's, +inf past a target's end; ``length`` [B]: each target's number of steps."""
    token_log_prob: torch.Tensor
    margin: torch.Tensor
    length: torch.Tensor

    @property
    def mean_log_prob(self) -> torch.Tensor:
        """[B, S]: the mean log-probability per target token."""
        return self.token_log_prob.sum(-1) / self.length[:, None].to(self.token_log_prob.dtype)

    @property
    def reproduces(self) -> torch.Tensor:
        """bool [B, S]: every margin > 0, i.e. greedy decoding under the set writes the target
        exactly (a margin of exactly 0 is a tie, which the model's argmax may break either
        way; it counts as not reproducing)."""
        return (self.margin > 0).all(-1)


class TeacherForcedInputs(NamedTuple):
    """:meth:`FrozenCaptioner.teacher_forced_inputs`: R = B * S rows, T = the longest target.

    ``inputs``: the :class:`~avex.pruning.PrunedInputs` of every row, the target's T tokens
    appended after the kept prompt; ``targets`` int64 [R, T] (EOS past a target's end);
    ``valid`` bool [R, T] (a step within its target); ``length`` [B]; ``steps`` T."""
    inputs: object
    targets: torch.Tensor
    valid: torch.Tensor
    length: torch.Tensor
    steps: int


def left_pad(pieces: list, value, dtype=None) -> torch.Tensor:
    length = max(p.shape[0] for p in pieces)
    out = []
    for p in pieces:
        pad_shape = (length - p.shape[0],) + tuple(p.shape[1:])
        out.append(torch.cat([torch.full(pad_shape, value, dtype=dtype or p.dtype,
                                         device=p.device), p]))
    return torch.stack(out)
