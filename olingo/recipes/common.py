"""Pieces every recipe shares: config sections, run directories, plugins, optimizers, assets."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field
from transformers import get_cosine_with_min_lr_schedule_with_warmup

from olingo.booster import Booster, Plugin, SingleProcessPlugin, TorchDDPPlugin
from olingo.config import ConfigError, StrictModel, dump_config
from olingo.trainer.callbacks import Callback, build_callback
from olingo.trainer.checkpoint import CheckpointManager

logger = logging.getLogger("olingo")
BUILTIN_PREFIX = "builtin:"


class RunConfig(StrictModel):
    """Where the run lives and how it starts."""

    name: str = Field("run", description="run name; the run directory is <output_dir>/<name>")
    output_dir: str = Field("runs", description="parent directory of run directories")
    seed: int = Field(42, description="the one seed of the run (python, numpy, torch, data order)")
    resume: str | None = Field(None, description="'last' = continue from the run's last checkpoint; or a checkpoint directory")
    overwrite: bool = Field(False, description="delete an existing run directory instead of refusing to start")


class PluginConfig(StrictModel):
    """Parallel strategy."""

    name: Literal["single", "ddp"] = Field("single", description="single process, or DistributedDataParallel under torchrun")
    backend: str | None = Field(None, description="torch.distributed backend for ddp (default: nccl on GPU, gloo on CPU)")


class LoggingConfig(StrictModel):
    """Loggers; metrics.jsonl and TensorBoard (tb/) are always written."""

    wandb: bool = Field(False, description="log to Weights & Biases (offline unless WANDB_API_KEY/WANDB_MODE is set)")
    wandb_project: str = Field("olingo", description="W&B project")
    progress: bool = Field(True, description="show a progress bar")


class OptimConfig(StrictModel):
    """Optimisation shared by supervised stages."""

    epochs: int = Field(3, description="passes over the training data")
    batch_size: int = Field(8, description="rows per micro-batch per process")
    eval_batch_size: int = Field(32, description="rows per evaluation batch per process")
    accumulation_steps: int = Field(1, description="micro-batches per optimizer step")
    lr: float = Field(5e-6, description="peak learning rate")
    weight_decay: float = Field(0.1, description="AdamW weight decay (not on biases and norms)")
    adam_betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW betas")
    warmup_ratio: float = Field(0.025, description="fraction of optimizer steps spent warming up")
    min_lr_ratio: float = Field(0.1, description="cosine schedule floor as a fraction of lr")
    max_grad_norm: float | None = Field(1.0, description="clip the gradient norm (null: no clipping)")
    save_interval: int = Field(0, description="checkpoint every N optimizer steps (0: only the final one)")
    eval_interval: int = Field(0, description="evaluate every N optimizer steps as well as after each epoch")


class CallbackSpec(StrictModel):
    """A callback built by name from the registry."""

    kind: str = Field(..., description="registered callback name, e.g. early_stopping")
    params: dict = Field(default_factory=dict, description="constructor arguments")


def assets_root() -> Path:
    """Where built-in task assets are written: $OLINGO_HOME/assets or ~/.cache/olingo/assets."""
    home = os.environ.get("OLINGO_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "olingo")
    return Path(home) / "assets" / "arithmetic-v1"


def resolve_path(path: str) -> str:
    """`builtin:<name>` -> a file or directory of the embedded task; anything else unchanged.

    Names: tiny-llama (model + tokenizer), sft_train, sft_eval, preference_train,
    preference_eval, prompts_train, prompts_eval.
    """
    if not path.startswith(BUILTIN_PREFIX):
        return path
    from olingo.tasks import prepare_assets

    name = path[len(BUILTIN_PREFIX):].replace("-", "_")
    name = {"tiny_llama": "model_dir", "model": "model_dir"}.get(name, name)
    assets = prepare_assets(assets_root())
    if name == "root" or not hasattr(assets, name):
        raise ConfigError(f"unknown built-in '{path}'; use builtin:tiny-llama or a data split such as builtin:preference_train")
    return str(getattr(assets, name))


def prepare_run_dir(run: RunConfig, config: StrictModel, is_master: bool) -> Path:
    """Create (or re-open, when resuming) the run directory and write config.yaml."""
    run_dir = Path(run.output_dir) / run.name
    if run.resume is None and run_dir.exists() and any(run_dir.iterdir()):
        if not run.overwrite:
            raise ConfigError(f"run directory {run_dir} already exists: pass run.resume=last to continue it or run.overwrite=true to start over")
        if is_master:
            shutil.rmtree(run_dir)
    if is_master:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(dump_config(config))
    return run_dir


def resume_checkpoint(run: RunConfig, run_dir: Path) -> Path | None:
    """The checkpoint directory `run.resume` names, or None for a fresh start."""
    if run.resume is None:
        return None
    if run.resume != "last":
        return Path(run.resume)
    manager = CheckpointManager(run_dir)
    manager.remove_stale_temporaries()
    row = manager.last()
    if row is None:
        logger.warning("run.resume=last but %s has no checkpoint yet: starting from scratch", run_dir)
        return None
    return run_dir / row.path


def build_plugin(cfg: PluginConfig, max_norm: float | None) -> Plugin:
    if cfg.name == "ddp":
        return TorchDDPPlugin(max_norm=max_norm, backend=cfg.backend)
    return SingleProcessPlugin(max_norm=max_norm)


def build_optimizer(model: torch.nn.Module, lr: float, weight_decay: float, betas: tuple[float, float]) -> torch.optim.Optimizer:
    """AdamW; biases and norm weights (1-D tensors) get no weight decay."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas)


def build_scheduler(optimizer: torch.optim.Optimizer, total_steps: int, warmup_ratio: float, min_lr_ratio: float):
    """Cosine decay to `min_lr_ratio * lr` after linear warmup, sized in optimizer steps."""
    warmup = int(round(warmup_ratio * total_steps))
    return get_cosine_with_min_lr_schedule_with_warmup(optimizer, warmup, max(total_steps, 1), min_lr_rate=min_lr_ratio)


def build_callbacks(specs: list[CallbackSpec]) -> list[Callback]:
    return [build_callback(spec.model_dump()) for spec in specs]


def make_booster(plugin_cfg: PluginConfig, max_norm: float | None) -> tuple[Booster, Plugin]:
    plugin = build_plugin(plugin_cfg, max_norm)
    return Booster(plugin=plugin), plugin
