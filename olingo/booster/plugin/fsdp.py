"""`TorchFSDPPlugin`: fully sharded data parallel on FSDP2 (`fully_shard`) under torchrun,
with its mixed-precision, CPU-offload and wrapping policies."""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)

from olingo.booster.checkpoint_io import (
    gather_full_state,
    is_dcp_checkpoint,
    materialise,
    meta_skeleton,
    scatter_full_state,
)
from olingo.booster.plugin.base import DataParallelPlugin, OptimizerWrapper

logger = logging.getLogger("olingo.booster")
MixedPrecision = Literal["fp32", "bf16", "fp16"]


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
