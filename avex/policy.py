"""The text-conditioned AVEX policy (Section 3.2 of the paper).

    Z_av  = AVEnc([H_v; H_a])                 two non-causal Transformer blocks over the AV tokens
    Z^_av = CrossAttn(Q=Z_av, K=H_t, V=H_t)   AV tokens attend to the prompt
    Z'_av = LN(Z_av + Z^_av)
    s_i   = Head(MLP(Z'_av)_i)                per-token MLP, then LayerNorm -> MLP -> scalar

The policy reads the same ``inputs_embeds`` and ``modality`` (``avex.pruning`` codes) that go
to the frozen LLM, so it works on any layout of prompt, video and audio tokens; it returns one
score per position, ``-inf`` wherever the token is not audio or visual.

The encoder blocks have the shape and parameter names of a Qwen2 / Llama decoder layer
(RMSNorm, attention with optional grouped KV heads and q/k/v bias, SwiGLU MLP), so the first
block can start from the frozen LLM's first decoder layer when the widths match
(``AVEXPolicy.from_llm``). Unlike the LLM, the blocks attend both ways and use no rotary
positions: a learned modality embedding tells audio from visual, and (``positional``, on by
default) a projection of each token's place within its modality (sinusoids of its index, and of
its index over the modality's count, so first / last frames and patch slots are visible): what
the LLM attends to depends strongly on position.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from avex import _checks
from avex.backbones import BACKBONES, backbone_config
from avex.modality import AUDIO, TEXT, VISUAL, check_code_values


@dataclass
class PolicyConfig:
    """Sizes of the policy. ``input_size`` is the width of the LLM's token embeddings."""
    input_size: int
    hidden_size: int
    num_heads: int = 8
    num_kv_heads: int | None = None       # None: as many as num_heads
    intermediate_size: int | None = None  # None: 3 * hidden_size (SwiGLU)
    num_layers: int = 2
    qkv_bias: bool = False
    norm_eps: float = 1e-6
    positional: bool = True               # add within-modality position features

    def __post_init__(self):
        _checks.int_at_least("input_size", self.input_size, 1)
        _checks.int_at_least("hidden_size", self.hidden_size, 1)
        _checks.int_at_least("num_heads", self.num_heads, 1)
        _checks.int_at_least("num_layers", self.num_layers, 1)
        _checks.optional_int_at_least("num_kv_heads", self.num_kv_heads, 1)
        _checks.optional_int_at_least("intermediate_size", self.intermediate_size, 1)
        _checks.flag("qkv_bias", self.qkv_bias)
        _checks.positive_float("norm_eps", self.norm_eps)
        self.num_kv_heads = self.num_kv_heads or self.num_heads
        self.intermediate_size = self.intermediate_size or 3 * self.hidden_size
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads "
                             f"({self.num_heads})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be divisible by num_kv_heads "
                             f"({self.num_kv_heads})")


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


class SelfAttention(nn.Module):
    """Bidirectional multi-head attention with a Qwen2/Llama parameter layout."""

    def __init__(self, cfg: PolicyConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads = cfg.num_heads, cfg.num_kv_heads
        self.head_dim = cfg.hidden_size // cfg.num_heads
        kv_size = self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden_size, kv_size, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden_size, kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)

    def forward(self, x, key_mask):
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask[:, None, None, :])
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class EncoderBlock(nn.Module):
    """Pre-norm Transformer block; parameter names match a Qwen2/Llama decoder layer."""

    def __init__(self, cfg: PolicyConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.self_attn = SelfAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.hidden_size, cfg.intermediate_size)

    def forward(self, x, key_mask):
        x = x + self.self_attn(self.input_layernorm(x), key_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class AVEXPolicy(nn.Module):
    def __init__(self, cfg: PolicyConfig):
        super().__init__()
        self.config = cfg
        width = cfg.hidden_size
        # identity when the policy is as wide as the LLM: the first block then sees LLM inputs
        self.av_in = nn.Identity() if cfg.input_size == width else nn.Linear(cfg.input_size, width)
        self.text_in = (nn.Identity() if cfg.input_size == width
                        else nn.Linear(cfg.input_size, width))
        self.modality_embedding = nn.Embedding(2, width)  # VISUAL, AUDIO
        nn.init.normal_(self.modality_embedding.weight, std=0.02)
        if cfg.positional:
            # one projection per modality: patch slots mean nothing on the audio axis
            self.position_in = nn.Linear(2 * POSITION_FEATURES, width)
            nn.init.normal_(self.position_in.weight, std=0.02)
            nn.init.zeros_(self.position_in.bias)
        self.encoder = nn.ModuleList(EncoderBlock(cfg) for _ in range(cfg.num_layers))
        self.encoder_norm = RMSNorm(width, cfg.norm_eps)
        self.text_norm = RMSNorm(width, cfg.norm_eps)
        self.cross_attn = nn.MultiheadAttention(width, cfg.num_heads, batch_first=True)
        self.cross_norm = nn.LayerNorm(width)
        self.token_mlp = nn.Sequential(nn.Linear(width, cfg.intermediate_size), nn.GELU(),
                                       nn.Linear(cfg.intermediate_size, width))
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU(),
                                  nn.Linear(width, 1))

    @classmethod
    def from_llm(cls, llm, *, hidden_size: int | None = None, num_layers: int = 2,
                 init_from_llm: bool = True, positional: bool = True) -> "AVEXPolicy":
        """A policy for a Hugging Face causal LM.

        With ``hidden_size`` None or equal to the LLM's width, the blocks take the LLM's layer
        shapes and the first one copies the LLM's first decoder layer (``init_from_llm``).
        A smaller ``hidden_size`` gives a compact policy with input projections, randomly
        initialised.
        """
        c = llm.config.get_text_config()  # an audio-visual model's decoder settings
        width = hidden_size or c.hidden_size
        matched = width == c.hidden_size
        cfg = PolicyConfig(
            input_size=c.hidden_size, hidden_size=width,
            num_heads=c.num_attention_heads if matched else max(1, width // 64),
            num_kv_heads=getattr(c, "num_key_value_heads", None) if matched else None,
            intermediate_size=c.intermediate_size if matched else None,
            num_layers=num_layers,
            qkv_bias=bool(getattr(c, "attention_bias", False)
                          or c.model_type.startswith("qwen2"))
            if matched else False,
            norm_eps=getattr(c, "rms_norm_eps", 1e-6), positional=positional)
        policy = cls(cfg)
        if matched and init_from_llm:
            policy.encoder[0].load_state_dict(_first_decoder_layer(llm).state_dict(),
                                              strict=False)
        return policy

    def forward(self, inputs_embeds: torch.Tensor, modality: torch.Tensor) -> torch.Tensor:
        """Keep scores [B, L] (float32): finite at audio/visual positions, -inf elsewhere."""
        _checks.tensor("inputs_embeds", inputs_embeds, ndim=3, floating=True)
        _checks.tensor("modality", modality, ndim=2, integer=True)
        if modality.shape != inputs_embeds.shape[:2]:
            raise ValueError(f"modality has shape {list(modality.shape)} but inputs_embeds is "
                             f"{list(inputs_embeds.shape)}; expected [B, L] = "
                             f"{list(inputs_embeds.shape[:2])}")
        if inputs_embeds.shape[-1] != self.config.input_size:
            raise ValueError(f"inputs_embeds has width {inputs_embeds.shape[-1]}, the policy "
                             f"expects input_size={self.config.input_size}")
        check_code_values("modality", modality)
        is_av = (modality == VISUAL) | (modality == AUDIO)
        is_text = modality == TEXT
        # rows without any key of a kind attend to everything: their outputs are discarded
        av_keys = is_av | ~is_av.any(dim=1, keepdim=True)
        text_keys = is_text | ~is_text.any(dim=1, keepdim=True)

        # the policy trains in its own dtype (float32 by default), whatever the LLM runs in
        inputs_embeds = inputs_embeds.to(self.modality_embedding.weight.dtype)
        z = self.av_in(inputs_embeds) + self.modality_embedding((modality == AUDIO).long())
        if self.config.positional:
            features = position_features(modality).to(z.dtype)
            is_audio = (modality == AUDIO)[..., None]
            z = z + self.position_in(torch.cat([features.masked_fill(is_audio, 0.0),
                                                features.masked_fill(~is_audio, 0.0)], -1))
        for block in self.encoder:
            z = block(z, av_keys)
        z = self.encoder_norm(z)
        text = self.text_norm(self.text_in(inputs_embeds))
        attended, _ = self.cross_attn(z, text, text, key_padding_mask=~text_keys,
                                      need_weights=False)
        z = self.cross_norm(z + attended)
        z = z + self.token_mlp(z)
        scores = self.head(z).squeeze(-1).float()
        return scores.masked_fill(~is_av, float("-inf"))


INDEX_PERIODS = (2, 4, 8, 16, 32, 64, 128)   # sinusoids of the raw index (patch slot, frame)
FRACTION_HARMONICS = (1, 2, 3, 4)            # sinusoids of index / (count - 1) (place in clip)
POSITION_FEATURES = 2 * len(INDEX_PERIODS) + 2 * len(FRACTION_HARMONICS) + 1


def position_features(modality: torch.Tensor) -> torch.Tensor:
    """float32 [B, L, POSITION_FEATURES]: each AV token's index i within its modality (in order
    of appearance) as sin/cos(2 pi i / P) for the periods P, and its fraction f = i / (n - 1) of
    the modality's n tokens as f and sin/cos(pi h f); zeros at text and padding."""
    index = torch.zeros(modality.shape, dtype=torch.float32, device=modality.device)
    fraction = torch.zeros_like(index)
    for code in (VISUAL, AUDIO):
        mask = modality == code
        count = mask.sum(1, keepdim=True).float()
        i = (mask.cumsum(1) - 1).float()
        index = torch.where(mask, i, index)
        fraction = torch.where(mask, i / (count - 1).clamp_min(1.0), fraction)
    periods = torch.tensor(INDEX_PERIODS, dtype=torch.float32, device=modality.device)
    harmonics = torch.tensor(FRACTION_HARMONICS, dtype=torch.float32, device=modality.device)
    angle = 2 * math.pi * index[..., None] / periods
    phase = math.pi * fraction[..., None] * harmonics
    out = torch.cat([angle.sin(), angle.cos(), phase.sin(), phase.cos(), fraction[..., None]], -1)
    is_av = (modality == VISUAL) | (modality == AUDIO)
    return out.masked_fill(~is_av[..., None], 0.0)


def _first_decoder_layer(llm):
    decoder = llm.get_decoder() if hasattr(llm, "get_decoder") else getattr(llm, "model", llm)
    layers = getattr(decoder, "layers", None)
    if not layers:
        raise ValueError(f"cannot find decoder layers in {type(llm).__name__} to initialise "
                         "the policy from; pass init_from_llm=False")
    return layers[0]


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _count_main(argv=None):
    from transformers import AutoModelForCausalLM


    parser = argparse.ArgumentParser(
        prog="python -m avex.policy",
        description="Count the policy's parameters at a backbone's dimensions (no weights).")
    parser.add_argument("--backbone", default="qwen2-7b",
                        help=f"one of {sorted(BACKBONES)} or a path to a Hugging Face config")
    parser.add_argument("--hidden-size", type=int, default=None,
                        help="policy width; default: the LLM's width (first block from the LLM)")
    args = parser.parse_args(argv)
    try:  # a bad flag is a usage error, before any model is built
        _checks.optional_int_at_least("hidden_size", args.hidden_size, 1)
        config = backbone_config(args.backbone)
    except (ValueError, TypeError, OSError) as err:
        parser.error(str(err))
    with torch.device("meta"):
        llm = AutoModelForCausalLM.from_config(config)
        policy = AVEXPolicy.from_llm(llm, hidden_size=args.hidden_size, init_from_llm=False)
    count = parameter_count(policy)
    print(f"backbone {args.backbone}: LLM width {config.hidden_size}, policy width "
          f"{policy.config.hidden_size} -> {count / 1e6:.1f}M trainable parameters")
    print(asdict(policy.config))
    return count


if __name__ == "__main__":
    _count_main()
