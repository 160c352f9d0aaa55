"""Efficiency suite (imported as ``avex.profiling``): FLOPs, prefill / end-to-end latency,
selection overhead and peak memory, in the columns of the paper's Table 4, for full tokens,
AVEX-Prune and the FastV-AV, ToMe-AV and FastAV baselines (:mod:`avex.profiling.methods`).

``python -m avex.profiling --backbone qwen2-7b --retention 0.4`` writes a Markdown table, a JSON
file and a bar chart. :func:`profile` is the same from Python. FLOPs use fvcore's convention
(one multiply-add = one flop); see :mod:`avex.profiling.flops`.
"""
from .settings import ProfileSettings, token_layout
from .suite import profile, scaled_config

__all__ = ["ProfileSettings", "profile", "scaled_config", "token_layout"]
