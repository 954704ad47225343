"""Plugins: how a model is placed, wrapped and checkpointed for one parallel strategy.

`SingleProcessPlugin` (the default) runs on one device. `TorchDDPPlugin` wraps the model in
`DistributedDataParallel` (gloo on CPU, nccl on GPU) under `torchrun`; `TorchFSDPPlugin` shards
parameters, gradients and optimizer state with FSDP2 (`fully_shard`). Every plugin exports models
as Hugging Face directories written by rank 0. Resumable state is `torch.save`d by rank 0 for
replicated plugins and written as `torch.distributed.checkpoint` shards by every rank for FSDP2;
every plugin loads both forms, so a checkpoint survives a change of plugin or world size.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

from olingo.booster.checkpoint_io import (
    gather_full_state,
    is_dcp_checkpoint,
    load_model_shards,
    load_optimizer_shards,
    materialise,
    meta_skeleton,
    save_model_shards,
    save_optimizer_shards,
    scatter_full_state,
)
from olingo.cluster import DistCoordinator, init_distributed
from olingo.dataset.sampler import ResumableSampler
from olingo.models.loading import load_safetensors_into
from olingo.models.lora import export_lora, has_lora, restore_lora

logger = logging.getLogger("olingo.booster")
MixedPrecision = Literal["fp32", "bf16", "fp16"]


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


class SingleProcessPlugin(Plugin):
    """One process on one device (CUDA when available, else CPU). The default."""


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


def mixed_precision_policy(name: MixedPrecision, device: torch.device) -> MixedPrecisionPolicy:
    """bf16/fp16 forward and backward with fp32 gradient reduction on GPU (summing many ranks'
    gradients in 16 bits loses their low bits); the sharded master weights and the optimizer
    stay fp32. CPUs get fp32 throughout: their 16-bit matmuls are slow or missing."""
    if name == "fp32":
        return MixedPrecisionPolicy()
    if device.type != "cuda":
        logger.warning("plugin.mixed_precision=%s needs a GPU: computing in fp32 on %s", name, device.type)
        return MixedPrecisionPolicy()
    if name == "fp16":
        logger.warning("plugin.mixed_precision=fp16 runs without loss scaling: small gradients may underflow; prefer bf16")
    dtype = torch.bfloat16 if name == "bf16" else torch.float16
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)


def offload_policy(enabled: bool, device: torch.device) -> OffloadPolicy:
    """Sharded parameters, gradients and optimizer state in CPU memory (the optimizer steps on
    the CPU); on a CPU-only machine they are there already, so nothing changes."""
    if not enabled:
        return OffloadPolicy()
    if device.type != "cuda":
        logger.info("plugin.cpu_offload: parameters already live in CPU memory on %s; nothing to offload", device.type)
        return OffloadPolicy()
    return CPUOffloadPolicy()


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The decoder layers: modules whose class a Hugging Face model lists in
    `_no_split_modules` (the units transformers and accelerate shard and offload)."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or [])
    return [m for m in model.modules() if type(m).__name__ in names]


def rebind_optimizer(optimizer: torch.optim.Optimizer, names: dict[int, str], model: nn.Module) -> list[nn.Parameter]:
    """`fully_shard` replaces every parameter with a new sharded (DTensor) one: point the
    optimizer's groups at the new objects by name, keeping its groups and hyperparameters."""
    if optimizer.state:
        raise ValueError("boost the optimizer before its first step: FSDP2 replaces the parameters it holds state for")
    current = dict(model.named_parameters())
    for group in optimizer.param_groups:
        group["params"] = [current[names[id(p)]] for p in group["params"]]
    return [p for group in optimizer.param_groups for p in group["params"]]


class TorchFSDPPlugin(DataParallelPlugin):
    """Fully sharded data parallel on FSDP2 (`torch.distributed.fsdp.fully_shard`); launch with
    torchrun.

    Each decoder layer is one FSDP unit, then the root holds the rest (embeddings, head): a
    layer's parameters are all-gathered just before its forward and backward and freed after,
    gradients are reduce-scattered, and each rank keeps and steps only its shard of parameters
    and optimizer state. Gradients are averaged over ranks as with DDP, so a per-rank batch of B
    on W ranks equals one process with batch W*B. Without a process group (plain `python`) the
    model stays whole, as with `SingleProcessPlugin`.

    Args:
        max_norm: gradient clipping (the norm of the whole, unsharded gradient).
        backend: torch.distributed backend (default: nccl on GPU, gloo on CPU).
        mixed_precision: "fp32", or "bf16"/"fp16" compute on GPU (see `mixed_precision_policy`).
        cpu_offload: keep sharded parameters, gradients and optimizer state in CPU memory.
        reshard_after_forward: free gathered layers after forward (less memory, a second
            all-gather in backward).
    """

    def __init__(
        self, max_norm: float | None = None, backend: str | None = None, mixed_precision: MixedPrecision = "fp32",
        cpu_offload: bool = False, reshard_after_forward: bool = True,
    ) -> None:
        super().__init__(max_norm=max_norm, backend=backend)
        self.mp_policy = mixed_precision_policy(mixed_precision, self.device)
        self.offload_policy = offload_policy(cpu_offload, self.device)
        self.reshard_after_forward = reshard_after_forward
        self.mesh = init_device_mesh(self.device.type, (self.coordinator.world_size,)) if self.coordinator.is_distributed else None
        # Meta-device copies of the sharded models: the structure an unsharded export is rebuilt in.
        self._skeletons: weakref.WeakKeyDictionary[nn.Module, nn.Module] = weakref.WeakKeyDictionary()

    @property
    def sharded_checkpoints(self) -> bool:
        return True

    def configure(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> tuple[nn.Module, OptimizerWrapper | None]:
        if self.mesh is None or not any(p.requires_grad for p in model.parameters()):
            return super().configure(model, optimizer)  # one process, or a frozen model: replicated
        if not isinstance(self.offload_policy, CPUOffloadPolicy):
            model = model.to(self.device)
        names = {id(p): name for name, p in model.named_parameters()}
        self._skeletons[model] = meta_skeleton(model)
        options = dict(mesh=self.mesh, mp_policy=self.mp_policy, offload_policy=self.offload_policy)
        blocks = transformer_blocks(model)
        if not blocks:
            logger.warning("%s lists no _no_split_modules: sharding it as one FSDP unit", type(model).__name__)
        for block in blocks:
            fully_shard(block, reshard_after_forward=self.reshard_after_forward, **options)
        fully_shard(model, **options)
        if optimizer is None:
            return model, None
        params = rebind_optimizer(optimizer, names, model)
        return model, OptimizerWrapper(optimizer, params, self.max_norm, model)

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        """Gradients accumulate unsharded on each rank and are reduce-scattered on the last
        micro-step."""
        if not isinstance(model, FSDPModule):
            yield
            return
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    @contextlib.contextmanager
    def gathered(self, model: nn.Module) -> Iterator[None]:
        """All-gather every layer once and keep it gathered until exit (FSDP2's recipe for
        evaluation): forwards then need no communication, so ranks may generate different
        lengths or evaluate different numbers of batches, and generation does not all-gather
        every layer for every token. Costs one whole copy of the parameters per rank."""
        units = [m for m in model.modules() if isinstance(m, FSDPModule)]
        for unit in units:
            unit.set_reshard_after_forward(False, recurse=False)
            unit.unshard()
        try:
            yield
        finally:
            for unit in units:
                unit.reshard()
                # The root stays gathered after forward (FSDP2's own default): backward needs it at once.
                unit.set_reshard_after_forward(self.reshard_after_forward and unit is not model, recurse=False)

    def save_model(self, model: nn.Module, directory: str | Path, shard: bool = False) -> None:
        """Export: gather the whole state dict onto rank 0's CPU (all ranks take part), rebuild
        an unsharded model from it and save that the way every plugin saves a model."""
        if shard or model not in self._skeletons:
            super().save_model(model, directory, shard=shard)
            return
        full = gather_full_state(model)
        if self.coordinator.is_master:
            super().save_model(materialise(self._skeletons[model], full), directory)

    def load_model(self, model: nn.Module, directory: str | Path) -> None:
        """DCP shards load directly; a Hugging Face directory is read by rank 0 into an
        unsharded copy of the current weights (a LoRA directory holds only adapters and heads),
        then scattered into every rank's shards."""
        if is_dcp_checkpoint(directory) or model not in self._skeletons:
            super().load_model(model, directory)
            return
        full = gather_full_state(model)
        if self.coordinator.is_master:
            whole = materialise(self._skeletons[model], full)
            super().load_model(whole, directory)
            full = whole.state_dict()
        scatter_full_state(model, full)
