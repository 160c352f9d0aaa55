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


def _key_dtype(scores: torch.Tensor) -> torch.dtype:
    """The ranking keys' dtype: float64 for float64 scores, else float32 (as
    ``gumbel_topk_ref.compute_dtype``)."""
    return torch.float64 if scores.dtype == torch.float64 else torch.float32


def key_dtype_max(scores: torch.Tensor) -> float:
    """The largest ranking key the kernels can hold for ``scores``."""
    return torch.finfo(_key_dtype(scores)).max


def _spans(scores: torch.Tensor, valid: torch.Tensor, extra: float) -> torch.Tensor:
    """Each row's largest minus smallest valid score, plus ``extra``, in the key dtype (where it
    overflows, it is inf: past the range all the same)."""
    s = scores.detach().to(_key_dtype(scores))
    hi = torch.where(valid, s, float("-inf")).amax(dim=1)
    lo = torch.where(valid, s, float("inf")).amin(dim=1)
    return torch.where(valid.any(dim=1), hi - lo, torch.zeros_like(hi)) + extra


def key_overflow(scores: torch.Tensor, valid: torch.Tensor, tau: float,
                 extra: float = 0.0) -> torch.Tensor:
    """A 0-D bool tensor (no host sync): whether some row's ranking keys, (s - row max) / tau
    over its ``valid`` scores, lose their order: a span past the key dtype's range turns the
    lower keys to -inf, which then tie. ``extra``: what the key may drop by besides (set-aware
    selection's redundancy term)."""
    return (_spans(scores, valid, extra) / float(tau) >= key_dtype_max(scores)).any()


def key_range_error(scores: torch.Tensor, valid: torch.Tensor, tau: float,
                    extra: float = 0.0) -> ValueError:
    """The refusal :func:`key_overflow` calls for, naming the row, its span and tau."""
    span = _spans(scores.double(), valid, extra)   # float64: the figure the message quotes
    row = int(span.argmax())
    return ValueError(
        f"scores of row {row} span {float(span[row]):.3g} (largest minus smallest selectable "
        f"score{' plus the redundancy' if extra else ''}); divided by tau = {tau:g} that passes "
        f"the ranking keys' range ({key_dtype_max(scores):.3g}), where they would tie and rank "
        "wrongly: rescale the scores or raise tau")


def tau_for_keys(tau: float, scores: torch.Tensor) -> float:
    """``tau`` (already a positive float) refused where the key dtype can't hold it."""
    if tau >= key_dtype_max(scores):
        raise ValueError(f"tau must be below {key_dtype_max(scores):.3g} (the ranking keys' "
                         f"range for {scores.dtype} scores), got {tau:g}")
    return tau
