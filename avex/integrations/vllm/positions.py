"""A media item's M-RoPE positions, and how they ride with its embeddings through vLLM.

vLLM's multimodal-pruning interface (``SupportsMultiModalPruning``) lets a model's
``embed_multimodal`` return only the kept rows of an item, with extra channels appended that
``recompute_mrope_positions`` strips and turns into positions. Those channels are concatenated
in the embedding dtype, where a plain integer is not exact (bfloat16 holds integers up to 256:
257 becomes 256). Here each integer is written as base-256 digits, each digit exact in every
float dtype (bfloat16 and float16 included), so the positions come back bit for bit.

Only the kept tokens' own (t, h, w) ride in the channels. Where the text after an item starts
depends on the item's grid alone, not on which tokens are kept, so the text's positions are
laid out up front and :func:`place_kept` only writes the kept tokens' positions into their
placeholders, one prefill chunk at a time. (vLLM's own rewrite, written for its video pruning,
shifts the text as well and mistakes the item a chunk is in when a chunk boundary falls at or
near an item's end: with chunked prefill it put tokens at wrong positions.)

Positions follow the model's own rule (vLLM's ``get_mrope_input_positions`` for Qwen2.5-VL,
the original Qwen2.5-VL code): an item of grid (t, h, w) after merging has position
(floor(i * t_factor), j, k) for its token (i, j, k), relative to the position after its
vision-start marker, and the text after it starts at the item's largest position + 1.
"""
from __future__ import annotations

import torch

DIGITS = 3          # base-256 digits per integer: positions below 2**24
BASE = 256
VALUES = 3          # t, h, w
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
    """int64 [N, 3] -> [N, CHANNELS] in ``dtype``: each value as DIGITS base-256 digits, least
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
    """[N, CHANNELS] float -> int64 [N, 3], the inverse of :func:`encode`."""
    if channels.dim() != 2 or channels.shape[1] != CHANNELS:
        raise ValueError(f"channels must be [N, {CHANNELS}], got {list(channels.shape)}")
    digits = channels.float().round().long().reshape(-1, VALUES, DIGITS)
    scale = BASE ** torch.arange(DIGITS, device=channels.device)
    return (digits * scale).sum(-1)


def media_runs(input_ids: torch.Tensor, media_ids) -> list[tuple[int, int]]:
    """(start, end) of each run of one placeholder id, in prompt order: one run per media
    item (a Qwen2.5-VL item's placeholders sit between its vision-start and -end markers)."""
    ids = torch.as_tensor(input_ids).flatten().cpu()
    key = torch.where(torch.isin(ids, torch.tensor(list(media_ids))), ids, -1)
    change = torch.ones(ids.numel(), dtype=torch.bool)
    change[1:] = key[1:] != key[:-1]
    starts = change.nonzero().flatten().tolist()
    ends = starts[1:] + [ids.numel()]
    return [(s, e) for s, e in zip(starts, ends) if key[s] >= 0]


def place_kept(input_ids, item_positions, mrope_positions, num_computed_tokens: int,
               media_ids) -> torch.Tensor:
    """The prompt's positions with the kept tokens of one prefill chunk in place.

    ``input_ids``: the whole prompt; ``mrope_positions``: int64 [3, N], the prompt's current
    positions (text final, placeholders provisional or already placed); ``item_positions``:
    for each item the chunk reaches, in order, int64 [n, 3] (t, h, w) of the chunk's part of
    that item relative to the item's start, the kept tokens in order (vLLM hands each
    chunk the part of every item inside it: from ``num_computed_tokens`` for the first,
    from its start for the others). An item starts one past the position of the token
    before its placeholders (its vision-start marker). Returns a new [3, N] tensor."""
    out = mrope_positions.clone()
    if not len(item_positions):
        return out
    runs = media_runs(input_ids, media_ids)
    first = next((k for k, (_, end) in enumerate(runs) if end > num_computed_tokens), None)
    if first is None or first + len(item_positions) > len(runs):
        raise ValueError(f"{len(item_positions)} media parts for a chunk from token "
                         f"{num_computed_tokens}, but the prompt has {len(runs)} media items "
                         f"ending at {[end for _, end in runs]}")
    for k, where in enumerate(item_positions):
        start, end = runs[first + k]
        at = max(start, num_computed_tokens) if k == 0 else start
        if at + where.shape[0] > end:
            raise ValueError(f"media item {first + k} holds tokens {start}..{end - 1}; its part "
                             f"of {where.shape[0]} from token {at} runs past it")
        base = out[0, start - 1] + 1 if start > 0 else out.new_zeros(())
        out[:, at:at + where.shape[0]] = where[:, :3].T.to(out) + base
    return out
