"""Named LLM configurations of the paper's backbones, as ``transformers`` configs.

Real sizes cost no weights: build a model from these on the meta device, or with random
weights, for parameter counts, FLOPs and latency.
"""
from __future__ import annotations

import json
import os

BACKBONES = {
    # VideoLLaMA 2's language model
    "qwen2-7b": dict(model_type="qwen2", hidden_size=3584, intermediate_size=18944,
                     num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                     vocab_size=152064, max_position_embeddings=32768, rope_theta=1e6,
                     rms_norm_eps=1e-6),
    # VILA 1.5-8B's language model
    "llama3-8b": dict(model_type="llama", hidden_size=4096, intermediate_size=14336,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      vocab_size=128256, max_position_embeddings=8192, rope_theta=5e5,
                      rms_norm_eps=1e-5),
}


def backbone_config(name_or_path: str):
    """A ``transformers`` config for a named backbone, or from a local config file/directory."""
    from transformers import AutoConfig

    if name_or_path in BACKBONES:
        spec = dict(BACKBONES[name_or_path])
        return AutoConfig.for_model(spec.pop("model_type"), **spec)
    if os.path.exists(name_or_path):
        file = os.path.join(name_or_path, "config.json") if os.path.isdir(name_or_path) \
            else name_or_path
        try:
            with open(file, encoding="utf-8") as handle:
                json.load(handle)
            return AutoConfig.from_pretrained(name_or_path)
        except (OSError, ValueError) as err:  # JSONDecodeError is a ValueError
            raise ValueError(f"backbone {name_or_path!r}: {file} is not a Hugging Face config "
                             f"({type(err).__name__}: {err})") from None
    raise ValueError(f"backbone must be one of {sorted(BACKBONES)} or a path to a Hugging Face "
                     f"config, got {name_or_path!r}")
