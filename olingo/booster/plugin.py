"""Plugins: how a model is placed, wrapped and checkpointed for one parallel strategy.

`SingleProcessPlugin` (the default) runs on one device. `TorchDDPPlugin` wraps the model in
`DistributedDataParallel` (gloo on CPU, nccl on GPU) under `torchrun`. Checkpoints are Hugging Face
model directories plus `torch.save`d optimizer/scheduler states, written by rank 0; an FSDP2 plugin
will override the save/load methods with `torch.distributed.checkpoint`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

from olingo.cluster import DistCoordinator, init_distributed
from olingo.dataset.sampler import ResumableSampler
from olingo.models.loading import load_safetensors_into


class OptimizerWrapper:
    """The optimizer as the trainer sees it: `step()` measures the gradient norm, clips it to
    the plugin's `max_norm` (when set), then steps. `grad_norm` holds the pre-clip norm."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: list[nn.Parameter], max_norm: float | None) -> None:
        self.optim = optimizer
        self.params = params
        self.max_norm = max_norm
        self.grad_norm: float = 0.0

    def step(self) -> None:
        limit = self.max_norm if self.max_norm else math.inf
        self.grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, limit))
        self.optim.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optim.zero_grad(set_to_none=set_to_none)

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optim.param_groups

    def state_dict(self) -> dict[str, Any]:
        return self.optim.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optim.load_state_dict(state)

    def unwrap(self) -> torch.optim.Optimizer:
        return self.optim


class Plugin:
    """Base plugin: one process, one device. Subclasses change wrapping and communication."""

    def __init__(self, max_norm: float | None = None) -> None:
        self.max_norm = max_norm
        self.coordinator = DistCoordinator()

    @property
    def device(self) -> torch.device:
        return self.coordinator.device

    # ---- wrapping --------------------------------------------------------------------------
    def configure(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> tuple[nn.Module, OptimizerWrapper | None]:
        model = model.to(self.device)
        wrapped = None
        if optimizer is not None:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            wrapped = OptimizerWrapper(optimizer, params, self.max_norm)
        return model, wrapped

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        """Skip gradient communication during non-final accumulation micro-steps."""
        yield

    def all_reduce_mean(self, values: torch.Tensor) -> torch.Tensor:
        return values

    def all_reduce_sum(self, values: torch.Tensor) -> torch.Tensor:
        return values

    # ---- data ------------------------------------------------------------------------------
    def prepare_dataloader(
        self,
        dataset: Dataset,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        collate_fn: Callable | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        even: bool = True,
        drop_last: bool = False,
    ) -> DataLoader:
        """A DataLoader over this rank's shard with a `ResumableSampler`; `batch_size` is per rank.

        `drop_last` drops each epoch's short last batch (PPO's prompt loader: every rollout
        batch then has the same size, so every episode takes the same number of steps)."""
        sampler = ResumableSampler(
            len(dataset),  # type: ignore[arg-type]
            num_replicas=self.coordinator.world_size,
            rank=self.coordinator.rank,
            shuffle=shuffle,
            seed=seed,
            even=even,
        )
        return DataLoader(
            dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate_fn,
            num_workers=num_workers, pin_memory=pin_memory, drop_last=drop_last,
            # Each new iterator draws a worker base seed from `generator`; a private one keeps
            # that draw off the global RNG, whose stream a resumed run must replay exactly.
            generator=torch.Generator().manual_seed(seed),
        )

    # ---- checkpoints -----------------------------------------------------------------------
    def save_model(self, model: nn.Module, directory: str | Path) -> None:
        if not self.coordinator.is_master:
            return
        model = self.unwrap(model)
        Path(directory).mkdir(parents=True, exist_ok=True)
        if hasattr(model, "save_pretrained"):
            model.save_pretrained(str(directory))
        else:
            from safetensors.torch import save_model

            save_model(model, str(Path(directory) / "model.safetensors"))

    def load_model(self, model: nn.Module, directory: str | Path) -> None:
        """Load a model directory in place; wrappers (e.g. RewardModel) that save an inner HF
        model provide `load_pretrained_weights` to load it back the same way."""
        model = self.unwrap(model)
        if hasattr(model, "load_pretrained_weights"):
            model.load_pretrained_weights(directory)
        else:
            load_safetensors_into(model, directory)

    def save_state(self, state: dict[str, Any], path: str | Path) -> None:
        if self.coordinator.is_master:
            torch.save(state, str(path))

    def load_state(self, path: str | Path) -> dict[str, Any]:
        return torch.load(str(path), map_location="cpu", weights_only=False)


class SingleProcessPlugin(Plugin):
    """One process on one device (CUDA when available, else CPU). The default."""


class TorchDDPPlugin(Plugin):
    """Data parallel with `torch.nn.parallel.DistributedDataParallel`; launch with torchrun.

    Every rank holds the whole model; gradients are averaged across ranks in backward, so a
    per-rank batch of B on W ranks equals one process with batch W*B.
    """

    def __init__(self, max_norm: float | None = None, backend: str | None = None, find_unused_parameters: bool = False) -> None:
        init_distributed(backend)
        super().__init__(max_norm=max_norm)
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

    def all_reduce_mean(self, values: torch.Tensor) -> torch.Tensor:
        if not self.coordinator.is_distributed:
            return values
        values = values.clone()
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return values / self.coordinator.world_size

    def all_reduce_sum(self, values: torch.Tensor) -> torch.Tensor:
        if not self.coordinator.is_distributed:
            return values
        values = values.clone()
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return values
