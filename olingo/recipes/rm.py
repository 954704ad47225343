"""`olingo rm`: train a reward model on preference pairs.

The recipe, top to bottom:
    1. parse the config, seed, open the run directory (config.yaml)
    2. load the tokenizer and the reward model (backbone + new value head, or a saved RM), padded
       with a token no chat row holds (see `use_scoring_pad_token`)
    3. load, validate and tokenise the preference data (errors name file, row, field)
    4. build dataloaders, AdamW and a cosine schedule sized in optimizer steps
    5. boost for the plugin, resume if asked, fit, report the held-out accuracy
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field

from olingo.config import StrictModel
from olingo.dataset import PreferenceCollator, build_preference_dataset
from olingo.dataset.limits import OVERLONG_DESCRIPTION, Overlong
from olingo.models import LogExpLoss, LogSigLoss, RewardModel, load_tokenizer
from olingo.models.reward_model import use_scoring_pad_token
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
from olingo.trainer.rm import RewardModelTrainer


class RMDataConfig(StrictModel):
    """Preference data: {prompt, chosen, rejected} as strings or messages, or ColossalChat's {context, chosen, rejected}."""

    train: list[str] = Field(default_factory=lambda: ["builtin:preference_train"], description="JSON/JSONL/Parquet files, saved datasets or hub ids")
    eval: list[str] = Field(default_factory=lambda: ["builtin:preference_eval"], description="held-out pairs (empty list: no evaluation)")
    max_length: int = Field(1024, gt=0, description="tokens per sequence (prompt + response, chat template included; a longer row: see data.overlong)")
    skip_invalid: bool = Field(False, description="skip bad rows (and log how many) instead of stopping")
    overlong: Overlong = Field("error", description=OVERLONG_DESCRIPTION)


class RMTrainConfig(OptimConfig):
    """Optimisation, plus the pairwise loss."""

    loss: Literal["logsig", "logexp"] = Field("logsig", description="pairwise loss")
    beta: float = Field(1.0, gt=0, description="inverse temperature of the preference model in the loss")
    share_prompt: bool = Field(
        True,
        description="run each pair's shared opening (its prompt) once, its keys and values reused by the chosen and the rejected row, "
        "where that fills a tenth fewer token slots: the same scores and gradient up to float rounding (docs/reward-models.md)",
    )


class RMConfig(StrictModel):
    """Reward-model training (`olingo rm`)."""

    run: RunConfig = Field(default_factory=lambda: RunConfig(name="rm"), description="run directory, seed, resume")
    model: ModelConfig = Field(default_factory=ModelConfig, description=(
        "model to train (rm: a causal LM gets a new value head; a saved reward model continues)"))
    data: RMDataConfig = Field(default_factory=RMDataConfig, description="preference data")
    train: RMTrainConfig = Field(default_factory=RMTrainConfig, description="optimisation")
    plugin: PluginConfig = Field(default_factory=PluginConfig, description="parallel strategy")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="loggers")
    callbacks: list[CallbackSpec] = Field(default_factory=list, description="extra callbacks, [{kind, params}]")


def run_rm(
    cfg: RMConfig, *, callbacks: Sequence[Callback] = (), ctx: LogContext | None = None,
    evaluators: Sequence[Evaluator] = (),
) -> dict:
    """Train a reward model as `cfg` says; returns the run directory and final eval metrics."""
    # 1. seed, plugin, run directory
    setup = open_run(cfg.run, cfg.plugin, cfg.train.max_grad_norm, cfg, cfg.logging)

    # 2. tokenizer and model: a new value head on a causal LM, or a saved reward model
    check_model_paths({"model.path": cfg.model.path, "model.tokenizer": cfg.model.tokenizer})
    source = resolve_model_path(cfg.model.path, cfg.model.gguf_file)
    tokenizer = load_tokenizer(resolve_model_path(cfg.model.tokenizer) if cfg.model.tokenizer else source, chat_template=cfg.model.chat_template)
    model = RewardModel.from_pretrained(source, dtype=cfg.model.dtype, trust_remote_code=cfg.model.trust_remote_code)
    # A pad id no chat row holds (not eos, which rows end with), in the model and the saved
    # tokenizer alike: the export then scores in transformers exactly as olingo does.
    use_scoring_pad_token(model, tokenizer)
    model = cfg.model.lora.apply(model)
    if cfg.model.gradient_checkpointing:
        enable_gradient_checkpointing(model)

    # 3. data, validated before any training
    check_room_for_text(tokenizer, cfg.data.max_length, "data.max_length")
    def dataset(sources: list[str]):
        return build_preference_dataset([resolve_path(s) for s in sources], tokenizer, cfg.data.max_length, skip_invalid=cfg.data.skip_invalid,
                                        overlong=cfg.data.overlong, length_key="data.max_length")

    train_set, eval_set = dataset(cfg.data.train), (dataset(cfg.data.eval) if cfg.data.eval else None)

    # 4. loaders, optimizer, schedule sized in optimizer steps
    collate = PreferenceCollator(tokenizer.pad_token_id, padding_side=tokenizer.padding_side)
    train_loader, eval_loader, optimizer, scheduler = loaders_and_optimizer(setup, cfg.train, cfg.run.seed, model, train_set, eval_set, collate)
    loss_fn = (LogSigLoss if cfg.train.loss == "logsig" else LogExpLoss)(beta=cfg.train.beta)

    # 5. boost, resume, fit
    model, optimizer, _, _, scheduler = setup.booster.boost(model, optimizer, lr_scheduler=scheduler)
    trainer = RewardModelTrainer(
        model=model, booster=setup.booster, optimizer=optimizer, plugin=setup.plugin, lr_scheduler=scheduler,
        tokenizer=tokenizer, loss_fn=loss_fn, max_epochs=cfg.train.epochs, beta=cfg.train.beta,
        accumulation_steps=cfg.train.accumulation_steps, save_interval=cfg.train.save_interval,
        save_dir=str(setup.run_dir), coordinator=setup.coordinator, callbacks=[*build_callbacks(cfg.callbacks), *callbacks],
        eval_interval=cfg.train.eval_interval, packing=cfg.model.packing, share_prompt=cfg.train.share_prompt,
    )
    return fit_run(trainer, cfg, setup, train_loader, eval_loader, ctx=ctx, evaluators=evaluators)
