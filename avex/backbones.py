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
    return check_decoder_config(_config_file(name_or_path), name_or_path)


def _config_file(name_or_path: str):
    from transformers import AutoConfig

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
        except _strict_dataclass_error() as err:  # a config class's own check (llama: heads)
            cause = str(err.__cause__ or err).strip()
            raise ValueError(f"backbone {name_or_path!r} (--backbone): transformers refuses "
                             f"{file}: {cause}") from None
    raise ValueError(f"backbone must be one of {sorted(BACKBONES)} or a path to a Hugging Face "
                     f"config, got {name_or_path!r}")


def _strict_dataclass_error():
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # an older huggingface_hub: configs are not validated on load
        return ()
    return StrictDataclassError


# what the FLOPs count, the latency model and the policy read from a decoder's config
DECODER_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "vocab_size", "max_position_embeddings")


# fields a mixture-of-experts decoder sets (Qwen2/3-MoE, Mixtral, DeepSeek, OLMoE ...)
MOE_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")


def check_decoder_config(config, name: str = "config"):
    """``config`` if it describes a decoder-only causal LM these tools can size: one
    ``AutoModelForCausalLM`` builds, with every field of :data:`DECODER_FIELDS` a positive
    integer, attention heads dividing the width and key/value heads dividing the heads, and no
    mixture of experts (:data:`MOE_FIELDS`). A ValueError naming the backbone (``--backbone``)
    and the field otherwise."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    where = f"backbone {name!r} (--backbone)"
    if getattr(config, "text_config", None) is not None:
        raise ValueError(
            f"{where}: a composite {type(config).__name__} (its language model's fields are in "
            f"text_config); pass a config.json of its language model alone (a decoder "
            f"model_type such as qwen2 or llama, with text_config's sizes)")
    if config.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ValueError(f"{where}: model_type {config.model_type!r} has no causal LM in "
                         f"transformers (AutoModelForCausalLM)")
    for field in DECODER_FIELDS:
        value = getattr(config, field, None)
        if value is None:
            raise ValueError(f"{where}: {type(config).__name__} has no {field}; a decoder "
                             f"config (llama, qwen2, ...) with {', '.join(DECODER_FIELDS)} "
                             f"is needed")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: {field} must be a positive integer, got {value!r}")
    aliases = getattr(config, "attribute_map", {})   # mixtral's num_experts names another
    experts = {f: getattr(config, f) for f in MOE_FIELDS
               if f not in aliases and getattr(config, f, None)}
    if experts:
        raise ValueError(f"{where}: {type(config).__name__} is a mixture of experts ("
                         + ", ".join(f"{k}={v}" for k, v in experts.items())
                         + "); these tools size dense decoder layers (every token through one "
                         "MLP of intermediate_size), so its FLOPs, latency model and policy "
                         "would be another model's; pass a dense decoder's config")
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    if config.hidden_size % heads:
        raise ValueError(f"{where}: hidden_size {config.hidden_size} is not divisible by "
                         f"num_attention_heads {heads}")
    if heads % kv:
        raise ValueError(f"{where}: num_attention_heads {heads} is not divisible by "
                         f"num_key_value_heads {kv}")
    return config
