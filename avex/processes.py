"""This process's place in a ``torchrun`` job (one process outside torchrun), shared by training
and export: the process group is made here unless an enclosing run already made it, and only
its maker ends it."""
from __future__ import annotations

import os

import torch.distributed as torch_dist


class TorchrunProcess:
    """``world``, ``rank``, ``local_rank`` from torchrun's environment; a process group on
    ``backend`` when there are several processes and none exists yet."""

    def __init__(self, backend: str):
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        # a run started inside another (a comparison policy trained for its table) joins the
        # process group of the first, which alone ends it
        self.owns_group = self.world > 1 and not torch_dist.is_initialized()
        if self.owns_group:
            torch_dist.init_process_group(backend)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self):
        if self.world > 1:
            torch_dist.barrier()

    def close(self):
        if self.owns_group and torch_dist.is_initialized():
            torch_dist.destroy_process_group()
