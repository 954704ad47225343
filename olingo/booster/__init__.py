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

from olingo.booster.plugin import (
    OptimizerWrapper,
    Plugin,
    SingleProcessPlugin,
    TorchDDPPlugin,
    TorchFSDPPlugin,
)

__all__ = ["Booster", "OptimizerWrapper", "Plugin", "SingleProcessPlugin", "TorchDDPPlugin", "TorchFSDPPlugin"]


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

    def gathered(self, model: nn.Module) -> contextlib.AbstractContextManager[None]:
        """Whole parameters on every rank for forward-only work (see `Plugin.gathered`)."""
        return self.plugin.gathered(model)

    # ---- checkpoint I/O: ColossalAI's method names -----------------------------------------
    def save_model(self, model: nn.Module, checkpoint: str | Path, shard: bool = False, **_: Any) -> None:
        """A Hugging Face model directory written by rank 0 (a sharded model is gathered first;
        every rank must call); `shard=True`: the plugin's resumable shards (DCP), one file per rank."""
        self.plugin.save_model(model, checkpoint, shard=shard)

    def load_model(self, model: nn.Module, checkpoint: str | Path, **_: Any) -> None:
        """Load a directory written by `save_model` (either form, any world size) into `model`, strictly."""
        self.plugin.load_model(model, checkpoint)

    def save_optimizer(self, optimizer: OptimizerWrapper, checkpoint: str | Path, shard: bool = False, **_: Any) -> None:
        """One file written by rank 0; `shard=True`: DCP shards keyed by parameter name."""
        self.plugin.save_optimizer(optimizer, checkpoint, shard=shard)

    def load_optimizer(self, optimizer: OptimizerWrapper, checkpoint: str | Path, **_: Any) -> None:
        self.plugin.load_optimizer(optimizer, checkpoint)

    def save_lr_scheduler(self, lr_scheduler: Any, checkpoint: str | Path) -> None:
        self.plugin.save_state(lr_scheduler.state_dict(), checkpoint)

    def load_lr_scheduler(self, lr_scheduler: Any, checkpoint: str | Path) -> None:
        lr_scheduler.load_state_dict(self.plugin.load_state(checkpoint))
