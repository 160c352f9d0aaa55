"""AVEX-Prune kernels: each op is a Triton implementation with a PyTorch reference beside it.

CUDA tensors go to Triton, CPU tensors to the reference; every op takes ``backend=`` to force
either (the Triton path on a CPU needs ``TRITON_INTERPRET=1`` set before this import).
"""
from .compact import Compacted, compact
from .exchange import EXCHANGE_TYPES, Exchanges, build_exchanges
from .gumbel_topk import gumbel_topk, plackett_luce_log_prob

__all__ = ["gumbel_topk", "plackett_luce_log_prob", "build_exchanges", "Exchanges",
           "EXCHANGE_TYPES", "compact", "Compacted"]
