"""`Booster`: one object that prepares model, optimizer and data for the chosen plugin and
saves/loads their states. Mirrors ColossalAI's `Booster` API on torch.distributed."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from olingo.booster.plugin import OptimizerWrapper, Plugin, SingleProcessPlugin, TorchDDPPlugin

__all__ = ["Booster", "OptimizerWrapper", "Plugin", "SingleProcessPlugin", "TorchDDPPlugin"]


class Booster:
    """Prepare training objects for `plugin` (default: `SingleProcessPlugin()`)."""

    def __init__(self, plugin: Plugin | None = None) -> None:
        self.plugin = plugin if plugin is not None else SingleProcessPlugin()

    @property
    def device(self) -> torch.device:
        return self.plugin.device

    def boost(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        criterion: Callable | None = None,
        dataloader: DataLoader | None = None,
        lr_scheduler: Any = None,
    ) -> tuple[nn.Module, OptimizerWrapper | None, Callable | None, DataLoader | None, Any]:
        """Move/wrap the model for the plugin and wrap the optimizer (grad-norm + clipping).

        The dataloader and scheduler are returned unchanged: build dataloaders with
        `plugin.prepare_dataloader` so they shard and resume correctly.
        """
        model, optimizer = self.plugin.configure(model, optimizer)
        return model, optimizer, criterion, dataloader, lr_scheduler

    def backward(self, loss: torch.Tensor, optimizer: OptimizerWrapper | None = None) -> None:
        loss.backward()

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module, optimizer: OptimizerWrapper | None = None) -> Iterator[None]:
        with self.plugin.no_sync(model):
            yield

    def unwrap(self, model: nn.Module) -> nn.Module:
        return self.plugin.unwrap(model)

    # ---- checkpoint I/O: ColossalAI's method names -----------------------------------------
    def save_model(self, model: nn.Module, checkpoint: str | Path, **_: Any) -> None:
        """Write a Hugging Face model directory (rank 0 only)."""
        self.plugin.save_model(model, checkpoint)

    def load_model(self, model: nn.Module, checkpoint: str | Path, **_: Any) -> None:
        """Load a directory written by `save_model` into `model`, strictly."""
        self.plugin.load_model(model, checkpoint)

    def save_optimizer(self, optimizer: OptimizerWrapper | torch.optim.Optimizer, checkpoint: str | Path, **_: Any) -> None:
        self.plugin.save_state(optimizer.state_dict(), checkpoint)

    def load_optimizer(self, optimizer: OptimizerWrapper | torch.optim.Optimizer, checkpoint: str | Path, **_: Any) -> None:
        optimizer.load_state_dict(self.plugin.load_state(checkpoint))

    def save_lr_scheduler(self, lr_scheduler: Any, checkpoint: str | Path) -> None:
        self.plugin.save_state(lr_scheduler.state_dict(), checkpoint)

    def load_lr_scheduler(self, lr_scheduler: Any, checkpoint: str | Path) -> None:
        lr_scheduler.load_state_dict(self.plugin.load_state(checkpoint))
