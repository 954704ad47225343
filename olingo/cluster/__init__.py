"""`DistCoordinator`: who am I in the job, and helpers that only rank 0 should run."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def init_distributed(backend: str | None = None) -> bool:
    """Initialise the default process group when launched by torchrun; True when distributed.

    torchrun sets WORLD_SIZE/RANK/MASTER_ADDR; a plain `python` launch stays single-process.
    gloo serves CPU runs, nccl GPU runs.
    """
    if dist.is_available() and dist.is_initialized():
        return True
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend)
    return True


class DistCoordinator:
    """Rank, world size and rank-0 helpers; works the same with and without torch.distributed."""

    def __init__(self) -> None:
        self._distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self._distributed else 0
        self.world_size = dist.get_world_size() if self._distributed else 1
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))

    @property
    def is_distributed(self) -> bool:
        return self._distributed

    @property
    def is_master(self) -> bool:
        """True on global rank 0: the process that writes logs and checkpoint manifests."""
        return self.rank == 0

    def is_master_fn(self) -> bool:  # ColossalAI's spelling
        return self.is_master

    def print_on_master(self, *args: object, **kwargs: object) -> None:
        if self.is_master:
            print(*args, **kwargs, flush=True)

    def barrier(self) -> None:
        if self._distributed:
            dist.barrier()

    def destroy(self) -> None:
        """Tear down the process group (call once at the end of a torchrun job)."""
        if self._distributed and dist.is_initialized():
            dist.destroy_process_group()
            self._distributed = False

    @property
    def device(self) -> torch.device:
        if torch.cuda.is_available():
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")
