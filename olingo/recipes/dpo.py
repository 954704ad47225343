"""`olingo dpo`, `olingo orpo`, `olingo kto`: offline preference optimisation of a causal LM.

The recipe, top to bottom (the same for the three):
    1. parse the config, seed, check the run directory
    2. load the tokenizer, the policy (LoRA when asked) and, for the losses that need one, the
       reference: a frozen copy of `model.reference` (default `model.path`), or with LoRA the
       policy's own base with adapters disabled (no second copy)
    3. load, validate and tokenise the data (errors name file, row, field): preference pairs for
       DPO and ORPO; unpaired rows (or pairs split in two) for KTO
    4. build dataloaders, AdamW and a cosine schedule sized in optimizer steps
    5. boost for the plugin, resume if asked, fit (precomputing reference log-probs first when
       asked; every forward padding-free with model.packing), report the held-out metrics
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from olingo.config import ConfigError, StrictModel
from olingo.dataset import (
    PreferenceCollator,
    UnpairedCollator,
    build_preference_dataset,
    build_unpaired_dataset,
)
from olingo.dataset.limits import OVERLONG_DESCRIPTION, Overlong
from olingo.models import load_causal_lm, load_tokenizer, name_stop_tokens, stop_token_ids
from olingo.recipes.common import (
    CallbackSpec,
    LoggingConfig,
    ModelConfig,
    OptimConfig,
    PluginConfig,
    RunConfig,
    RunSetup,
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
from olingo.trainer.dpo import DPOTrainer
from olingo.trainer.kto import KTOTrainer
from olingo.trainer.loop_support import Evaluator
from olingo.trainer.orpo import ORPOTrainer


class PolicyModelConfig(ModelConfig):
    """The policy to train, and its reference."""

    reference: str | None = Field(None, description=(
        "reference policy for the losses that need one (default: model.path; with LoRA: model.path's base with adapters disabled, no second copy)"))


class PairDataConfig(StrictModel):
    """Preference pairs: {prompt, chosen, rejected} as strings or messages, TRL's conversational rows, or ColossalChat's {context, chosen, rejected}."""

    train: list[str] = Field(default_factory=lambda: ["builtin:preference_train"], description="JSON/JSONL/Parquet files, saved datasets or hub ids")
    eval: list[str] = Field(default_factory=lambda: ["builtin:preference_eval"], description="held-out pairs (empty list: no evaluation)")
    max_length: int = Field(1024, gt=0, description="tokens per sequence (prompt + response, chat template included; a longer row: see data.overlong)")
    skip_invalid: bool = Field(False, description="skip bad rows (and log how many) instead of stopping")
    overlong: Overlong = Field("error", description=OVERLONG_DESCRIPTION)
    apply_loss_mask: bool = Field(True, description="log-probs over the response tokens only (false: over every token, prompt included)")


class UnpairedDataConfig(PairDataConfig):
    """KTO rows: {prompt, completion, label: true|false} (TRL's unpaired format), or preference pairs, each split into a desirable and an undesirable row."""


class DPOSettings(StrictModel):
    """The DPO family's loss (docs/algorithms.md: which to pick)."""

    loss_type: Literal["sigmoid", "cdpo", "ipo", "simpo"] = Field("sigmoid", description=(
        "sigmoid = DPO; cdpo = DPO with label_smoothing; ipo = IPO on token-mean log-probs; simpo = SimPO, reference-free"))
    beta: float = Field(0.1, gt=0, description="inverse temperature: strength of the KL to the reference (SimPO: reward scale, typically 2-10)")
    gamma: float = Field(0.0, ge=0, description="target reward margin (SimPO's gamma; 0 for plain DPO)")
    label_smoothing: float = Field(0.0, ge=0, lt=0.5, description="cDPO: probability that a pair's preference is flipped (loss_type=cdpo)")
    length_normalization: bool = Field(False, description=(
        "token-mean instead of summed log-probs in the sigmoid/cdpo loss (SimPO and IPO always use token means)"))
    precompute_ref_log_probs: bool = Field(False, description=(
        "one reference pass before training, cached in <run>/cache/; the reference model is then freed (SimPO has no reference: no effect)"))

    @model_validator(mode="after")
    def _consistent(self) -> DPOSettings:
        if self.loss_type == "cdpo" and self.label_smoothing == 0:
            raise ValueError("dpo.loss_type=cdpo needs dpo.label_smoothing > 0 (e.g. 0.1)")
        if self.loss_type != "cdpo" and self.label_smoothing:
            raise ValueError(f"dpo.label_smoothing is cDPO's: set dpo.loss_type=cdpo (got {self.loss_type})")
        if self.loss_type == "ipo" and self.gamma:
            raise ValueError("dpo.gamma does not apply to IPO (its target margin is 1 / (2 beta))")
        return self


class ORPOSettings(StrictModel):
    """ORPO's loss: NLL of the chosen response + lam x the odds-ratio term."""

    lam: float = Field(0.1, ge=0, description="weight of the odds-ratio term (the paper's lambda)")


class KTOSettings(StrictModel):
    """KTO's loss on desirable and undesirable rows."""

    beta: float = Field(0.1, gt=0, description="inverse temperature of the value function")
    desirable_weight: float = Field(1.0, ge=0, description="weight of desirable rows (raise it when they are rarer: aim for weight x count about equal)")
    undesirable_weight: float = Field(1.0, ge=0, description="weight of undesirable rows")
    precompute_ref_log_probs: bool = Field(False, description="one reference pass before training, cached in <run>/cache/; the reference model is then freed")


def _train_defaults() -> OptimConfig:
    return OptimConfig(lr=5e-7, weight_decay=0.0, adam_betas=(0.9, 0.999), epochs=1)


class DPOConfig(StrictModel):
    """Direct preference optimisation and its variants (`olingo dpo`)."""

    run: RunConfig = Field(default_factory=lambda: RunConfig(name="dpo"), description="run directory, seed, resume")
    model: PolicyModelConfig = Field(default_factory=PolicyModelConfig, description="policy to train (usually an SFT model) and its reference")
    data: PairDataConfig = Field(default_factory=PairDataConfig, description="preference pairs")
    dpo: DPOSettings = Field(default_factory=DPOSettings, description="the loss")
    train: OptimConfig = Field(default_factory=_train_defaults, description="optimisation")
    plugin: PluginConfig = Field(default_factory=PluginConfig, description="parallel strategy")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="loggers")
    callbacks: list[CallbackSpec] = Field(default_factory=list, description="extra callbacks, [{kind, params}]")


class ORPOConfig(StrictModel):
    """Odds-ratio preference optimisation, SFT and preference in one loss, no reference (`olingo orpo`)."""

    run: RunConfig = Field(default_factory=lambda: RunConfig(name="orpo"), description="run directory, seed, resume")
    model: ModelConfig = Field(default_factory=ModelConfig, description="policy to train (a base or SFT model)")
    data: PairDataConfig = Field(default_factory=PairDataConfig, description="preference pairs")
    orpo: ORPOSettings = Field(default_factory=ORPOSettings, description="the loss")
    train: OptimConfig = Field(default_factory=_train_defaults, description="optimisation")
    plugin: PluginConfig = Field(default_factory=PluginConfig, description="parallel strategy")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="loggers")
    callbacks: list[CallbackSpec] = Field(default_factory=list, description="extra callbacks, [{kind, params}]")


class KTOConfig(StrictModel):
    """Kahneman-Tversky optimisation on rows labelled desirable or undesirable (`olingo kto`)."""

    run: RunConfig = Field(default_factory=lambda: RunConfig(name="kto"), description="run directory, seed, resume")
    model: PolicyModelConfig = Field(default_factory=PolicyModelConfig, description="policy to train (usually an SFT model) and its reference")
    data: UnpairedDataConfig = Field(default_factory=UnpairedDataConfig, description="labelled completions (or pairs, split)")
    kto: KTOSettings = Field(default_factory=KTOSettings, description="the loss")
    train: OptimConfig = Field(default_factory=_train_defaults, description="optimisation")
    plugin: PluginConfig = Field(default_factory=PluginConfig, description="parallel strategy")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="loggers")
    callbacks: list[CallbackSpec] = Field(default_factory=list, description="extra callbacks, [{kind, params}]")


@dataclass
class PolicyModels:
    tokenizer: Any
    actor: torch.nn.Module
    reference: torch.nn.Module | None  # None: no reference, or (LoRA) the base with adapters disabled


def load_policy(model: ModelConfig, needs_reference: bool, device: torch.device) -> PolicyModels:
    """Tokenizer, the trained policy (LoRA when asked) and its frozen reference when a separate
    one is needed: none for reference-free losses, none for LoRA without `model.reference`."""
    reference_path = getattr(model, "reference", None)
    check_model_paths({"model.path": model.path, "model.tokenizer": model.tokenizer, "model.reference": reference_path})
    source = resolve_model_path(model.path, model.gguf_file)
    tokenizer = load_tokenizer(resolve_model_path(model.tokenizer) if model.tokenizer else source, chat_template=model.chat_template)
    load = {"dtype": model.dtype, "trust_remote_code": model.trust_remote_code}
    actor = model.lora.apply(load_causal_lm(source, **load))
    name_stop_tokens(actor, stop_token_ids(tokenizer, source, required=False))  # the export's generate stops at end-of-turn
    if model.gradient_checkpointing:
        enable_gradient_checkpointing(actor)
    reference = None
    if needs_reference and (reference_path or not model.lora.enabled):
        reference = load_causal_lm(resolve_model_path(reference_path) if reference_path else source, **load).eval().requires_grad_(False).to(device)
    return PolicyModels(tokenizer, actor, reference)


def _run_offline(
    cfg: DPOConfig | ORPOConfig | KTOConfig, needs_reference: bool, build_dataset: Callable, collate_of: Callable[[Any], Any],
    make_trainer: Callable[..., Any], callbacks: Sequence[Callback], ctx: LogContext | None, evaluators: Sequence[Evaluator],
) -> dict:
    """Steps 1-5 of the module docstring; `make_trainer(common keywords, models)` builds the trainer."""
    check_offline_config(cfg)
    # 1. seed, plugin, run directory
    setup: RunSetup = open_run(cfg.run, cfg.plugin, cfg.train.max_grad_norm, cfg, cfg.logging)

    # 2. policy, and its reference when the loss needs a separate one
    models = load_policy(cfg.model, needs_reference, setup.booster.device)
    tokenizer, reference = models.tokenizer, models.reference

    # 3. data, validated before any training
    check_room_for_text(tokenizer, cfg.data.max_length, "data.max_length")
    def dataset(sources: list[str]):
        return build_dataset([resolve_path(s) for s in sources], tokenizer, cfg.data.max_length, skip_invalid=cfg.data.skip_invalid,
                             overlong=cfg.data.overlong, length_key="data.max_length")

    train_set, eval_set = dataset(cfg.data.train), (dataset(cfg.data.eval) if cfg.data.eval else None)

    # 4. loaders, optimizer, schedule sized in optimizer steps
    loaders = loaders_and_optimizer(setup, cfg.train, cfg.run.seed, models.actor, train_set, eval_set, collate_of(tokenizer))
    train_loader, eval_loader, optimizer, scheduler = loaders

    # 5. boost, build the trainer, resume, fit
    actor, optimizer, _, _, scheduler = setup.booster.boost(models.actor, optimizer, lr_scheduler=scheduler)
    common = {
        "actor": actor, "booster": setup.booster, "actor_optim": optimizer, "plugin": setup.plugin,
        "actor_lr_scheduler": scheduler, "tokenizer": tokenizer, "max_epochs": cfg.train.epochs,
        "apply_loss_mask": cfg.data.apply_loss_mask, "accumulation_steps": cfg.train.accumulation_steps,
        "save_interval": cfg.train.save_interval, "save_dir": str(setup.run_dir), "coordinator": setup.coordinator,
        "callbacks": [*build_callbacks(cfg.callbacks), *callbacks], "eval_interval": cfg.train.eval_interval,
        "packing": cfg.model.packing,
    }
    if needs_reference:
        common["precompute_batch_size"] = cfg.train.eval_batch_size
    trainer = make_trainer(common, reference)
    del models, reference  # the trainer owns the reference now and frees it once precomputed
    return fit_run(trainer, cfg, setup, train_loader, eval_loader, ctx=ctx, evaluators=evaluators)


def _pair_collate(tokenizer: Any) -> PreferenceCollator:
    # Right padding: positions then count from each row's first token, as in generation.
    return PreferenceCollator(tokenizer.pad_token_id, padding_side="right")


def run_dpo(cfg: DPOConfig, *, callbacks: Sequence[Callback] = (), ctx: LogContext | None = None, evaluators: Sequence[Evaluator] = ()) -> dict:
    """Train with the DPO family's loss as `cfg` says; returns the run directory, final model and eval metrics."""
    d = cfg.dpo

    def make_trainer(common: dict, reference: torch.nn.Module | None) -> DPOTrainer:
        return DPOTrainer(
            ref_model=reference, beta=d.beta, gamma=d.gamma, length_normalization=d.length_normalization,
            loss_type=d.loss_type, label_smoothing=d.label_smoothing,
            precompute_ref_log_probs=d.precompute_ref_log_probs and d.loss_type != "simpo", **common,
        )

    return _run_offline(cfg, d.loss_type != "simpo", build_preference_dataset, _pair_collate, make_trainer, callbacks, ctx, evaluators)


def run_orpo(cfg: ORPOConfig, *, callbacks: Sequence[Callback] = (), ctx: LogContext | None = None, evaluators: Sequence[Evaluator] = ()) -> dict:
    """Train with ORPO as `cfg` says; returns the run directory, final model and eval metrics."""

    def make_trainer(common: dict, reference: None) -> ORPOTrainer:
        return ORPOTrainer(lam=cfg.orpo.lam, **common)

    return _run_offline(cfg, False, build_preference_dataset, _pair_collate, make_trainer, callbacks, ctx, evaluators)


def run_kto(cfg: KTOConfig, *, callbacks: Sequence[Callback] = (), ctx: LogContext | None = None, evaluators: Sequence[Evaluator] = ()) -> dict:
    """Train with KTO as `cfg` says; returns the run directory, final model and eval metrics."""
    k = cfg.kto

    def make_trainer(common: dict, reference: torch.nn.Module | None) -> KTOTrainer:
        return KTOTrainer(
            ref_model=reference, beta=k.beta, desirable_weight=k.desirable_weight, undesirable_weight=k.undesirable_weight,
            precompute_ref_log_probs=k.precompute_ref_log_probs, **common,
        )

    def collate(tokenizer: Any) -> UnpairedCollator:
        return UnpairedCollator(tokenizer.pad_token_id, max_length=cfg.data.max_length)

    return _run_offline(cfg, True, build_unpaired_dataset, collate, make_trainer, callbacks, ctx, evaluators)


def check_offline_config(cfg: DPOConfig | ORPOConfig | KTOConfig) -> None:
    """Config errors only visible across sections, raised before anything loads."""
    reference = getattr(cfg.model, "reference", None)
    if isinstance(cfg, DPOConfig) and cfg.dpo.loss_type == "simpo" and reference:
        raise ConfigError("model.reference is set, but dpo.loss_type=simpo uses no reference")
