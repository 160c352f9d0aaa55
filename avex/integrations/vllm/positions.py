"""A media item's M-RoPE positions, and how they ride with its embeddings through vLLM.

vLLM's multimodal-pruning interface (``SupportsMultiModalPruning``) lets a model's
``embed_multimodal`` return only the kept rows of an item, with extra channels appended that
``recompute_mrope_positions`` strips and turns into positions. Those channels are concatenated
in the embedding dtype, where a plain integer is not exact (bfloat16 holds integers up to 256:
257 becomes 256). Here each integer is written as base-256 digits, each digit exact in every
float dtype (bfloat16 and float16 included), so the positions come back bit for bit.

Positions follow the model's own rule (vLLM's ``get_mrope_input_positions`` for Qwen2.5-VL,
the original Qwen2.5-VL code): an item of grid (t, h, w) after merging has position
(floor(i * t_factor), j, k) for its token (i, j, k), relative to the position after its
vision-start marker, and the text after it starts at the item's largest position + 1.
"""
from __future__ import annotations

import torch

DIGITS = 3          # base-256 digits per integer: positions below 2**24
BASE = 256
VALUES = 4          # t, h, w, and the offset of the text after the item
CHANNELS = VALUES * DIGITS
LIMIT = BASE ** DIGITS


def item_positions(grid_thw, merge: int, t_factor: float = 1.0) -> torch.Tensor:
    """int64 [N, 4]: each token's (t, h, w) position relative to the item's start, and in the
    last column the offset where the text after the item starts (its largest position + 1).
    ``grid_thw``: the item's patch grid (t, h, w) before the spatial merge; ``t_factor``:
    seconds per temporal patch times tokens per second (1 for images)."""
    t, h, w = (int(v) for v in grid_thw)
    if t < 1 or h < merge or w < merge or h % merge or w % merge:
        raise ValueError(f"grid_thw must be (t, h, w) with t >= 1 and h, w positive multiples "
                         f"of the merge size {merge}, got {list(grid_thw)}")
    h, w = h // merge, w // merge
    # float64 like vLLM's numpy: floor(i * t_factor) for each temporal index
    frames = (torch.arange(t, dtype=torch.float64) * float(t_factor)).long()
    tt = frames.view(t, 1, 1).expand(t, h, w)
    hh = torch.arange(h).view(1, h, 1).expand(t, h, w)
    ww = torch.arange(w).view(1, 1, w).expand(t, h, w)
    grid = torch.stack([tt, hh, ww], -1).reshape(-1, 3)
    after = grid.max() + 1
    return torch.cat([grid, after.expand(grid.shape[0], 1)], 1)


def encode(positions: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """int64 [N, 4] -> [N, CHANNELS] in ``dtype``: each value as DIGITS base-256 digits, least
    significant first; exact in float32, float16 and bfloat16."""
    if positions.dtype != torch.int64 or positions.dim() != 2 or positions.shape[1] != VALUES:
        raise ValueError(f"positions must be int64 [N, {VALUES}], got {positions.dtype} "
                         f"{list(positions.shape)}")
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= LIMIT):
        raise ValueError(f"positions must lie in [0, {LIMIT}) to ride in {DIGITS} base-{BASE} "
                         f"digits, got {int(positions.min())}..{int(positions.max())}")
    digits = [(positions // BASE ** d) % BASE for d in range(DIGITS)]
    return torch.stack(digits, -1).reshape(positions.shape[0], CHANNELS).to(dtype)


def decode(channels: torch.Tensor) -> torch.Tensor:
    """[N, CHANNELS] float -> int64 [N, 4], the inverse of :func:`encode`."""
    if channels.dim() != 2 or channels.shape[1] != CHANNELS:
        raise ValueError(f"channels must be [N, {CHANNELS}], got {list(channels.shape)}")
    digits = channels.float().round().long().reshape(-1, VALUES, DIGITS)
    scale = BASE ** torch.arange(DIGITS, device=channels.device)
    return (digits * scale).sum(-1)
