"""The `Plugin` base (one process, one device), the shared `DataParallelPlugin` of the
torch.distributed plugins, and `OptimizerWrapper`, the optimizer as trainers see it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils.data import DataLoader, Dataset

from olingo.booster.checkpoint_io import (
    is_dcp_checkpoint,
    load_model_shards,
    load_optimizer_shards,
    save_model_shards,
    save_optimizer_shards,
)
from olingo.cluster import DistCoordinator, init_distributed
from olingo.dataset.sampler import ResumableSampler
from olingo.models.loading import load_safetensors_into
from olingo.models.lora import export_lora, has_lora, restore_lora


def clip_gradients(params: list[nn.Parameter], max_norm: float | None) -> float:
    """The total gradient norm before clipping; gradients are clipped to `max_norm` when set.

    Sharded (DTensor) gradients give a partial norm per rank: `full_tensor()` reduces it to the
    norm of the whole gradient, so every rank clips by the same factor as one process would.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    norm = torch.nn.utils.get_total_norm(grads)
    if isinstance(norm, DTensor):
        norm = norm.full_tensor()
    if max_norm:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return float(norm)


class OptimizerWrapper:
    """The optimizer as the trainer sees it: `step()` measures the gradient norm, clips it to
    the plugin's `max_norm` (when set), then steps. `grad_norm` holds the pre-clip norm.
    `model` is the (unwrapped) model the parameters belong to: distributed checkpoints name
    optimizer state by parameter name, which only the model knows."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: list[nn.Parameter], max_norm: float | None, model: nn.Module | None = None) -> None:
        self.optim = optimizer
        self.params = params
        self.max_norm = max_norm
        self.model = model
        self.grad_norm: float = 0.0

    def step(self) -> None:
        self.grad_norm = clip_gradients(self.params, self.max_norm)
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
            wrapped = OptimizerWrapper(optimizer, params, self.max_norm, model)
        return model, wrapped

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        """Skip gradient communication during non-final accumulation micro-steps."""
        yield

    @contextlib.contextmanager
    def gathered(self, model: nn.Module) -> Iterator[None]:
        """Whole parameters on every rank for a block of forward-only work (generation,
        evaluation), during which ranks may run different numbers of forwards. Enter it on
        every rank. A no-op unless the plugin shards parameters."""
        yield

    @property
    def sharded_checkpoints(self) -> bool:
        """True when each rank writes its own shards of the resumable state (DCP)."""
        return False

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
        lengths: Sequence[int] | None = None,
    ) -> DataLoader:
        """A DataLoader over this rank's shard with a `ResumableSampler`; `batch_size` is per rank.

        `drop_last` drops each epoch's short last batch (PPO's prompt loader: every rollout
        batch then has the same size, so every episode takes the same number of steps).
        `lengths` (one per row, `dataset_lengths`) groups micro-batches by row length."""
        sampler = ResumableSampler(
            len(dataset),  # type: ignore[arg-type]
            num_replicas=self.coordinator.world_size,
            rank=self.coordinator.rank,
            shuffle=shuffle,
            seed=seed,
            even=even,
            lengths=lengths,
            batch_size=batch_size,
        )
        return DataLoader(
            dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate_fn,
            num_workers=num_workers, pin_memory=pin_memory, drop_last=drop_last,
            # Each new iterator draws a worker base seed from `generator`; a private one keeps
            # that draw off the global RNG, whose stream a resumed run must replay exactly.
            generator=torch.Generator().manual_seed(seed),
        )

    # ---- checkpoints -----------------------------------------------------------------------
    def save_model(self, model: nn.Module, directory: str | Path, shard: bool = False) -> None:
        """A Hugging Face directory written by rank 0; `shard=True`: DCP shards by every rank."""
        if shard:
            save_model_shards(self.unwrap(model), directory)
            return
        if not self.coordinator.is_master:
            return
        model = self.unwrap(model)
        Path(directory).mkdir(parents=True, exist_ok=True)
        model = export_lora(model, directory)  # LoRA: resume state in lora/, the merged model as the export
        if hasattr(model, "save_pretrained"):
            model.save_pretrained(str(directory))
        else:
            from safetensors.torch import save_model

            save_model(model, str(Path(directory) / "model.safetensors"))

    def load_model(self, model: nn.Module, directory: str | Path) -> None:
        """Load a model directory (or DCP shards, under any world size) in place; wrappers
        (e.g. RewardModel) that save an inner HF model provide `load_pretrained_weights`."""
        model = self.unwrap(model)
        if is_dcp_checkpoint(directory):
            load_model_shards(model, directory)
        elif has_lora(model):  # LoRA: adapters and heads from lora/; the frozen base is already loaded
            restore_lora(model, directory)
        elif hasattr(model, "load_pretrained_weights"):
            model.load_pretrained_weights(directory)
        else:
            load_safetensors_into(model, directory)

    def save_optimizer(self, optimizer: OptimizerWrapper, path: str | Path, shard: bool = False) -> None:
        """`torch.save` of the state by rank 0; `shard=True`: DCP shards keyed by parameter name."""
        if shard:
            save_optimizer_shards(optimizer.model, optimizer.optim, path)
        else:
            self.save_state(optimizer.state_dict(), path)

    def load_optimizer(self, optimizer: OptimizerWrapper, path: str | Path) -> None:
        """Load either form `save_optimizer` writes; DCP shards load under any world size."""
        if is_dcp_checkpoint(path):
            load_optimizer_shards(optimizer.model, optimizer.optim, path)
        else:
            optimizer.load_state_dict(self.load_state(path))

    def save_state(self, state: dict[str, Any], path: str | Path) -> None:
        if self.coordinator.is_master:
            torch.save(state, str(path))

    def load_state(self, path: str | Path) -> dict[str, Any]:
        return torch.load(str(path), map_location="cpu", weights_only=False)


class DataParallelPlugin(Plugin):
    """What every torch.distributed plugin shares: joining torchrun's process group and
    reducing metrics across ranks."""

    def __init__(self, max_norm: float | None = None, backend: str | None = None) -> None:
        init_distributed(backend)
        super().__init__(max_norm=max_norm)

    def all_reduce_mean(self, values: torch.Tensor) -> torch.Tensor:
        if not self.coordinator.is_distributed:
            return values
        return self.all_reduce_sum(values) / self.coordinator.world_size

    def all_reduce_sum(self, values: torch.Tensor) -> torch.Tensor:
        if not self.coordinator.is_distributed:
            return values
        values = values.clone()
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return values
