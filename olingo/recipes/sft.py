"""`olingo sft`: supervised fine-tuning of a causal LM on assistant tokens.

The recipe, top to bottom:
    1. parse the config, seed, open the run directory (config.yaml)
    2. load the tokenizer and the causal LM
    3. load, validate and tokenise the conversations (errors name file, row, field)
    4. build dataloaders, AdamW and a cosine schedule sized in optimizer steps
    5. boost for the plugin, resume if asked, fit
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from olingo.config import StrictModel
from olingo.dataset import SFTCollator, build_sft_dataset
from olingo.dataset.limits import OVERLONG_DESCRIPTION, Overlong
from olingo.models import load_causal_lm, load_tokenizer, name_stop_tokens, stop_token_ids
from olingo.recipes.common import (
    CallbackSpec,
    LoggingConfig,
    ModelConfig,
    OptimConfig,
    PluginConfig,
    RunConfig,
    build_callbacks,
    check_model_paths,
    check_room_for_text,
    enable_gradient_checkpointing,
    fit_run,
    loaders_and_optimizer,
    open_run,
    resolve_model_path,
    resolve_path,
)
from olingo.trainer.callbacks import Callback, LogContext
from olingo.trainer.loop_support import Evaluator
from olingo.trainer.sft import SFTTrainer


class SFTDataConfig(StrictModel):
    """Conversations: {prompt, completion}, {messages: [{role, content}]} or ColossalChat's {messages: [{from, content}]}."""

    train: list[str] = Field(default_factory=lambda: ["builtin:sft_train"], description="JSON/JSONL/Parquet files, saved datasets or hub ids")
    eval: list[str] = Field(default_factory=lambda: ["builtin:sft_eval"], description="held-out conversations (empty list: no evaluation)")
    max_length: int = Field(1024, gt=0, description="tokens per row, chat template included (a longer row: see data.overlong)")
    skip_invalid: bool = Field(False, description="skip bad rows (and log how many) instead of stopping")
    overlong: Overlong = Field("error", description=OVERLONG_DESCRIPTION)
    apply_loss_mask: bool = Field(True, description="train on assistant tokens only (false: on every token)")


class SFTConfig(StrictModel):
    """Supervised fine-tuning (`olingo sft`)."""

    run: RunConfig = Field(default_factory=lambda: RunConfig(name="sft"), description="run directory, seed, resume")
    model: ModelConfig = Field(default_factory=ModelConfig, description="model to train")
    data: SFTDataConfig = Field(default_factory=SFTDataConfig, description="conversations")
    train: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=2e-5, weight_decay=0.0, adam_betas=(0.9, 0.999)), description="optimisation")
    plugin: PluginConfig = Field(default_factory=PluginConfig, description="parallel strategy")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="loggers")
    callbacks: list[CallbackSpec] = Field(default_factory=list, description="extra callbacks, [{kind, params}]")


def run_sft(
    cfg: SFTConfig, *, callbacks: Sequence[Callback] = (), ctx: LogContext | None = None,
    evaluators: Sequence[Evaluator] = (),
) -> dict:
    """Fine-tune as `cfg` says; returns the run directory, final model and eval metrics."""
    # 1. seed, plugin, run directory
    setup = open_run(cfg.run, cfg.plugin, cfg.train.max_grad_norm, cfg, cfg.logging)

    # 2. tokenizer and model
    check_model_paths({"model.path": cfg.model.path, "model.tokenizer": cfg.model.tokenizer})
    source = resolve_model_path(cfg.model.path, cfg.model.gguf_file)
    tokenizer = load_tokenizer(resolve_model_path(cfg.model.tokenizer) if cfg.model.tokenizer else source, chat_template=cfg.model.chat_template)
    model = load_causal_lm(source, dtype=cfg.model.dtype, trust_remote_code=cfg.model.trust_remote_code)
    name_stop_tokens(model, stop_token_ids(tokenizer, source, required=False))  # the export's generate stops at end-of-turn
    model = cfg.model.lora.apply(model)
    if cfg.model.gradient_checkpointing:
        enable_gradient_checkpointing(model)

    # 3. data, validated before any training
    check_room_for_text(tokenizer, cfg.data.max_length, "data.max_length")
    def dataset(sources: list[str]):
        return build_sft_dataset([resolve_path(s) for s in sources], tokenizer, cfg.data.max_length, skip_invalid=cfg.data.skip_invalid,
                                 overlong=cfg.data.overlong, length_key="data.max_length")

    train_set, eval_set = dataset(cfg.data.train), (dataset(cfg.data.eval) if cfg.data.eval else None)

    # 4. loaders, optimizer, schedule sized in optimizer steps
    collate = SFTCollator(tokenizer.pad_token_id)
    train_loader, eval_loader, optimizer, scheduler = loaders_and_optimizer(setup, cfg.train, cfg.run.seed, model, train_set, eval_set, collate)

    # 5. boost, resume, fit
    model, optimizer, _, _, scheduler = setup.booster.boost(model, optimizer, lr_scheduler=scheduler)
    trainer = SFTTrainer(
        model=model, booster=setup.booster, optim=optimizer, lr_scheduler=scheduler, max_epochs=cfg.train.epochs,
        plugin=setup.plugin, accumulation_steps=cfg.train.accumulation_steps, apply_loss_mask=cfg.data.apply_loss_mask,
        save_interval=cfg.train.save_interval, save_dir=str(setup.run_dir), coordinator=setup.coordinator,
        tokenizer=tokenizer, callbacks=[*build_callbacks(cfg.callbacks), *callbacks], eval_interval=cfg.train.eval_interval,
        packing=cfg.model.packing,
    )
    return fit_run(trainer, cfg, setup, train_loader, eval_loader, ctx=ctx, evaluators=evaluators)
