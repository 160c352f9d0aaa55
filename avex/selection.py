"""Which audio-visual tokens to keep: the one home of every keep-set rule.

Two axes appear everywhere:

* the *sequence* axis ``[B, L]`` the LLM sees (text, video, audio, padding), and
* the *AV axis* ``[B, M]``: each row's AV tokens in order of appearance, padded with ``PAD``.

:class:`AVLayout` maps between them. On the AV axis a keep-set is bool ``[B, M]``. The rules:

* :func:`num_kept`: the budget K = round(rho N), halves rounded up, at least 1 where N >= 1;
* :func:`split_budget`: the per-modality split K_a = round(K Na / N);
* :func:`random_keep`: K tokens uniformly at random, seeded by (seed, clip id);
* :func:`topk_keep`: the K highest scores, ties to the lower index;
* :func:`balanced_attention_keep`: the top text-to-AV attention within each modality, at the
  split above (what the policy's warmup imitates);
* :func:`indices_to_keep`: chosen indices (``-1`` past a row's K) to a keep-set (the
  exchange kernels' ``position_mask``).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch

from avex import _checks
from avex.kernels.exchange_ref import position_mask as indices_to_keep
from avex.modality import AUDIO, PAD, VISUAL, check_code_values

__all__ = ["AVLayout", "Selection", "num_kept", "split_budget", "random_keep", "topk_keep",
           "balanced_attention_keep", "indices_to_keep"]


def num_kept(retention: float, num_tokens: torch.Tensor) -> torch.Tensor:
    """K = round(rho * N) per row, halves rounded up, at least 1 where N >= 1. ``num_tokens``
    is an integer tensor of counts N >= 0 (or one int)."""
    rho = _checks.ratio("retention", retention)
    if isinstance(num_tokens, int) and not isinstance(num_tokens, bool):
        num_tokens = torch.tensor(num_tokens)
    _checks.tensor("num_tokens", num_tokens, integer=True)
    if num_tokens.numel() and int(num_tokens.min()) < 0:
        raise ValueError(f"num_tokens must be token counts >= 0, got {int(num_tokens.min())}")
    k = torch.floor(num_tokens.double() * rho + 0.5).long()
    huge = num_tokens > 2 ** 53  # float64 holds no such count exactly: round in integers
    if bool(huge.any()):
        num, den = rho.as_integer_ratio()  # exact: rho is a binary fraction
        exact = [(2 * n * num + den) // (2 * den) for n in num_tokens[huge].tolist()]
        k = k.clone()
        k[huge] = torch.tensor(exact, dtype=k.dtype, device=k.device)
    return torch.where(num_tokens > 0, k.clamp_min(1), torch.zeros_like(k))


def split_budget(k: int, n_visual: int, n_audio: int) -> tuple[int, int]:
    """(K_v, K_a) with K_a = round(K Na / N) (halves up), at least one token of a present
    modality when K >= 2, and K_v + K_a = K."""
    _checks.int_at_least("n_visual", n_visual, 0)
    _checks.int_at_least("n_audio", n_audio, 0)
    _checks.int_at_least("k", k, 0)
    if k > n_visual + n_audio:
        raise ValueError(f"k = {k} exceeds the {n_visual + n_audio} tokens (n_visual + n_audio)")
    n = n_visual + n_audio
    ka = min(n_audio, int(k * n_audio / n + 0.5)) if n else 0
    if k >= 2 and n_audio and ka == 0:
        ka = 1
    if k >= 2 and n_visual and k - ka == 0:
        ka = k - 1
    kv = min(n_visual, k - ka)
    return kv, k - kv


@dataclass
class AVLayout:
    """The AV axis of a batch: where each AV token sits in the sequence, and its modality."""
    positions: torch.Tensor  # int64 [B, M]: sequence position of each AV token, -1 past the row
    modality: torch.Tensor   # int64 [B, M]: VISUAL, AUDIO, or PAD past the row

    @classmethod
    def of(cls, modality: torch.Tensor) -> "AVLayout":
        _checks.tensor("modality", modality, ndim=2, integer=True)
        check_code_values("modality", modality)
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
        """K = round(rho * N) per row (:func:`num_kept`)."""
        return num_kept(retention, self.counts)

    def gather(self, per_position: torch.Tensor, fill=float("-inf")) -> torch.Tensor:
        """[B, L] values -> [B, M] on the AV axis, ``fill`` past each row's AV tokens."""
        values = per_position.gather(1, self.positions.clamp_min(0))
        return values.masked_fill(self.modality == PAD, fill)

    def gather_vectors(self, per_position: torch.Tensor) -> torch.Tensor:
        """[B, L, D] vectors -> [B, M, D] on the AV axis, zeros past each row's AV tokens."""
        index = self.positions.clamp_min(0)[..., None].expand(-1, -1, per_position.shape[-1])
        values = per_position.gather(1, index)
        return values.masked_fill((self.modality == PAD)[..., None], 0.0)


def _check_budget(counts, budget):
    """counts [B] and budget [B]: integer tensors with 0 <= budget <= counts."""
    _checks.tensor("counts", counts, ndim=1, integer=True)
    _checks.tensor("budget", budget, ndim=1, integer=True)
    if budget.shape != counts.shape:
        raise ValueError(f"budget has shape {list(budget.shape)} but counts has "
                         f"{list(counts.shape)}")
    bad = (budget < 0) | (budget > counts) | (counts < 0)
    if bool(bad.any()):
        row = int(torch.nonzero(bad)[0, 0])
        raise ValueError(f"budget[{row}] = {int(budget[row])} must lie in [0, counts[{row}] = "
                         f"{int(counts[row])}]")


class Selection(NamedTuple):
    """A keep-set plus replacement embeddings (for methods that merge tokens)."""
    keep: torch.Tensor            # bool [B, M] on the AV axis
    inputs_embeds: torch.Tensor   # [B, L, D], the sequence to compact the kept positions from


def random_keep(clip_ids: Sequence[str], counts: torch.Tensor, budget: torch.Tensor,
                seed: int, width: int | None = None) -> torch.Tensor:
    """bool [B, width]: ``budget[b]`` of row b's ``counts[b]`` AV tokens, uniformly at random.

    Row b's draw depends only on ``seed`` and ``clip_ids[b]`` (crc32, not ``hash()``, which
    changes from one process to the next), so a clip gets the same tokens in any batch."""
    _check_budget(counts, budget)
    if len(clip_ids) != len(counts):
        raise ValueError(f"clip_ids has {len(clip_ids)} entries but counts has {len(counts)}")
    counts, budget = counts.tolist(), budget.tolist()
    width = max(counts, default=0) if width is None else width
    keep = torch.zeros(len(counts), width, dtype=torch.bool)
    for row, (clip_id, n, k) in enumerate(zip(clip_ids, counts, budget)):
        gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{clip_id}".encode()))
        keep[row, torch.randperm(n, generator=gen)[:k]] = True
    return keep


def topk_keep(scores: torch.Tensor, budget: torch.Tensor) -> torch.Tensor:
    """bool [B, M]: the ``budget[b]`` highest finite scores of each row (ties to the lower
    index). ``-inf`` marks padding and is never chosen."""
    _checks.tensor("scores", scores, ndim=2, floating=True)
    _checks.tensor("budget", budget, ndim=1, integer=True)
    if budget.shape[0] != scores.shape[0]:
        raise ValueError(f"budget has {budget.shape[0]} rows but scores has {scores.shape[0]}")
    if bool(torch.isnan(scores).any()) or bool(torch.isposinf(scores).any()):
        raise ValueError("scores must be finite or -inf (padding), got NaN or +inf")
    if budget.numel() and int(budget.min()) < 0:
        raise ValueError(f"budget must be >= 0, got {int(budget.min())}")
    s = scores.detach().double()
    finite = torch.isfinite(s)
    # stable ascending sort of -s, non-finite last: ties keep their order (lower index first);
    # one batched sort on the scores' device, no per-row host round trip
    key = torch.where(finite, -s, torch.full_like(s, float("inf")))
    order = torch.sort(key, dim=1, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(s.shape[1], device=s.device).expand_as(order))
    return finite & (rank < budget.to(s.device)[:, None])


def balanced_attention_keep(attention: torch.Tensor, n_visual: int, n_audio: int,
                            retention: float, av_modality: torch.Tensor | None = None
                            ) -> torch.Tensor:
    """bool [Nv + Na] for one clip: K = :func:`num_kept` tokens split by :func:`split_budget`,
    each modality's share the most attended within it. ``attention`` is float [Nv + Na], in the
    order of the AV tokens (``FrozenCaptioner.text_to_av_attention``): video then audio, or as
    ``av_modality`` (codes [Nv + Na]) says for an interleaved layout (Qwen2.5-Omni)."""
    _checks.tensor("attention", attention, ndim=1, floating=True)
    if attention.shape[0] != n_visual + n_audio:
        raise ValueError(f"attention has {attention.shape[0]} values but the clip has "
                         f"n_visual + n_audio = {n_visual} + {n_audio} tokens")
    k = int(num_kept(retention, torch.tensor(n_visual + n_audio)))
    kv, ka = split_budget(k, n_visual, n_audio)
    if av_modality is None:
        av_modality = torch.tensor([VISUAL] * n_visual + [AUDIO] * n_audio)
    keep = torch.zeros(n_visual + n_audio, dtype=torch.bool)
    for code, budget in ((VISUAL, kv), (AUDIO, ka)):
        where = torch.nonzero(av_modality == code).flatten()
        keep[where[attention[where].topk(budget).indices]] = True
    return keep
