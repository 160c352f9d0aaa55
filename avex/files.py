"""Small file jobs, each done one way everywhere: an atomic write (any file, text, JSON,
safetensors), the CPU copy of a module's weights, and reading weights back with an error that
names the file. A leaf module."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file


def write_atomically(path, write, *, durable: bool = False) -> Path:
    """``write(tmp)`` writes a temporary file beside ``path``, which is then renamed onto
    ``path``: a reader sees the old file or the new one, never half of one. With ``durable``
    the file's data is flushed to the disk before the rename. The temporary file goes with
    an error."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        if durable:
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_text_atomically(path, text: str, *, durable: bool = False) -> Path:
    return write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"),
                            durable=durable)


def write_json_atomically(path, data, **dumps) -> Path:
    """``json.dumps(data, **dumps)`` and a newline, written atomically."""
    return write_text_atomically(path, json.dumps(data, **dumps) + "\n")


def save_tensors_atomically(path, tensors: dict, metadata: dict | None = None) -> Path:
    """A safetensors file, written atomically."""
    return write_atomically(path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))


def cpu_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's weights as contiguous CPU tensors, detached: what a safetensors file holds."""
    return {k: v.detach().cpu().contiguous() for k, v in module.state_dict().items()}


def read_weights(file) -> dict[str, torch.Tensor]:
    """A safetensors file of weights; a corrupt or truncated one is refused naming it."""
    try:
        return load_file(str(file))
    except Exception as err:  # SafetensorError, OSError
        raise ValueError(f"{file}: corrupt or truncated weights ({type(err).__name__}: "
                         f"{err}); use an intact copy of the run") from None


def check_weights(file) -> None:
    """Read only the header of a safetensors file: a truncated or corrupt one is refused, naming
    it, before any model is loaded."""
    try:
        with safe_open(str(file), framework="pt") as handle:
            handle.keys()
    except Exception as err:  # SafetensorError, OSError
        raise ValueError(f"{file}: corrupt or truncated weights ({type(err).__name__}: "
                         f"{err}); use an intact copy of the run") from None


def load_weights(module: torch.nn.Module, file) -> torch.nn.Module:
    """``module.load_state_dict`` from ``file``, naming the file when the weights don't fit."""
    try:
        module.load_state_dict(read_weights(file))
    except RuntimeError as err:
        raise ValueError(f"{file}: the weights do not fit this policy ({err})") from None
    return module
