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

With ``retention_input`` (off by default), the retention rho the set is chosen for is an input
too: ``W [rho, ln rho]`` is added to the score head's hidden units before their GELU, W starting
at zero. The hidden states that set-aware selection compares stay free of it. The warmup, whose
target serves every retention, runs without it (``retention=None`` in
:meth:`AVEXPolicy.forward`); RL and every inference path pass the retention.
"""
from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from avex import _checks
from avex.merging import merge_dropped
from avex.modality import (AUDIO, PAD, TEXT, VISUAL, check_code_values, packed_positions,
                           signed_codes)
from avex.policy.config import PolicyConfig
from avex.policy.saved import TrainedOn, load_saved_policy, save_policy
from avex.set_selection import select_indices


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
        if cfg.retention_input:
            # zeros, drawn from no RNG: the policy starts (and initialises its other weights)
            # as one without the input does
            self.retention_in = nn.Parameter(torch.zeros(width, RETENTION_FEATURES))

    @classmethod
    def from_llm(cls, llm, *, hidden_size: int | None = None, num_layers: int = 2,
                 init_from_llm: bool = True, init_layers: int = 1, positional: bool = True,
                 selection: str = "topk", redundancy: float = 0.0,
                 retention_input: bool = False,
                 merge_threshold: float | None = None) -> "AVEXPolicy":
        """A policy for a Hugging Face causal LM.

        With ``hidden_size`` None or equal to the LLM's width, the blocks take the LLM's layer
        shapes and the first ``init_layers`` of them copy the LLM's first decoder layers
        (``init_from_llm``; 0 copies none, and more than 1 needs the policy as wide as the LLM).
        A smaller ``hidden_size`` gives a compact policy with input projections, randomly
        initialised. ``selection``, ``redundancy``, ``retention_input`` and
        ``merge_threshold``: :class:`PolicyConfig`'s.
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
            selection=selection, redundancy=redundancy, retention_input=retention_input,
            merge_threshold=merge_threshold)
        if isinstance(init_layers, bool) or not isinstance(init_layers, int) \
                or not 0 <= init_layers <= num_layers:
            raise ValueError(f"init_layers must be an int in [0, {num_layers}] (the policy's "
                             f"blocks), got {init_layers!r}")
        copied = init_layers if init_from_llm else 0
        if copied > 1 and not matched:
            raise ValueError(f"init_layers = {init_layers} copies the LLM's decoder layers, so "
                             f"the policy must be as wide as the LLM ({c.hidden_size}), not "
                             f"{width}; use hidden_size None or init_layers <= 1")
        # the random init is drawn in full first, so copying leaves every other weight as it is
        policy = cls(cfg)
        if matched and copied:
            layers = _decoder_layers(llm)
            if copied > len(layers):
                raise ValueError(f"init_layers = {init_layers}, but {type(llm).__name__} has "
                                 f"{len(layers)} decoder layer(s)")
            for block, layer in zip(policy.encoder[:copied], layers):
                block.load_state_dict(layer.state_dict(), strict=False)
        return policy

    def forward(self, inputs_embeds: torch.Tensor, modality: torch.Tensor, *,
                retention=None, with_hidden: bool = False):
        """Keep scores [B, L] (float32): finite at audio/visual positions, -inf elsewhere;
        with ``with_hidden``, (scores, hidden [B, L, hidden_size]): each token's input to the
        score head before the retention term, what set-aware selection compares tokens by.

        ``retention``: the rho the scores are for, one number or one per row (a list or a 1-D
        tensor); read only with ``config.retention_input``, where None leaves the retention
        term out (the warmup's path).

        Every position goes through the network (text and padding are scored, then
        discarded): the training path, kept as it was so that trained policies reproduce.
        Inference reads only what the scores depend on: :meth:`score`."""
        self._check_inputs(inputs_embeds, modality)
        modality = signed_codes(modality)
        _checks.flag("with_hidden", with_hidden)
        rho = self._row_retention(retention, modality.shape[0], modality.device)
        is_av = (modality == VISUAL) | (modality == AUDIO)
        scores, hidden = self._encode(inputs_embeds, modality, inputs_embeds, modality == TEXT,
                                      rho)
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

    def merge(self, inputs_embeds: torch.Tensor, modality: torch.Tensor, keep: torch.Tensor,
              *, groups: torch.Tensor | None = None) -> torch.Tensor:
        """``inputs_embeds`` [B, L, D] as this policy serves the keep-set ``keep`` [B, L]: the
        dropped AV tokens folded into the kept ones they duplicate
        (:func:`avex.merging.merge_dropped` at ``config.merge_threshold``), or unchanged where
        the policy has no merge threshold."""
        if self.config.merge_threshold is None:
            return inputs_embeds
        return merge_dropped(inputs_embeds, modality, keep, self.config.merge_threshold,
                             groups=groups)

    @torch.no_grad()
    def score(self, inputs_embeds: torch.Tensor, modality: torch.Tensor, *, retention=None,
              with_hidden: bool = False):
        """:meth:`forward`'s scores (and hidden states, ``with_hidden``), computed on what they
        depend on only: each row's AV tokens (the encoder's tokens) and its text (the
        cross-attention's keys) are gathered first,
        packed to the left, so the network runs on [B, M] and [B, T] instead of [B, L]. The
        inference path (serving, evaluation, profiling); it equals :meth:`forward` to float
        rounding, with the same Top-K (tests/test_policy.py). Inputs of another layout than
        the policy was trained on are refused (:meth:`check_inputs`), and non-finite scores
        that come from a token's embedding name it (padding is never read). A policy with
        ``config.retention_input`` needs ``retention`` (one rho, or one per row) here."""
        self.check_inputs(inputs_embeds, modality)
        modality = signed_codes(modality)
        is_av = (modality == VISUAL) | (modality == AUDIO)
        is_text = modality == TEXT
        _checks.flag("with_hidden", with_hidden)
        if self.config.retention_input and retention is None:
            raise ValueError("retention is required: this policy takes the retention as an "
                             "input (retention_input); pass the rho it selects for, e.g. "
                             "retention=0.2, or one per row")
        rho = self._row_retention(retention, modality.shape[0], modality.device)
        if not bool(is_text.any(1).all()):  # forward lets a row without text read every position
            # (padding zeroed: its NaN would reach the row's scores through 0 * NaN)
            got = self.forward(inputs_embeds.masked_fill((modality == PAD)[..., None], 0),
                               modality, retention=retention, with_hidden=with_hidden)
            return _finite_or_named(got, inputs_embeds, modality, is_av)
        av_at, av_valid = packed_positions(is_av)
        text_at, text_valid = packed_positions(is_text)
        rows = torch.arange(modality.shape[0], device=modality.device)[:, None]
        av_codes = modality[rows, av_at].masked_fill(~av_valid, PAD)
        # the slots past a row's count read position 0 (padding, or another kind of token):
        # zeroed, so that masked keys weigh 0 * 0 and not 0 * NaN in attention
        av_scores, av_hidden = self._encode(
            inputs_embeds[rows, av_at].masked_fill(~av_valid[..., None], 0), av_codes,
            inputs_embeds[rows, text_at].masked_fill(~text_valid[..., None], 0), text_valid, rho)
        out = torch.full(modality.shape, float("-inf"), dtype=torch.float32,
                         device=modality.device)
        row, col = torch.nonzero(av_valid, as_tuple=True)
        out[row, av_at[row, col]] = av_scores[row, col]
        if not with_hidden:
            return _finite_or_named(out, inputs_embeds, modality, is_av)
        hidden = av_hidden.new_zeros(*modality.shape, av_hidden.shape[-1])
        hidden[row, av_at[row, col]] = av_hidden[row, col]
        return _finite_or_named((out, hidden), inputs_embeds, modality, is_av)

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

    def _row_retention(self, retention, rows: int, device) -> torch.Tensor | None:
        """float32 [rows]: ``retention`` checked, one rho in (0, 1] per row; None without
        ``config.retention_input`` (the policy does not read it) or without a retention."""
        if retention is None:
            return None
        if isinstance(retention, torch.Tensor):
            if retention.dim() > 1 or retention.is_complex() or retention.dtype == torch.bool:
                raise ValueError(f"retention must be a number in (0, 1] or a 1-D tensor of "
                                 f"them, one per row, got a {retention.dtype} tensor of shape "
                                 f"{list(retention.shape)}")
            retention = retention.tolist()
        if isinstance(retention, (list, tuple)):
            if len(retention) != rows:
                raise ValueError(f"retention holds {len(retention)} values but the batch has "
                                 f"{rows} rows; pass one per row, or one number for all")
            values = [_checks.ratio(f"retention[{b}]", r) for b, r in enumerate(retention)]
        else:
            values = [_checks.ratio("retention", retention)] * rows
        if not self.config.retention_input:
            return None
        return torch.tensor(values, dtype=torch.float32, device=device)

    def _encode(self, tokens, codes, text, text_mask, retention=None):
        """(float32 scores [B, N], hidden [B, N, hidden_size]: the score head's input before
        the retention term) of ``tokens`` [B, N, D] (modality ``codes`` [B, N]; only AV tokens
        are encoded as keys, the others' outputs are meaningless) conditioned on the ``text``
        [B, T, D] where ``text_mask`` [B, T], and on ``retention`` [B] (or None: no term)."""
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
        if retention is None:
            return self.head(z).squeeze(-1).float(), z
        norm, inner, act, out = self.head
        # a bias of the head's hidden units that depends on rho: before the GELU, so that
        # it changes which features rank a token, not only a common offset
        shift = retention_features(retention).to(z.dtype) @ self.retention_in.T   # [B, width]
        return out(act(inner(norm(z)) + shift[:, None, :])).squeeze(-1).float(), z

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
        trained on) and ``model.safetensors`` (:func:`avex.policy.saved.save_policy`);
        :meth:`from_pretrained` reads it back."""
        return save_policy(self, path)

    @classmethod
    def from_pretrained(cls, path, *, model=None, device=None) -> "AVEXPolicy":
        """The policy :meth:`save_pretrained` wrote to ``path``, in eval mode. With ``model``,
        the model it will serve is checked against the record first (:meth:`check_model`)."""
        return load_saved_policy(cls, path, model=model, device=device)

def _finite_or_named(got, inputs_embeds, modality, is_av):
    """``got`` (scores, or (scores, hidden)) as it is; where its scores are not finite at an
    AV token, a non-finite token embedding is named (:func:`check_finite_tokens`), read only
    then: the embeddings are not scanned on every call."""
    scores = got[0] if isinstance(got, tuple) else got
    if not bool(torch.isfinite(scores[is_av]).all()):
        check_finite_tokens(inputs_embeds, modality)
    return got


def check_finite_tokens(inputs_embeds: torch.Tensor, modality: torch.Tensor) -> None:
    """Refuse NaN or inf in the embedding of a text or audio-visual token (what the policy
    reads; padding, never read, may hold anything), naming the sample, position and kind."""
    bad = ~torch.isfinite(inputs_embeds).all(-1) & (signed_codes(modality) != PAD)
    if bool(bad.any()):
        b, pos = torch.nonzero(bad)[0].tolist()
        kind = {VISUAL: "visual", AUDIO: "audio", TEXT: "text"}[int(modality[b, pos])]
        value = inputs_embeds[b, pos][~torch.isfinite(inputs_embeds[b, pos])][0].item()
        raise ValueError(f"inputs_embeds holds {value} at sample {b}, position {pos} (a {kind} "
                         "token); the policy reads every text and audio-visual token's "
                         "embedding, so they must be finite")


INDEX_PERIODS = (2, 4, 8, 16, 32, 64, 128)   # sinusoids of the raw index (patch slot, frame)
FRACTION_HARMONICS = (1, 2, 3, 4)            # sinusoids of index / (count - 1) (place in clip)
POSITION_FEATURES = 2 * len(INDEX_PERIODS) + 2 * len(FRACTION_HARMONICS) + 1


RETENTION_FEATURES = 2   # rho and ln rho


def retention_features(retention: torch.Tensor) -> torch.Tensor:
    """float32 [B, RETENTION_FEATURES]: each row's retention rho and ln rho (rho in (0, 1])."""
    rho = retention.to(torch.float32)
    return torch.stack([rho, rho.log()], -1)


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


def _decoder_layers(llm):
    decoder = llm.get_decoder() if hasattr(llm, "get_decoder") else getattr(llm, "model", llm)
    layers = getattr(decoder, "layers", None)
    if not layers:
        raise ValueError(f"cannot find decoder layers in {type(llm).__name__} to initialise "
                         "the policy from; pass init_from_llm=False")
    return layers


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


