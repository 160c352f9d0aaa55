"""The settings of ``python -m avex.profiling`` (:class:`ProfileSettings`, checked before any
model is built) and the token layout they describe."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from avex import _checks
from avex.backbones import backbone_config
from avex.modality import AUDIO, TEXT, VISUAL
from avex.set_selection import check_rule

from . import flops as F
from .methods import PROFILED

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
FLOPS_COUNTERS = ("auto", "fvcore", "hand")
PAPER_POLICY_WIDTH = 768


@dataclass
class ProfileSettings:
    backbone: str = "qwen2-7b"
    retention: float = 0.4
    methods: tuple = PROFILED
    visual_tokens: int = 256
    audio_tokens: int = 64
    # "<|im_start|>system ... user" before the AV tokens, the instruction and the assistant
    # header after them: 24 text tokens, as a Qwen2 chat prompt around "Describe the audio and
    # visual content of the video in detail." tokenizes to
    text_before: int = 6
    text_after: int = 18
    decode_tokens: int = 64
    device: str = "auto"
    dtype: str = "auto"
    policy_hidden_size: int = PAPER_POLICY_WIDTH
    # the policy's selection rule, as PolicyConfig has it: "topk" (redundancy 0) or
    # "set-aware" (redundancy > 0; the default training recipe serves set-aware at 4)
    selection: str = "topk"
    redundancy: float = 0.0
    runs: int | None = None
    warmup: int | None = None
    latency: bool = True
    full_size_latency: bool | None = None   # None: real size on CUDA, scaled on CPU
    # "auto": fvcore where installed, else the hand count; "fvcore": fvcore or an error up
    # front; "hand": the hand count (no tracing: instant at any size)
    flops: str = "auto"
    # stop starting timing rounds once this many seconds have passed since the run began (at
    # least one round; the table says how many ran): one bounded call on a lent GPU
    max_seconds: float | None = None
    # None: runs/profiling-<date-time> (results/ holds the committed tables, replaced only when
    # asked for by name)
    out_dir: str | None = None
    name: str | None = None
    progress: bool = True
    extra: dict = field(default_factory=dict)

    def validate(self):
        _checks.text("backbone", self.backbone)
        _checks.ratio("retention", self.retention)
        if isinstance(self.methods, str) or not isinstance(self.methods, (tuple, list)):
            raise TypeError(f"methods must be a tuple of method names, got {self.methods!r}")
        for name in ("visual_tokens", "audio_tokens", "text_before", "text_after",
                     "policy_hidden_size"):
            _checks.int_at_least(name, getattr(self, name), 0)
        _checks.int_at_least("decode_tokens", self.decode_tokens, 1)
        _checks.optional_int_at_least("runs", self.runs, 1)
        _checks.optional_int_at_least("warmup", self.warmup, 0)
        _checks.device("device", self.device)
        _checks.flag("latency", self.latency)
        _checks.flag("progress", self.progress)
        if self.full_size_latency is not None:
            _checks.flag("full_size_latency", self.full_size_latency)
        _checks.choice("flops", self.flops, FLOPS_COUNTERS)
        check_rule(self.selection, self.redundancy)   # as PolicyConfig checks it
        if self.max_seconds is not None:
            _checks.positive_float("max_seconds", self.max_seconds)
        if self.flops == "fvcore" and F.fvcore_missing():
            raise ValueError(f"flops='fvcore' but {F.fvcore_missing()}; or pass flops='hand'")
        if self.out_dir is not None:
            _checks.output_dir("out_dir", self.out_dir)
        if _checks.text("name", self.name, optional=True) is not None and (
                os.sep in self.name or self.name in (".", "..")):
            raise ValueError(f"name is a file stem (profiling-<name>.md), not a path; got "
                             f"{self.name!r}")
        if not isinstance(self.extra, dict):
            raise TypeError(f"extra must be a dict, got {type(self.extra).__name__}")
        if not self.methods:
            raise ValueError(f"methods: none given; available: {list(PROFILED)}")
        for m in self.methods:
            if m not in PROFILED:
                raise ValueError(f"methods: unknown method {m!r}; available: {list(PROFILED)}")
        if len(set(self.methods)) != len(self.methods):
            raise ValueError(f"methods: a method is listed twice: {list(self.methods)}")
        if self.visual_tokens + self.audio_tokens == 0:
            raise ValueError("visual_tokens + audio_tokens must be > 0, got 0")
        if self.text_before + self.text_after == 0:   # every prompt holds text (modality.py)
            raise ValueError("text_before + text_after (--text-before, --text-after) must be "
                             ">= 1: a prompt has at least one text token; got 0 + 0")
        if self.dtype not in ("auto", *DTYPES):
            raise ValueError(f"dtype must be one of {['auto', *DTYPES]}, got {self.dtype!r}")
        config = backbone_config(self.backbone)   # raises ValueError naming the backbone
        self._check_length(config.max_position_embeddings)

    def _check_length(self, limit: int):
        """The prompt and its forced decode fit the backbone's positions."""
        prompt = (self.text_before + self.visual_tokens + self.audio_tokens
                  + self.text_after)
        if prompt + self.decode_tokens > limit:
            raise ValueError(
                f"the prompt ({prompt} tokens: text_before {self.text_before} + visual_tokens "
                f"{self.visual_tokens} + audio_tokens {self.audio_tokens} + text_after "
                f"{self.text_after}) + decode_tokens {self.decode_tokens} = "
                f"{prompt + self.decode_tokens} positions, over the max_position_embeddings "
                f"{limit} of backbone {self.backbone!r}")


def token_layout(s: ProfileSettings) -> torch.Tensor:
    """modality [1, L]: text, Nv visual, Na audio, text (batch 1)."""
    codes = ([TEXT] * s.text_before + [VISUAL] * s.visual_tokens + [AUDIO] * s.audio_tokens
             + [TEXT] * s.text_after)
    return torch.tensor([codes])
