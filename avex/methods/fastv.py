"""FastV-AV: FastV's attention ranking applied to the audio and visual tokens together.

FastV (Chen et al., 2024) runs the first K layers on every token, reads the attention that the
last token pays to each image token at layer K-1 (averaged over heads), and drops the
least-attended image tokens from layer K on. The AV extension:

- the ranked span is the audio *and* visual tokens (video then audio), ranked jointly: one
  Top-K over both modalities, no per-modality quota (so the numerous visual tokens can crowd
  out audio, which is the behaviour the paper attributes to global rankings);
- the query is the last prompt token (the last text position before generation);
- kept tokens keep their original positions.

Deviation: FastV keeps all tokens in layers 0..K-1 and prunes inside the LLM; here the kept set
is chosen from the first K layers' prefill and then *all* layers see only the kept tokens (the
same compacted prefill as every other method), so the comparison isolates the choice of tokens.
``layer`` is FastV's K (default 2; FastV uses 2 or 3); it must not exceed the LLM's depth.
"""
from __future__ import annotations

import torch

from avex import _checks
from avex.methods._attention import head_averaged_attentions, num_layers
from avex.selection import topk_keep


def last_query_scores(attention: torch.Tensor, layout) -> torch.Tensor:
    """[B, L, L] head-averaged attention -> [B, M]: the last position's weight on each AV token
    (rows are left-padded, so the last column is the last prompt token)."""
    last = attention[:, -1, :]
    return layout.gather(last)


#: FastV's K when none is given (or the LLM's depth, when it has fewer layers)
DEFAULT_LAYER = 2


def fastv_layer(llm, layer: int | None = None) -> int:
    """FastV-AV's K on ``llm``: ``layer``, checked against the LLM's depth, or the default."""
    layer = min(DEFAULT_LAYER, num_layers(llm)) if layer is None else \
        _checks.int_at_least("layer", layer, 1)
    if layer > num_layers(llm):
        raise ValueError(f"layer must be <= the LLM's {num_layers(llm)} layers, "
                         f"got {layer}")
    return layer


def fastv_selector(llm, layer: int | None = None):
    """FastV-AV on the frozen LLM ``llm`` with K = ``layer`` (attention of layer K-1,
    0-indexed); default K = 2, or the LLM's depth when it has fewer layers."""
    layer = fastv_layer(llm, layer)

    @torch.no_grad()
    def select(batch, layout, retention):
        retention = _checks.ratio("retention", retention)
        positions = batch.position_ids if batch.native_position_ids is None \
            else batch.native_position_ids  # a model's own (M-RoPE) positions where it has them
        att = head_averaged_attentions(llm, batch.inputs_embeds, batch.attention_mask,
                                       positions, upto=layer)[layer - 1]
        return topk_keep(last_query_scores(att, layout), layout.budget(retention))
    select.layer = layer
    return select
