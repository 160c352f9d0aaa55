"""Drop-in audio-visual token pruning for any Hugging Face ``*ForCausalLM`` that takes
``inputs_embeds``.

``prune_inputs`` keeps the text and the chosen audio-visual tokens of each sample, in their
original order, and compacts them into a left-padded batch with the positions RoPE would have
seen on the full sequence. ``generate`` runs ``model.generate`` on that batch and makes the decode
steps continue from the last original position + 1, so the pruned model sees exactly the full
sequence with the dropped tokens masked out of attention.

Modality codes (one per position of ``inputs_embeds``) are those of :mod:`avex.modality`.

Original positions count the non-padding tokens of the input row: the token at the i-th
non-padding slot has position i, whether or not the tokens before it were kept (the position
ids a Hugging Face model computes from the attention mask of the unpruned batch). A model with
its own position ids (Qwen2.5-VL's M-RoPE, Qwen2.5-Omni's TMRoPE: ``[3, B, L]``) passes them as
``position_ids``; they are gathered with the same index as the embeddings, and decoding
continues where the model's own generation would: after the last original token's position,
on each axis, even when that token was pruned. Extra per-token inputs (Gemma 3n's
``per_layer_inputs``) are gathered the same way and reach the prefill. :mod:`avex.adapters`
builds all of these from a processor's output.

    inputs.py       prune_inputs and the keep-sets it applies
    generation.py   generate and forward on its output
"""
from avex.modality import AUDIO, PAD, TEXT, VISUAL
from avex.pruning.generation import (cache_keyword, forward, generate, packed_attention,
                                     sliding_window, uses_mrope)
from avex.pruning.inputs import (PrunedInputs, expand_av_keep, gather_tokens, item_index,
                                 prune_inputs, select_keep)
from avex.selection import num_kept

__all__ = ["PAD", "VISUAL", "AUDIO", "TEXT", "PrunedInputs", "prune_inputs", "generate",
           "forward", "expand_av_keep", "gather_tokens", "num_kept", "select_keep",
           "item_index", "cache_keyword", "packed_attention", "sliding_window", "uses_mrope"]
