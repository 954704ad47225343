"""`olingo rm`: train a reward model on preference pairs.

The recipe, top to bottom:
    1. parse the config, seed, open the run directory (config.yaml)
    2. load the tokenizer and the reward model (backbone + new value head, or a saved RM)
    3. load, validate and tokenise the preference data (errors name file, row, field)
    4. build dataloaders, AdamW and a cosine schedule sized in optimizer steps
    5. boost for the plugin, resume if asked, fit, report the held-out accuracy
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

from pydantic import Field

from olingo.cluster import DistCoordinator
from olingo.config import StrictModel
from olingo.dataset import PreferenceCollator, build_preference_dataset
from olingo.models import LogExpLoss, LogSigLoss, RewardModel, load_tokenizer
from olingo.recipes.common import (
    CallbackSpec,
    LoggingConfig,
    OptimConfig,
    PluginConfig,
    RunConfig,
    build_callbacks,
    build_optimizer,
    build_scheduler,
    make_booster,
    prepare_run_dir,
    resolve_path,
    resume_checkpoint,
)
from olingo.trainer.rm import RewardModelTrainer
from olingo.trainer.utils import optimizer_steps_per_epoch, seed_everything

logger = logging.getLogger("olingo.rm")


class RMModelConfig(StrictModel):
    """The model to train."""

    path: str = Field("builtin:tiny-llama", description="HF directory or hub id: a causal LM (a new value head is added) or a saved reward model")
    tokenizer: str | None = Field(None, description="tokenizer directory or hub id (default: model.path)")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="parameter dtype")
    trust_remote_code: bool = Field(False, description="allow model code from the hub")
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward to save memory")


class RMDataConfig(StrictModel):
    """Preference data: {prompt, chosen, rejected} as strings or messages, or ColossalChat's {context, chosen, rejected}."""

    train: list[str] = Field(default_factory=lambda: ["builtin:preference_train"], description="JSON/JSONL/Parquet files, saved datasets or hub ids")
    eval: list[str] = Field(default_factory=lambda: ["builtin:preference_eval"], description="held-out pairs (empty list: no evaluation)")
    max_length: int = Field(128, description="tokens per sequence; longer rows lose the start of the prompt")
    skip_invalid: bool = Field(False, description="skip bad rows (and log how many) instead of stopping")


class RMTrainConfig(OptimConfig):
    """Optimisation, plus the pairwise loss."""

    loss: Literal["logsig", "logexp"] = Field("logsig", description="pairwise loss")
    beta: float = Field(1.0, description="inverse temperature of the preference model in the loss")


class RMConfig(StrictModel):
    """Reward-model training (`olingo rm`)."""

    run: RunConfig = Field(default_factory=lambda: RunConfig(name="rm"), description="run directory, seed, resume")
    model: RMModelConfig = Field(default_factory=RMModelConfig, description="model to train")
    data: RMDataConfig = Field(default_factory=RMDataConfig, description="preference data")
    train: RMTrainConfig = Field(default_factory=RMTrainConfig, description="optimisation")
    plugin: PluginConfig = Field(default_factory=PluginConfig, description="parallel strategy")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="loggers")
    callbacks: list[CallbackSpec] = Field(default_factory=list, description="extra callbacks, [{kind, params}]")


def run_rm(cfg: RMConfig) -> dict:
    """Train a reward model as `cfg` says; returns the run directory and final eval metrics."""
    # 1. seed, plugin, run directory
    seed_everything(cfg.run.seed)
    booster, plugin = make_booster(cfg.plugin, cfg.train.max_grad_norm)
    coordinator = DistCoordinator()
    run_dir = prepare_run_dir(cfg.run, cfg, coordinator.is_master)
    coordinator.barrier()

    # 2. tokenizer and model
    model_path = resolve_path(cfg.model.path)
    tokenizer = load_tokenizer(resolve_path(cfg.model.tokenizer or cfg.model.path))
    model = RewardModel.from_pretrained(model_path, pad_token_id=tokenizer.pad_token_id, dtype=cfg.model.dtype, trust_remote_code=cfg.model.trust_remote_code)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()

    # 3. data, validated before any training
    train_set = build_preference_dataset([resolve_path(s) for s in cfg.data.train], tokenizer, cfg.data.max_length, skip_invalid=cfg.data.skip_invalid)
    eval_set = build_preference_dataset([resolve_path(s) for s in cfg.data.eval], tokenizer, cfg.data.max_length, skip_invalid=cfg.data.skip_invalid) if cfg.data.eval else None

    # 4. loaders, optimizer, schedule sized in optimizer steps
    collate = PreferenceCollator(tokenizer.pad_token_id, padding_side=tokenizer.padding_side)
    train_loader = plugin.prepare_dataloader(train_set, cfg.train.batch_size, shuffle=True, seed=cfg.run.seed, collate_fn=collate)
    eval_loader = plugin.prepare_dataloader(eval_set, cfg.train.eval_batch_size, shuffle=False, collate_fn=collate, even=False) if eval_set else None
    total_steps = cfg.train.epochs * optimizer_steps_per_epoch(len(train_loader), cfg.train.accumulation_steps)
    optimizer = build_optimizer(model, cfg.train.lr, cfg.train.weight_decay, cfg.train.adam_betas)
    scheduler = build_scheduler(optimizer, total_steps, cfg.train.warmup_ratio, cfg.train.min_lr_ratio)
    loss_fn = (LogSigLoss if cfg.train.loss == "logsig" else LogExpLoss)(beta=cfg.train.beta)
    logger.info("%d training pairs, %d optimizer steps, run directory %s", len(train_set), total_steps, run_dir)

    # 5. boost, resume, fit
    model, optimizer, _, _, scheduler = booster.boost(model, optimizer, lr_scheduler=scheduler)
    trainer = RewardModelTrainer(
        model=model, booster=booster, optimizer=optimizer, plugin=plugin, lr_scheduler=scheduler,
        tokenizer=tokenizer, loss_fn=loss_fn, max_epochs=cfg.train.epochs, beta=cfg.train.beta,
        accumulation_steps=cfg.train.accumulation_steps, save_interval=cfg.train.save_interval,
        save_dir=str(run_dir), coordinator=coordinator, callbacks=build_callbacks(cfg.callbacks),
        eval_interval=cfg.train.eval_interval,
    )
    trainer.show_progress = cfg.logging.progress
    trainer.run_config = cfg.model_dump(mode="json")
    checkpoint = resume_checkpoint(cfg.run, run_dir)
    if checkpoint is not None:
        trainer.load_checkpoint(checkpoint)
    artifacts = trainer.fit(train_loader, eval_loader, log_dir=str(run_dir), use_wandb=cfg.logging.wandb)
    return {
        "run_dir": str(run_dir),
        "final_model": str(Path(run_dir) / "checkpoints" / "final" / "model"),
        "eval": trainer.last_eval_metrics,
        "steps": artifacts.completed_steps,
    }
