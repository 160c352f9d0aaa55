"""Argument checks shared by every public function.

Each check raises ``TypeError`` (wrong kind of thing) or ``ValueError`` (right kind, bad value)
with a message that names the argument and the value it got. The checks the kernels use too
(a tensor's kind, shape and device; a flag, a choice, an int or a positive number) are the
kernel library's own (``avex.kernels._checks``), so that it stands alone.
"""
from __future__ import annotations

import math
import numbers
import os
import re

import torch

from avex.kernels._checks import (choice, flag, int_at_least, positive_float,  # noqa: F401
                                  same_device, tensor)

DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def finite(name: str, value: torch.Tensor) -> torch.Tensor:
    """A floating tensor with no NaN or inf (one device sync)."""
    if value.is_floating_point() and not bool(torch.isfinite(value).all()):
        bad = value[~torch.isfinite(value)][0].item()
        raise ValueError(f"{name} must be finite, got {bad} at "
                         f"{tuple(torch.nonzero(~torch.isfinite(value))[0].tolist())}")
    return value


def real(name: str, value, *, low: float | None = None, high: float | None = None,
         low_open: bool = False, high_open: bool = False) -> float:
    """A finite number (bool refused) in [low, high]; ``*_open`` excludes that end."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}: {value!r}")
    value = float(value)
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if not math.isfinite(value) or too_low or too_high:
        left = "any" if low is None else ("(" if low_open else "[") + f"{low:g}"
        right = "any" if high is None else f"{high:g}" + (")" if high_open else "]")
        where = (f"in {left}, {right}" if low is not None and high is not None
                 else f"{'>' if low_open else '>='} {low:g}" if low is not None
                 else f"{'<' if high_open else '<='} {high:g}" if high is not None else "")
        raise ValueError(f"{name} must be a finite number{' ' + where if where else ''}, "
                         f"got {value}")
    return value


def text(name: str, value, *, optional: bool = False) -> str | None:
    """A non-empty str (a path or a name); None too when ``optional``."""
    if value is None and optional:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        kind = "a non-empty str" + (" or None" if optional else "")
        raise TypeError(f"{name} must be {kind}, got {type(value).__name__}: {value!r}")
    return value


def output_dir(name: str, value, *, writable: bool = True) -> str:
    """A directory that exists, or can be made, and (``writable``) can be written: checked
    before any work, without writing anything."""
    path = os.path.abspath(text(name, value))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"{name} must be a directory, got {value!r}, which is a file")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(f"{name} can't be made: {existing!r} is a file, got {value!r}")
    if writable and not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{name} can't be written: no write permission in {existing!r}, got "
                         f"{value!r}")
    return value


def output_file(name: str, value) -> str:
    """A file path whose folder ``output_dir`` accepts, and not a directory."""
    path = text(name, value)
    if os.path.isdir(path):
        raise ValueError(f"{name} must be a file path, got {value!r}, which is a directory")
    output_dir(f"{name}'s folder", os.path.dirname(os.path.abspath(path)))
    return value


def device(name: str, value) -> str:
    """'auto', 'cpu', 'cuda' or 'cuda:N'."""
    if not isinstance(value, str) or not DEVICE_PATTERN.match(value):
        raise ValueError(f"{name} must be 'auto', 'cpu', 'cuda' or 'cuda:N' (N a device "
                         f"index), got {value!r}")
    return value


def available_device(name: str, value) -> str:
    """:func:`device`, and for 'cuda' or 'cuda:N' a CUDA device of that index on this
    machine (checked before any work: torch fails on it only once a model is moved)."""
    device(name, value)
    if value.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"{name} is {value!r} but CUDA is not available on this machine; "
                             "pass cpu (or auto)")
        index = int(value.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ValueError(f"{name} is {value!r} but this machine has "
                             f"{torch.cuda.device_count()} CUDA device(s)")
    return value


def placement(name: str, value) -> str | torch.device | None:
    """Where to put a module: None (the caller's default), or a device :func:`available_device`
    accepts, given as a str or a ``torch.device`` (one of another type, a model's ``mps``,
    as it is); 'auto' is resolved (CUDA where available, else the CPU)."""
    if value is None:
        return None
    if isinstance(value, torch.device):
        if value.type not in ("cpu", "cuda"):
            return value
        value = str(value)
    available_device(name, value)
    if value == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return value


def optional_int_at_least(name: str, value, low: int) -> int | None:
    return None if value is None else int_at_least(name, value, low)


def ratio(name: str, value) -> float:
    """A retention ratio in (0, 1]: any real number (numpy's float32 and int64 scalars too),
    not a bool."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number in (0, 1], got {type(value).__name__}")
    value = float(value)
    if not (0.0 < value <= 1.0):
        raise ValueError(f"{name} must be in (0, 1], got {value}")
    return value


def str_list(name: str, value) -> list[str]:
    """A list or tuple of str (a lone str is refused, not read as its characters)."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a list of str, got {type(value).__name__}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(item).__name__}: {item!r}")
    return list(value)
