"""The policy's sizes (:class:`PolicyConfig`): what ``AVEXPolicy(config)`` builds, and what a
saved policy's ``config.json`` records beside what it was trained on (:mod:`avex.policy.saved`)."""
from __future__ import annotations

from dataclasses import dataclass

from avex import _checks
from avex.merging import check_merge_threshold
from avex.set_selection import check_rule


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
    # the retention rho as an input of the score head (rho and ln rho, projected and added to
    # the head's hidden units), so that one policy can rank tokens otherwise at 10% than at
    # 50%; the projection starts at zero. Records from before the setting read as False.
    retention_input: bool = False
    # serving folds each dropped AV token into the kept token of its modality it is most like
    # (cosine >= this; avex.merging); None: no merging. Records from before read as None.
    merge_threshold: float | None = None

    def __post_init__(self):
        _checks.int_at_least("input_size", self.input_size, 1)
        _checks.int_at_least("hidden_size", self.hidden_size, 1)
        _checks.int_at_least("num_heads", self.num_heads, 1)
        _checks.int_at_least("num_layers", self.num_layers, 1)
        _checks.optional_int_at_least("num_kv_heads", self.num_kv_heads, 1)
        _checks.optional_int_at_least("intermediate_size", self.intermediate_size, 1)
        _checks.flag("qkv_bias", self.qkv_bias)
        _checks.flag("retention_input", self.retention_input)
        _checks.positive_float("norm_eps", self.norm_eps)
        self.redundancy = check_rule(self.selection, self.redundancy)
        self.merge_threshold = check_merge_threshold("merge_threshold", self.merge_threshold)
        self.num_kv_heads = self.num_kv_heads or self.num_heads
        self.intermediate_size = self.intermediate_size or 3 * self.hidden_size
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by num_heads "
                             f"({self.num_heads})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be divisible by num_kv_heads "
                             f"({self.num_kv_heads})")
