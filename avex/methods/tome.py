"""ToMe-AV: token merging (bipartite soft matching) within each modality.

ToMe (Bolya et al., 2023) merges, in every ViT block, the r most similar token pairs between
two alternating halves of the sequence (cosine similarity of the attention keys), averaging
merged tokens weighted by how many original tokens each one already holds. The AV extension,
applied once to the LLM's input tokens:

- the budget K = round(rho N) is split between modalities as the token counts are
  (K_a = round(K Na / N), at least one token of a present modality when K >= 2); each
  modality is merged down to its share separately, never across modalities;
- one round: the modality's current tokens (in order of position) alternate between a source
  set A (even slots) and a destination set B (odd slots); every A token finds its most
  cosine-similar B token; the r best-matched A tokens are merged into their B tokens by
  size-weighted mean (several may merge into one B token). One round merges at most half, so
  rounds repeat until the modality's share is met (ToMe's r per layer, spread over rounds);
- similarity is over the input embeddings by default (``features="embeddings"``), or over the
  head-averaged keys of the LLM's first layer (``features="keys"``, needs the LLM);
- a merged token sits at its destination's original position; the selector returns the keep
  mask and the sequence with merged embeddings at the kept positions (:class:`Selection`).

Deviations: ToMe merges progressively inside the network and uses proportional attention
(log-size bias) afterwards; here merging happens once before the LLM, with no size bias in the
LLM's attention (the frozen HF model has no hook for it). A modality whose share is 0 (only
when K = 1) is dropped rather than merged.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from avex import _checks
from avex.modality import AUDIO, VISUAL
from avex.selection import Selection, split_budget


def merge_modality(x: torch.Tensor, feats: torch.Tensor, target: int):
    """Merge ``x`` [n, D] (similarity from ``feats`` [n, F]) down to ``target`` tokens.

    Returns (survivors: int64 indices into 0..n-1 in order, merged [target, D])."""
    n, device = x.shape[0], x.device
    alive = torch.arange(n, device=device)  # every index on x's device: CUDA inputs work too
    values = x.double().clone()
    sizes = torch.ones(n, dtype=torch.float64, device=device)
    feats = feats.double()
    while len(alive) > target:
        src, dst = alive[0::2], alive[1::2]
        if len(dst) == 0:
            break
        r = min(len(alive) - target, len(src))
        sim = F.normalize(feats[src], dim=-1) @ F.normalize(feats[dst], dim=-1).T
        best, match = sim.max(dim=1)
        # stable: equal similarities merge the earlier source first
        chosen = torch.sort(-best, stable=True).indices[:r]
        a, b = src[chosen], dst[match[chosen]]
        _apply_merges(values, feats, sizes, a, b)
        gone = torch.zeros(n, dtype=torch.bool, device=device)
        gone[a] = True
        alive = alive[~gone[alive]]
    return alive, values[alive].to(x.dtype)


def _apply_merges(values, feats, sizes, a, b) -> None:
    """Merge source a[i] into destination b[i], in place, by size-weighted mean, for i in order.

    Merges into one destination apply in that order, one at a time (the arithmetic of a loop
    over i); merges into different destinations apply together, on the device: step t applies
    each destination's t-th merge (t = the earlier merges into it)."""
    step = torch.tril(b[:, None] == b[None, :], diagonal=-1).sum(1)
    for t in range(int(step.max()) + 1 if len(b) else 0):
        at, bt = a[step == t], b[step == t]
        total = sizes[at] + sizes[bt]
        values[bt] = (values[bt] * sizes[bt, None] + values[at] * sizes[at, None]) \
            / total[:, None]
        feats[bt] = (feats[bt] * sizes[bt, None] + feats[at] * sizes[at, None]) / total[:, None]
        sizes[bt] = total


def tome_selector(llm=None, features: str = "embeddings"):
    """ToMe-AV; ``features`` is ``"embeddings"`` or ``"keys"`` (first-layer keys, averaged over
    heads; needs the frozen LLM ``llm``)."""
    _checks.choice("features", features, {"embeddings", "keys"})
    if features == "keys" and llm is None:
        raise ValueError("features='keys' needs the frozen LLM (llm=...)")

    @torch.no_grad()
    def select(batch, layout, retention):
        retention = _checks.ratio("retention", retention)
        embeds = batch.inputs_embeds
        feats = embeds if features == "embeddings" else _first_layer_keys(llm, batch)
        out = embeds.clone()
        keep = torch.zeros_like(layout.modality, dtype=torch.bool)
        budget = layout.budget(retention)
        for row in range(len(layout.modality)):
            mod = layout.modality[row]
            cols_v = torch.nonzero(mod == VISUAL).flatten()
            cols_a = torch.nonzero(mod == AUDIO).flatten()
            kv, ka = split_budget(int(budget[row]), len(cols_v), len(cols_a))
            for cols, target in ((cols_v, kv), (cols_a, ka)):
                if target == 0 or len(cols) == 0:
                    continue
                pos = layout.positions[row, cols]
                alive, merged = merge_modality(embeds[row, pos], feats[row, pos], target)
                keep[row, cols[alive]] = True
                out[row, pos[alive]] = merged
        return Selection(keep, out)
    select.features = features
    return select


@torch.no_grad()
def _first_layer_keys(llm, batch) -> torch.Tensor:
    """Keys of the LLM's first attention layer for every position, averaged over KV heads
    (before RoPE: the rotation would make similarity depend on distance)."""
    decoder = llm.get_decoder() if hasattr(llm, "get_decoder") else llm.model
    layer = decoder.layers[0]
    hidden = layer.input_layernorm(batch.inputs_embeds)
    keys = layer.self_attn.k_proj(hidden)
    heads = llm.config.num_key_value_heads or llm.config.num_attention_heads
    return keys.view(*keys.shape[:2], heads, -1).mean(2)
