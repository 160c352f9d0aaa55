"""Which audio-visual tokens to keep: the budget and the keep-set rules every caller shares."""
from __future__ import annotations

import torch

from avex import _checks

__all__ = ["num_kept"]


def num_kept(retention: float, num_tokens: torch.Tensor) -> torch.Tensor:
    """K = round(rho * N) per row, halves rounded up, at least 1 where N >= 1."""
    rho = _checks.ratio("retention", retention)
    k = torch.floor(num_tokens.double() * rho + 0.5).long()
    return torch.where(num_tokens > 0, k.clamp_min(1), torch.zeros_like(k))
