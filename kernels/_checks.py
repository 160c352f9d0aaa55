"""Argument checks of the kernels' public functions.

Each check raises ``TypeError`` (wrong kind of thing) or ``ValueError`` (right kind, bad value)
with a message that names the argument and the value it got. The kernel library imports nothing
else of avex, so it stands alone; ``avex._checks`` builds on these.
"""
from __future__ import annotations

import math
import numbers

import torch


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def tensor(name: str, value, *, ndim: int | tuple[int, ...] | None = None,
           floating: bool = False, integer: bool = False, boolean: bool = False) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else ndim
        if value.dim() not in allowed:
            want = " or ".join(f"{d}-D" for d in allowed)
            raise ValueError(f"{name} must be {want}, got shape {_shape(value)}")
    if floating and not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    if integer and (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool):
        raise TypeError(f"{name} must be an integer tensor, got dtype {value.dtype}")
    if boolean and value.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor, got dtype {value.dtype}")
    if value.is_meta:
        raise ValueError(f"{name} is a meta tensor (shape {_shape(value)}, no data); pass a "
                         "tensor on cpu or cuda")
    return value


def same_device(name: str, value: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    if value.device != ref.device:
        raise ValueError(f"{name} is on {value.device} but {ref_name} is on {ref.device}; "
                         "put them on the same device")


def positive_float(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}: {value!r}")
    value = float(value)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


def flag(name: str, value) -> bool:
    """True or False, nothing truthy (the string 'no' is not False)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__}: {value!r}")
    return value


def int_at_least(name: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r}")
    value = int(value)
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")
    return value


def choice(name: str, value, options) -> str:
    try:
        known = value in options
    except TypeError:  # unhashable
        known = False
    if not known:
        raise ValueError(f"{name} must be one of {sorted(options)}, got {value!r}")
    return value
