"""Philox 4x32-10 in PyTorch, bit for bit the generator behind Triton's ``tl.rand``.

The Triton kernels draw Gumbel noise with ``tl.rand(seed, offset)``; the references call
``uniform(seed, offset)`` here and get the same uniforms, so kernel and reference select the
same tokens. Arithmetic is on int64 tensors holding uint32 values (torch has no full uint32).
"""
from __future__ import annotations

import torch

_MASK32 = 0xFFFFFFFF
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57


def _mul_hi_lo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of a * b for a uint32 constant and uint32 values, without overflow."""
    b_hi, b_lo = b >> 16, b & 0xFFFF
    p_hi, p_lo = a * b_hi, a * b_lo  # each < 2**48
    hi = (p_hi + (p_lo >> 16)) >> 16
    lo = (((p_hi & 0xFFFF) << 16) + p_lo) & _MASK32
    return hi, lo


def philox_4x32(seed: int, c0: torch.Tensor, c1: torch.Tensor, rounds: int = 10) -> torch.Tensor:
    """First output word of Philox 4x32 for counters (c0, c1, 0, 0) and key = seed."""
    k0, k1 = seed & _MASK32, (seed >> 32) & _MASK32
    c2 = torch.zeros_like(c0)
    c3 = torch.zeros_like(c0)
    for _ in range(rounds):
        hi_b, lo_b = _mul_hi_lo(_ROUND_B, c2)
        hi_a, lo_a = _mul_hi_lo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _KEY_A) & _MASK32
        k1 = (k1 + _KEY_B) & _MASK32
    return c0


def uniform(seed: int, offset: torch.Tensor) -> torch.Tensor:
    """float32 uniforms in [0, 1), equal to Triton's ``tl.rand(seed, offset)`` for int64 offsets."""
    offset = offset.to(torch.int64)
    bits = philox_4x32(seed, offset & _MASK32, (offset >> 32) & _MASK32)
    signed = torch.where(bits >= 2**31, bits - 2**32, bits)  # reinterpret as int32
    signed = torch.where(signed < 0, -signed - 1, signed)
    return signed.to(torch.float32) * 4.6566127342e-10
