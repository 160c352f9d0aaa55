"""This process's place in a ``torchrun`` job and its device, and the DistributedDataParallel
wrapper's two helpers: a single process outside torchrun."""
from __future__ import annotations

from contextlib import nullcontext

import torch

from avex.processes import TorchrunProcess
from avex.training.config import TrainConfig


class Processes(TorchrunProcess):
    """This process's place in a torchrun job (a single process outside torchrun): NCCL
    between CUDA processes, gloo otherwise."""

    def __init__(self, device_kind: str):
        super().__init__("nccl" if device_kind == "cuda" else "gloo")


def pick_device(cfg: TrainConfig, procs: Processes) -> torch.device:
    kind = cfg.device
    if kind == "auto":
        kind = "cuda" if torch.cuda.is_available() else "cpu"
    if kind.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device={cfg.device!r} but CUDA is not available; pass "
                             "--device cpu")
        if procs.world > 1:
            return torch.device("cuda", procs.local_rank)
        index = torch.device(kind).index or 0
        if index >= torch.cuda.device_count():
            raise ValueError(f"device={cfg.device!r} but this machine has "
                             f"{torch.cuda.device_count()} CUDA device(s)")
        return torch.device("cuda", index)
    return torch.device("cpu")


def unwrap(model):
    """The policy inside a DistributedDataParallel wrapper (or ``model`` itself)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def no_sync(model, last: bool):
    """Skip DDP's gradient all-reduce on all but the last micro-batch of an accumulation."""
    if isinstance(model, torch.nn.parallel.DistributedDataParallel) and not last:
        return model.no_sync()
    return nullcontext()
