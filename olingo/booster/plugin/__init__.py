"""Plugins: how a model is placed, wrapped and checkpointed for one parallel strategy.

`SingleProcessPlugin` (the default, `single.py`) runs on one device. `TorchDDPPlugin` (`ddp.py`)
wraps the model in `DistributedDataParallel` (gloo on CPU, nccl on GPU) under `torchrun`;
`TorchFSDPPlugin` (`fsdp.py`) shards parameters, gradients and optimizer state with FSDP2
(`fully_shard`). Both share `DataParallelPlugin` (`base.py`, beside the `Plugin` base). Every
plugin exports models as Hugging Face directories written by rank 0. Resumable state is
`torch.save`d by rank 0 for replicated plugins and written as `torch.distributed.checkpoint`
shards by every rank for FSDP2; every plugin loads both forms, so a checkpoint survives a change
of plugin or world size.
"""

from olingo.booster.plugin.base import DataParallelPlugin, OptimizerWrapper, Plugin, clip_gradients
from olingo.booster.plugin.ddp import TorchDDPPlugin
from olingo.booster.plugin.fsdp import (
    MixedPrecision,
    TorchFSDPPlugin,
    mixed_precision_policy,
    offload_policy,
    rebind_optimizer,
    transformer_blocks,
)
from olingo.booster.plugin.single import SingleProcessPlugin

__all__ = [
    "DataParallelPlugin",
    "MixedPrecision",
    "OptimizerWrapper",
    "Plugin",
    "SingleProcessPlugin",
    "TorchDDPPlugin",
    "TorchFSDPPlugin",
    "clip_gradients",
    "mixed_precision_policy",
    "offload_policy",
    "rebind_optimizer",
    "transformer_blocks",
]
