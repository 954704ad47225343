"""`olingo sft`: supervised fine-tuning of a causal LM on assistant tokens.

The recipe, top to bottom:
    1. parse the config, seed, open the run directory (config.yaml)
    2. load the tokenizer and the causal LM
    3. load, validate and tokenise the conversations (errors name file, row, field)
    4. build dataloaders, AdamW and a cosine schedule sized in optimizer steps
    5. boost for the plugin, resume if asked, fit
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

from pydantic import Field

from olingo.cluster import DistCoordinator
from olingo.config import StrictModel
from olingo.dataset import SFTCollator, build_sft_dataset
from olingo.models import load_causal_lm, load_tokenizer
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
from olingo.trainer.sft import SFTTrainer
from olingo.trainer.utils import optimizer_steps_per_epoch, seed_everything

logger = logging.getLogger("olingo.sft")


class SFTModelConfig(StrictModel):
    """The causal LM to fine-tune."""

    path: str = Field("builtin:tiny-llama", description="HF directory or hub id of a causal LM")
    tokenizer: str | None = Field(None, description="tokenizer directory or hub id (default: model.path)")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="parameter dtype")
    trust_remote_code: bool = Field(False, description="allow model code from the hub")
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward to save memory")


class SFTDataConfig(StrictModel):
    """Conversations: {prompt, completion}, {messages: [{role, content}]} or ColossalChat's {messages: [{from, content}]}."""

    train: list[str] = Field(default_factory=lambda: ["builtin:sft_train"], description="JSON/JSONL/Parquet files, saved datasets or hub ids")
    eval: list[str] = Field(default_factory=lambda: ["builtin:sft_eval"], description="held-out conversations (empty list: no evaluation)")
    max_length: int = Field(512, description="tokens per row; longer rows lose their end")
    skip_invalid: bool = Field(False, description="skip bad rows (and log how many) instead of stopping")
    apply_loss_mask: bool = Field(True, description="train on assistant tokens only (false: on every token)")


class SFTConfig(StrictModel):
    """Supervised fine-tuning (`olingo sft`)."""

    run: RunConfig = Field(default_factory=lambda: RunConfig(name="sft"), description="run directory, seed, resume")
    model: SFTModelConfig = Field(default_factory=SFTModelConfig, description="model to train")
    data: SFTDataConfig = Field(default_factory=SFTDataConfig, description="conversations")
    train: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=2e-5, weight_decay=0.0, adam_betas=(0.9, 0.999)), description="optimisation")
    plugin: PluginConfig = Field(default_factory=PluginConfig, description="parallel strategy")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="loggers")
    callbacks: list[CallbackSpec] = Field(default_factory=list, description="extra callbacks, [{kind, params}]")


def run_sft(cfg: SFTConfig) -> dict:
    """Fine-tune as `cfg` says; returns the run directory, final model and eval metrics."""
    # 1. seed, plugin, run directory
    seed_everything(cfg.run.seed)
    booster, plugin = make_booster(cfg.plugin, cfg.train.max_grad_norm)
    coordinator = DistCoordinator()
    run_dir = prepare_run_dir(cfg.run, cfg, coordinator.is_master)
    coordinator.barrier()

    # 2. tokenizer and model
    tokenizer = load_tokenizer(resolve_path(cfg.model.tokenizer or cfg.model.path))
    model = load_causal_lm(resolve_path(cfg.model.path), dtype=cfg.model.dtype, trust_remote_code=cfg.model.trust_remote_code)
    if cfg.model.gradient_checkpointing:
        model.gradient_checkpointing_enable()

    # 3. data, validated before any training
    def dataset(sources: list[str]):
        return build_sft_dataset([resolve_path(s) for s in sources], tokenizer, cfg.data.max_length, skip_invalid=cfg.data.skip_invalid)

    train_set = dataset(cfg.data.train)
    eval_set = dataset(cfg.data.eval) if cfg.data.eval else None

    # 4. loaders, optimizer, schedule sized in optimizer steps
    collate = SFTCollator(tokenizer.pad_token_id)
    train_loader = plugin.prepare_dataloader(train_set, cfg.train.batch_size, shuffle=True, seed=cfg.run.seed, collate_fn=collate)
    eval_loader = plugin.prepare_dataloader(eval_set, cfg.train.eval_batch_size, shuffle=False, collate_fn=collate, even=False) if eval_set else None
    total_steps = cfg.train.epochs * optimizer_steps_per_epoch(len(train_loader), cfg.train.accumulation_steps)
    optimizer = build_optimizer(model, cfg.train.lr, cfg.train.weight_decay, cfg.train.adam_betas)
    scheduler = build_scheduler(optimizer, total_steps, cfg.train.warmup_ratio, cfg.train.min_lr_ratio)
    logger.info("%d training rows, %d optimizer steps, run directory %s", len(train_set), total_steps, run_dir)

    # 5. boost, resume, fit
    model, optimizer, _, _, scheduler = booster.boost(model, optimizer, lr_scheduler=scheduler)
    trainer = SFTTrainer(
        model=model, booster=booster, optim=optimizer, lr_scheduler=scheduler, max_epochs=cfg.train.epochs,
        plugin=plugin, accumulation_steps=cfg.train.accumulation_steps, apply_loss_mask=cfg.data.apply_loss_mask,
        save_interval=cfg.train.save_interval, save_dir=str(run_dir), coordinator=coordinator,
        tokenizer=tokenizer, callbacks=build_callbacks(cfg.callbacks), eval_interval=cfg.train.eval_interval,
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
