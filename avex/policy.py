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
import json
import math
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from avex import __version__, _checks
from avex.backbones import BACKBONES, backbone_config
from avex.files import (cpu_state_dict, load_weights, save_tensors_atomically,
                        write_json_atomically)
from avex.modality import AUDIO, PAD, TEXT, VISUAL, check_code_values
from avex.set_selection import SELECTIONS, select_indices


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
    # how the scores become a kept set (avex.set_selection): "topk" (the K best scores) or
    # "set-aware" (K picks in turn, each discounting tokens like the ones picked by
    # redundancy x their cosine in the head's input). Saved with the policy, so serving
    # selects as training did; records from before the setting read as "topk".
    selection: str = "topk"
    redundancy: float = 0.0               # beta of "set-aware"; 0 with "topk"

    def __post_init__(self):
        _checks.int_at_least("input_size", self.input_size, 1)
        _checks.int_at_least("hidden_size", self.hidden_size, 1)
        _checks.int_at_least("num_heads", self.num_heads, 1)
        _checks.int_at_least("num_layers", self.num_layers, 1)
        _checks.optional_int_at_least("num_kv_heads", self.num_kv_heads, 1)
        _checks.optional_int_at_least("intermediate_size", self.intermediate_size, 1)
        _checks.flag("qkv_bias", self.qkv_bias)
        _checks.positive_float("norm_eps", self.norm_eps)
        _checks.choice("selection", self.selection, SELECTIONS)
        self.redundancy = _checks.real("redundancy", self.redundancy, low=0)
        if self.selection == "topk" and self.redundancy != 0:
            raise ValueError(f"redundancy = {self.redundancy!r} has no effect with selection "
                             "'topk'; use selection 'set-aware' or redundancy 0")
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
        # what it was trained on (TrainedOn); set by training and from_pretrained
        self.trained_on: TrainedOn | None = None
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
                 init_from_llm: bool = True, positional: bool = True,
                 selection: str = "topk", redundancy: float = 0.0) -> "AVEXPolicy":
        """A policy for a Hugging Face causal LM.

        With ``hidden_size`` None or equal to the LLM's width, the blocks take the LLM's layer
        shapes and the first one copies the LLM's first decoder layer (``init_from_llm``).
        A smaller ``hidden_size`` gives a compact policy with input projections, randomly
        initialised. ``selection`` and ``redundancy``: :class:`PolicyConfig`'s.
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
            norm_eps=getattr(c, "rms_norm_eps", 1e-6), positional=positional,
            selection=selection, redundancy=redundancy)
        policy = cls(cfg)
        if matched and init_from_llm:
            policy.encoder[0].load_state_dict(_first_decoder_layer(llm).state_dict(),
                                              strict=False)
        return policy

    def forward(self, inputs_embeds: torch.Tensor, modality: torch.Tensor, *,
                with_hidden: bool = False):
        """Keep scores [B, L] (float32): finite at audio/visual positions, -inf elsewhere;
        with ``with_hidden``, (scores, hidden [B, L, hidden_size]): each token's input to the
        score head, what set-aware selection compares tokens by.

        Every position goes through the network (text and padding are scored, then
        discarded): the training path, kept as it was so that trained policies reproduce.
        Inference reads only what the scores depend on: :meth:`score`."""
        self._check_inputs(inputs_embeds, modality)
        _checks.flag("with_hidden", with_hidden)
        is_av = (modality == VISUAL) | (modality == AUDIO)
        scores, hidden = self._encode(inputs_embeds, modality, inputs_embeds, modality == TEXT)
        scores = scores.masked_fill(~is_av, float("-inf"))
        return (scores, hidden) if with_hidden else scores

    def select(self, scores: torch.Tensor, hidden: torch.Tensor | None, budget: torch.Tensor,
               *, tau: float = 1.0, seed: int = 0, sample: bool = False,
               log_prob: bool = False):
        """The kept tokens of AV-axis ``scores`` [B, M] (and ``hidden`` [B, M, D], read by
        set-aware selection) under this policy's ``config.selection``: (indices [B, Kmax] in
        pick order, -1 past a row's ``budget``; log-probability [B] or None).
        ``sample=False`` is the inference path (:func:`avex.set_selection.select_indices`)."""
        return select_indices(self.config.selection, scores, hidden, budget,
                              redundancy=self.config.redundancy, tau=tau, seed=seed,
                              sample=sample, log_prob=log_prob)

    @property
    def set_aware(self) -> bool:
        """Whether the kept set depends on the hidden states too (``selection`` 'set-aware')."""
        return self.config.selection == "set-aware"

    @torch.no_grad()
    def score(self, inputs_embeds: torch.Tensor, modality: torch.Tensor, *,
              with_hidden: bool = False):
        """:meth:`forward`'s scores (and hidden states, ``with_hidden``), computed on what they
        depend on only: each row's AV tokens (the encoder's tokens) and its text (the
        cross-attention's keys) are gathered first,
        packed to the left, so the network runs on [B, M] and [B, T] instead of [B, L]. The
        inference path (serving, evaluation, profiling); it equals :meth:`forward` to float
        rounding, with the same Top-K (tests/test_policy.py). Inputs of another layout than
        the policy was trained on are refused (:meth:`check_inputs`)."""
        self.check_inputs(inputs_embeds, modality)
        is_av = (modality == VISUAL) | (modality == AUDIO)
        is_text = modality == TEXT
        _checks.flag("with_hidden", with_hidden)
        if not bool(is_text.any(1).all()):  # forward lets a row without text read every position
            return self.forward(inputs_embeds, modality, with_hidden=with_hidden)
        av_at, av_valid = _packed(is_av)
        text_at, text_valid = _packed(is_text)
        rows = torch.arange(modality.shape[0], device=modality.device)[:, None]
        av_codes = modality[rows, av_at].masked_fill(~av_valid, PAD)
        av_scores, av_hidden = self._encode(inputs_embeds[rows, av_at], av_codes,
                                            inputs_embeds[rows, text_at], text_valid)
        out = torch.full(modality.shape, float("-inf"), dtype=torch.float32,
                         device=modality.device)
        row, col = torch.nonzero(av_valid, as_tuple=True)
        out[row, av_at[row, col]] = av_scores[row, col]
        if not with_hidden:
            return out
        hidden = av_hidden.new_zeros(*modality.shape, av_hidden.shape[-1])
        hidden[row, av_at[row, col]] = av_hidden[row, col]
        return out, hidden

    def _check_inputs(self, inputs_embeds, modality) -> None:
        _checks.tensor("inputs_embeds", inputs_embeds, ndim=3, floating=True)
        _checks.tensor("modality", modality, ndim=2, integer=True)
        if modality.shape != inputs_embeds.shape[:2]:
            raise ValueError(f"modality has shape {list(modality.shape)} but inputs_embeds is "
                             f"{list(inputs_embeds.shape)}; expected [B, L] = "
                             f"{list(inputs_embeds.shape[:2])}")
        if inputs_embeds.shape[-1] != self.config.input_size:
            raise ValueError(f"inputs_embeds has width {inputs_embeds.shape[-1]}, the policy "
                             f"expects input_size={self.config.input_size}")
        own = self.modality_embedding.weight.device
        for name, value in (("inputs_embeds", inputs_embeds), ("modality", modality)):
            if value.device != own:
                raise ValueError(f"{name} is on {value.device} but the policy is on {own}; "
                                 "move one to the other (policy.to(device))")
        check_code_values("modality", modality)

    def _encode(self, tokens, codes, text, text_mask):
        """(float32 scores [B, N], hidden [B, N, hidden_size]: the score head's input) of
        ``tokens`` [B, N, D] (modality ``codes`` [B, N]; only AV tokens are encoded as keys,
        the others' outputs are meaningless) conditioned on the ``text`` [B, T, D] where
        ``text_mask`` [B, T]."""
        is_av = (codes == VISUAL) | (codes == AUDIO)
        # rows without any key of a kind attend to everything: their outputs are discarded
        av_keys = is_av | ~is_av.any(dim=1, keepdim=True)
        text_keys = text_mask | ~text_mask.any(dim=1, keepdim=True)

        # the policy trains in its own dtype (float32 by default), whatever the LLM runs in
        dtype = self.modality_embedding.weight.dtype
        z = self.av_in(tokens.to(dtype)) + self.modality_embedding((codes == AUDIO).long())
        if self.config.positional:
            features = position_features(codes).to(z.dtype)
            is_audio = (codes == AUDIO)[..., None]
            z = z + self.position_in(torch.cat([features.masked_fill(is_audio, 0.0),
                                                features.masked_fill(~is_audio, 0.0)], -1))
        for block in self.encoder:
            z = block(z, av_keys)
        z = self.encoder_norm(z)
        text = self.text_norm(self.text_in(text.to(dtype)))
        attended, _ = self.cross_attn(z, text, text, key_padding_mask=~text_keys,
                                      need_weights=False)
        z = self.cross_norm(z + attended)
        z = z + self.token_mlp(z)
        return self.head(z).squeeze(-1).float(), z

    # -- what it was trained on -----------------------------------------------------------------
    def check_inputs(self, inputs_embeds: torch.Tensor, modality: torch.Tensor) -> None:
        """Refuse inputs the policy can't score: a width other than its input size, codes
        outside :mod:`avex.modality`, and (when it records what it was trained on) a row laid
        out otherwise than its training data (:func:`layout_of`)."""
        self._check_inputs(inputs_embeds, modality)
        if self.trained_on is not None:
            self.trained_on.check_layout(modality)

    def check_model(self, model) -> None:
        """Refuse a model other than the one the policy was trained with (its model type and
        hidden size, as recorded); a policy without a record is refused too."""
        if self.trained_on is None:
            raise ValueError("this policy records nothing of what it was trained on, so it "
                             "can't be checked against model; load it with avex.load_policy "
                             "or AVEXPolicy.from_pretrained")
        self.trained_on.check_model(model)

    def save_pretrained(self, path) -> Path:
        """Write the policy to directory ``path``: ``config.json`` (its sizes and what it was
        trained on) and ``model.safetensors``; :meth:`from_pretrained` reads it back."""
        if self.trained_on is None:
            raise ValueError("save_pretrained: the policy records nothing of what it was "
                             "trained on (policy.trained_on is None); set it to a TrainedOn, "
                             "or save the policy of a python -m avex.train run (avex.load_policy)")
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise ValueError(f"save_pretrained: path {str(path)!r} is a file, not a directory")
        path.mkdir(parents=True, exist_ok=True)
        save_tensors_atomically(path / POLICY_WEIGHTS, cpu_state_dict(self),
                                metadata={"format": "pt"})
        write_json_atomically(path / POLICY_CONFIG, policy_record(self.config, self.trained_on),
                              indent=2)
        return path

    @classmethod
    def from_pretrained(cls, path, *, model=None, device=None) -> "AVEXPolicy":
        """The policy :meth:`save_pretrained` wrote to ``path``, in eval mode. With ``model``,
        the model it will serve is checked against the record first (:meth:`check_model`)."""
        path = Path(path)
        cfg, trained_on = read_policy_record(path / POLICY_CONFIG)
        if not (path / POLICY_WEIGHTS).is_file():
            raise FileNotFoundError(f"{path}: no {POLICY_WEIGHTS} beside {POLICY_CONFIG}")
        if model is not None:
            trained_on.check_model(model)
        policy = cls(cfg)
        load_weights(policy, path / POLICY_WEIGHTS)
        policy.trained_on = trained_on
        return policy.to(device or "cpu").eval()


def _packed(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions [B, W], valid [B, W]): each row's True positions in order, packed to the
    left (W = the most any row has, at least 1); past a row's count the position is 0."""
    counts = mask.sum(1)
    width = max(int(counts.max()), 1) if mask.shape[0] else 1
    order = torch.sort((~mask).to(torch.int8), dim=1, stable=True).indices[:, :width]
    valid = torch.arange(width, device=mask.device) < counts[:, None]
    return order.masked_fill(~valid, 0), valid


# ----------------------------------------------------------------------------------------------
# What a policy was trained on, and the layout rule
# ----------------------------------------------------------------------------------------------

POLICY_FORMAT = "avex-policy"
POLICY_FORMAT_VERSION = 1
POLICY_CONFIG = "config.json"
POLICY_WEIGHTS = "model.safetensors"

#: How a row's audio-visual tokens are laid out, from the order of its modality runs (text in
#: between ignored). Serving must keep the layout training saw: the policy's position features
#: count each token's place within its modality, and the frozen LLM reads the same sequence.
LAYOUTS = {
    "visual": "visual tokens only",
    "audio": "audio tokens only",
    "visual-then-audio": "all visual tokens, then all audio tokens (VideoLLaMA 2, the "
                         "embedded benchmark)",
    "audio-then-visual": "all audio tokens, then all visual tokens",
    "interleaved": "visual and audio tokens alternating in chunks (Qwen2.5-Omni with "
                   "use_audio_in_video)",
}
#: layout a policy was trained on -> the row layouts it scores (a row may lack a modality)
ACCEPTED_LAYOUTS = {
    "visual": {"visual"},
    "audio": {"audio"},
    "visual-then-audio": {"visual", "audio", "visual-then-audio"},
    "audio-then-visual": {"visual", "audio", "audio-then-visual"},
    "interleaved": set(LAYOUTS),
}


def row_layouts(modality: torch.Tensor) -> list:
    """The layout (a key of :data:`LAYOUTS`) of each row of modality codes [B, L]; None for a
    row without audio-visual tokens."""
    _checks.tensor("modality", modality, ndim=2, integer=True)
    is_av = (modality == VISUAL) | (modality == AUDIO)
    at, valid = _packed(is_av)
    codes = modality.gather(1, at)
    changes = ((codes[:, 1:] != codes[:, :-1]) & valid[:, 1:]).sum(1)
    names = []
    for first, runs, any_av in zip(codes[:, 0].tolist(), (changes + 1).tolist(),
                                   valid[:, 0].tolist()):
        if not any_av:
            names.append(None)
        elif runs == 1:
            names.append("visual" if first == VISUAL else "audio")
        elif runs == 2:
            names.append("visual-then-audio" if first == VISUAL else "audio-then-visual")
        else:
            names.append("interleaved")
    return names


def layout_of(rows) -> str:
    """The narrowest layout of :data:`LAYOUTS` that accepts every one of ``rows`` (row layouts
    from :func:`row_layouts`; None entries are ignored)."""
    seen = {name for name in rows if name is not None}
    if not seen:
        raise ValueError("no row has an audio-visual token, so there is no layout to record")
    for name in LAYOUTS:
        if seen <= ACCEPTED_LAYOUTS[name]:
            return name
    raise AssertionError(seen)  # "interleaved" accepts every layout


@dataclass(frozen=True)
class TrainedOn:
    """What a policy was trained on, recorded in its artifact: the frozen LLM's model type and
    hidden size, the layout of its training sequences (:data:`LAYOUTS`) and the retention range
    of its training."""
    model_type: str
    hidden_size: int
    layout: str
    retention_range: tuple

    def __post_init__(self):
        _checks.text("model_type", self.model_type)
        _checks.int_at_least("hidden_size", self.hidden_size, 1)
        _checks.choice("layout", self.layout, tuple(LAYOUTS))
        span = self.retention_range
        if not isinstance(span, (list, tuple)) or len(span) != 2:
            raise ValueError(f"retention_range must be [low, high], got {span!r}")
        low = _checks.ratio("retention_range[0]", span[0])
        high = _checks.ratio("retention_range[1]", span[1])
        if low > high:
            raise ValueError(f"retention_range must be [low, high] with low <= high, got "
                             f"{list(self.retention_range)}")
        object.__setattr__(self, "retention_range", (float(low), float(high)))

    @classmethod
    def of_model(cls, model, layout: str, retentions) -> "TrainedOn":
        """The record for a policy trained with the frozen LLM ``model`` on ``layout``, at
        ``retentions`` (the retention(s) training drew from)."""
        retentions = list(retentions)
        return cls(model.config.model_type, model.config.get_text_config().hidden_size, layout,
                   (min(retentions), max(retentions)))

    def to_dict(self) -> dict:
        return {"model_type": self.model_type, "hidden_size": self.hidden_size,
                "layout": self.layout, "retention_range": list(self.retention_range)}

    def check_model(self, model) -> None:
        config = getattr(model, "config", None)
        kind = getattr(config, "model_type", None)
        if kind is None or not hasattr(config, "get_text_config"):
            raise TypeError(f"model must be a Hugging Face model (with a config), got "
                            f"{type(model).__name__}")
        differ = []
        if kind != self.model_type:
            hint = (" (pass model.thinker, the part that reads the prompt)"
                    if kind == "qwen2_5_omni" and self.model_type == "qwen2_5_omni_thinker"
                    else "")
            differ.append(f"model type {kind!r}, the policy was trained with "
                          f"{self.model_type!r}{hint}")
        hidden = config.get_text_config().hidden_size
        if hidden != self.hidden_size:
            differ.append(f"hidden size {hidden}, the policy was trained with {self.hidden_size}")
        if differ:
            raise ValueError(f"the policy was trained with another model: {type(model).__name__} "
                             f"has {'; '.join(differ)}")

    def check_layout(self, modality: torch.Tensor) -> None:
        accepted = ACCEPTED_LAYOUTS[self.layout]
        for row, name in enumerate(row_layouts(modality)):
            if name is not None and name not in accepted:
                raise ValueError(
                    f"modality row {row} is laid out as {name!r} ({LAYOUTS[name]}), but the "
                    f"policy was trained on {self.layout!r} ({LAYOUTS[self.layout]}); serve "
                    "with the layout of the training data (the same processor settings, e.g. "
                    "use_audio_in_video)")

    def check_retention(self, retention: float) -> None:
        """Warn (once per call site) when ``retention`` lies outside the trained range: the
        scores don't depend on it, but the policy was never rewarded there."""
        low, high = self.retention_range
        if not low - 1e-9 <= retention <= high + 1e-9:
            warnings.warn(f"retention={retention:g} lies outside the range the policy was "
                          f"trained at ({low:g}-{high:g}); its Top-K there is untested",
                          stacklevel=3)


def policy_record(cfg: PolicyConfig, trained_on: TrainedOn) -> dict:
    """The JSON of a saved policy's config.json."""
    return {"format": POLICY_FORMAT, "version": POLICY_FORMAT_VERSION,
            "avex_version": __version__, "policy": asdict(cfg),
            "trained_on": trained_on.to_dict()}


def read_policy_record(path) -> tuple[PolicyConfig, TrainedOn]:
    """(PolicyConfig, TrainedOn) of a policy's config.json; refused, naming the file, when it
    isn't one."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path.parent}: not a saved AVEX policy (no {path.name}); "
                                "save one with AVEXPolicy.save_pretrained or pass a "
                                "python -m avex.train run directory to avex.load_policy")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise ValueError(f"{path}: corrupt or truncated ({err})") from None
    if not isinstance(raw, dict) or raw.get("format") != POLICY_FORMAT:
        got = raw.get("format") if isinstance(raw, dict) else type(raw).__name__
        raise ValueError(f"{path}: 'format' must be {POLICY_FORMAT!r} (a saved AVEX policy), "
                         f"got {got!r}")
    if raw.get("version") != POLICY_FORMAT_VERSION:
        raise ValueError(f"{path}: policy format version {raw.get('version')!r} is not "
                         f"supported (this avex reads version {POLICY_FORMAT_VERSION})")
    try:
        cfg = PolicyConfig(**raw["policy"])
        trained_on = TrainedOn(**raw["trained_on"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path}: bad policy record ({type(err).__name__}: {err})") from None
    return cfg, trained_on


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
