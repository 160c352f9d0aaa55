"""FastAV: two-stage audio-visual pruning, implemented from its paper's description (no public
code exists).

What the description gives: a *global* prune from attention rollout over the early layers of
the LLM, then a *fine* prune from the attention of the last query token at a later layer, on
the tokens that survived the first stage. What is assumed here (documented choices, not
FastAV's published values):

- rollout (Abnar & Zuidema, 2020) over layers 0..E-1 (``rollout_layers`` E, default half the
  LLM's depth): per layer the head-averaged attention A, mixed with the residual path as
  0.5 A + 0.5 I and row-normalised, multiplied from the first layer up; a token's stage-1 score
  is the rollout weight from the last prompt token to it;
- stage 1 keeps a joint Top-K1 over the audio + visual span (no per-modality quota), with
  K1 = N - ceil(``stage1_drop`` (N - K)): stage 1 removes that share (default 0.5) of the
  N - K tokens to be removed, stage 2 the rest;
- stage 2 prefills the kept text + K1 AV tokens (original positions) up to ``late_layer``
  (1-indexed, default the LLM's last layer) and keeps the K of them with the highest
  last-query attention there (averaged over heads);
- the final K tokens are then captioned like every other method (one compacted prefill at
  original positions). FastAV prunes *inside* the LLM (later layers see fewer tokens than
  earlier ones); here both stages only choose the set that every layer then sees.
"""
from __future__ import annotations

import torch

from avex import _checks
from avex.methods._attention import head_averaged_attentions, num_layers
from avex.pruning import expand_av_keep, prune_inputs
from avex.selection import topk_keep


def attention_rollout(attentions: list[torch.Tensor], residual: float = 0.5) -> torch.Tensor:
    """[B, L, L] per layer (head-averaged) -> the rollout R = A'_{E-1} ... A'_0, with
    A' = (1 - residual) A + residual I, rows renormalised."""
    eye = torch.eye(attentions[0].shape[-1], dtype=attentions[0].dtype,
                    device=attentions[0].device)
    rollout = None
    for att in attentions:
        mixed = (1 - residual) * att + residual * eye
        mixed = mixed / mixed.sum(-1, keepdim=True).clamp_min(1e-12)
        rollout = mixed if rollout is None else mixed @ rollout
    return rollout


#: the share of the N - K tokens to remove that stage 1 removes, when none is given
DEFAULT_STAGE1_DROP = 0.5


def fastav_selector(llm, rollout_layers: int | None = None, late_layer: int | None = None,
                    stage1_drop: float = DEFAULT_STAGE1_DROP):
    """FastAV on the frozen LLM ``llm`` (the module docstring gives the stages and defaults)."""
    depth = num_layers(llm)
    rollout_layers = max(1, depth // 2) if rollout_layers is None else \
        _checks.int_at_least("rollout_layers", rollout_layers, 1)
    late_layer = depth if late_layer is None else _checks.int_at_least("late_layer",
                                                                       late_layer, 1)
    for name, value in (("rollout_layers", rollout_layers), ("late_layer", late_layer)):
        if value > depth:
            raise ValueError(f"{name} must be <= the LLM's {depth} layers, got {value}")
    if not 0 <= stage1_drop <= 1:
        raise ValueError(f"stage1_drop must be in [0, 1], got {stage1_drop}")

    @torch.no_grad()
    def select(batch, layout, retention):
        retention = _checks.ratio("retention", retention)
        # everything stays on the batch's device: no host round trip is timed as FastAV's cost
        budget = layout.budget(retention)
        counts = layout.counts
        # stage 1: rollout from the last prompt token, joint Top-K1
        positions = batch.position_ids if batch.native_position_ids is None \
            else batch.native_position_ids  # a model's own (M-RoPE) positions where it has them
        atts = head_averaged_attentions(llm, batch.inputs_embeds, batch.attention_mask,
                                        positions, upto=rollout_layers)
        rollout = attention_rollout(atts)
        scores1 = layout.gather(rollout[:, -1, :])
        # K1 = N - ceil(drop (N - K)), in float64 as Python's math.ceil would compute it
        k1 = counts - torch.ceil((counts - budget).double() * stage1_drop).long()
        keep1 = topk_keep(scores1, k1)
        # stage 2: last-query attention at late_layer on the survivors
        pruned = prune_inputs(batch.inputs_embeds, batch.modality,
                              keep=expand_av_keep(keep1, batch.modality),
                              position_ids=batch.native_position_ids)
        att2 = head_averaged_attentions(llm, pruned.inputs_embeds, pruned.attention_mask,
                                        pruned.position_ids, upto=late_layer)[late_layer - 1]
        # each kept token's attention back at its sequence position (index is into [B * L])
        per_position = torch.full((batch.modality.numel(),), float("-inf"),
                                  device=att2.device)
        valid = pruned.index >= 0
        per_position[pruned.index[valid]] = att2[:, -1, :][valid]
        scores2 = layout.gather(per_position.view(batch.modality.shape))
        scores2 = scores2.masked_fill(~keep1, float("-inf"))
        return topk_keep(scores2, budget)
    select.rollout_layers, select.late_layer = rollout_layers, late_layer
    return select
