"""`TorchDDPPlugin`: data parallel with `DistributedDataParallel` under torchrun."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from olingo.booster.plugin.base import DataParallelPlugin, OptimizerWrapper


class TorchDDPPlugin(DataParallelPlugin):
    """Data parallel with `torch.nn.parallel.DistributedDataParallel`; launch with torchrun.

    Every rank holds the whole model; gradients are averaged across ranks in backward, so a
    per-rank batch of B on W ranks equals one process with batch W*B.
    """

    def __init__(self, max_norm: float | None = None, backend: str | None = None, find_unused_parameters: bool = False) -> None:
        super().__init__(max_norm=max_norm, backend=backend)
        self.find_unused_parameters = find_unused_parameters

    def configure(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> tuple[nn.Module, OptimizerWrapper | None]:
        model, wrapped = super().configure(model, optimizer)
        if self.coordinator.is_distributed and any(p.requires_grad for p in model.parameters()):
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            model = DDP(model, device_ids=device_ids, find_unused_parameters=self.find_unused_parameters)
        return model, wrapped

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module if isinstance(model, DDP) else model

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        if isinstance(model, DDP):
            with model.no_sync():
                yield
        else:
            yield
