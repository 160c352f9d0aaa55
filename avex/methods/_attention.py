"""Attention maps of the frozen LLM (eager attention, ``output_attentions=True``): ``llm`` is
the Hugging Face causal LM itself."""
from __future__ import annotations

import torch


def num_layers(llm) -> int:
    return int(llm.config.get_text_config().num_hidden_layers)


@torch.no_grad()
def head_averaged_attentions(llm, inputs_embeds, attention_mask, position_ids,
                             upto: int) -> list[torch.Tensor]:
    """Softmax attention [B, L, L] of layers 0..upto-1, averaged over heads, float32.

    The whole decoder runs (cutting its layer list would be cheaper, but transformers records
    attentions through hooks installed on the layers it first sees, so a cut list breaks later
    calls)."""
    previous = llm.config._attn_implementation
    decoder = llm.get_decoder() if hasattr(llm, "get_decoder") else llm.model
    llm.set_attn_implementation("eager")
    try:
        out = decoder(inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                      position_ids=position_ids, output_attentions=True, use_cache=False)
    finally:
        llm.set_attn_implementation(previous)
    if len(out.attentions) < upto:
        raise RuntimeError(f"the LLM returned {len(out.attentions)} attention maps, "
                           f"{upto} were needed")
    return [a.float().mean(1) for a in out.attentions[:upto]]
