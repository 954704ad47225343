"""`olingo grpo`: the GRPO family from an SFT model against reward programs (and/or a reward model).

The recipe, top to bottom (`run_grpo`):
    1. call each user function once on a prompt row (`probe_user_functions`); seed, plugin;
       check the run directory and the checkpoint to resume
    2. load the tokenizer, the policy, the reward and, only when experience.kl_coef > 0, the
       frozen reference (with LoRA: the policy with its adapters disabled; no critic exists)
    3. load and validate prompts (and pretrain rows for the ptx loss); sharded loaders
    4. optimizer and schedule sized in optimizer steps; boost; the trainer
    5. resume if asked, write the run directory, fit, report held-out metrics
GRPO, Dr. GRPO, DAPO, RLOO and REINFORCE++ are settings of one trainer (docs/algorithms.md).
With `ray.enabled` the same config runs on Ray actors (`olingo.recipes.grpo_ray`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from olingo.config import ConfigError
from olingo.models import load_causal_lm, load_tokenizer, name_stop_tokens, stop_token_ids
from olingo.models.lora import AdaptersDisabled
from olingo.recipes.common import (
    RunSetup,
    attach_experiment,
    build_callbacks,
    build_rollout_engine,
    check_engine_config,
    check_model_paths,
    enable_gradient_checkpointing,
    open_run,
    optimizer_and_schedule,
    resolve_model_path,
)
from olingo.recipes.grpo_config import GRPOConfig, GRPOLoopConfig
from olingo.recipes.ppo import PPOData, load_data, resume_and_fit
from olingo.recipes.ppo_config import generate_kwargs
from olingo.recipes.rewards import load_reward, probe_user_functions
from olingo.rewards.functions import CompositeReward, reward_function
from olingo.trainer.callbacks import Callback, LogContext
from olingo.trainer.callbacks.builtin import PerformanceEvaluator
from olingo.trainer.grpo import GRPOTrainer, grpo_steps_per_episode
from olingo.trainer.loop_support import Evaluator


@dataclass
class GRPOModels:
    """What `load_models` loads: the tokenizer, the trained policy, the reward and the frozen
    reference (None when the KL coefficient is 0: it is never loaded; with LoRA, by default, an
    `AdaptersDisabled` view of the policy)."""

    tokenizer: Any
    actor: torch.nn.Module
    reward: Any
    reference: torch.nn.Module | None
    stop_token_ids: list[int]  # where responses end (the tokenizer's and the policy's eos ids)


def load_models(cfg: GRPOConfig, inference_device: torch.device | str) -> GRPOModels:
    """Policy (LoRA when asked), reward, and the reference only when the KL term needs it: with
    LoRA and no `model.reference`, the policy itself with its adapters disabled."""
    m = cfg.model
    check_model_paths({"model.actor": m.actor, "model.reference": m.reference, "model.tokenizer": m.tokenizer, "reward.model": cfg.reward.model})
    source = resolve_model_path(m.actor, m.gguf_file)
    tokenizer = load_tokenizer(resolve_model_path(m.tokenizer) if m.tokenizer else source, padding_side="left", chat_template=m.chat_template)
    stops = stop_token_ids(tokenizer, source)
    load = dict(dtype=m.dtype, trust_remote_code=m.trust_remote_code)
    actor = m.lora.apply(load_causal_lm(source, **load))
    name_stop_tokens(actor, stops)  # the export's generate stops where rollouts do
    reference = None
    if cfg.experience.kl_coef > 0 and m.lora.enabled and not m.reference:
        reference = AdaptersDisabled(actor)  # the base the adapters start from: no second copy
    elif cfg.experience.kl_coef > 0:
        reference = load_causal_lm(resolve_model_path(m.reference) if m.reference else source, **load).eval().requires_grad_(False).to(inference_device)
    reward = load_reward(cfg.reward, tokenizer, m.dtype, m.trust_remote_code)
    if m.gradient_checkpointing:
        enable_gradient_checkpointing(actor)
    if isinstance(reward, torch.nn.Module | CompositeReward):
        reward.to(inference_device)
    return GRPOModels(tokenizer, actor, reward, reference, stops)


def total_optimizer_steps(loop: GRPOLoopConfig, num_generations: int) -> int:
    """Optimizer steps of the whole run, the unit the schedule is sized in."""
    return loop.episodes * grpo_steps_per_episode(
        loop.collect_steps, loop.rollout_batch_size, num_generations, loop.update_steps, loop.train_batch_size, loop.accumulation_steps,
        buffer_limit=loop.buffer_limit, sample_buffer=loop.sample_buffer,
    )


def build_trainer(cfg: GRPOConfig, setup: RunSetup, models: GRPOModels, callbacks: Sequence[Callback]) -> GRPOTrainer:
    """AdamW and a cosine schedule for the policy, boosted, and the trainer with its sections."""
    loop, exp = cfg.loop, cfg.experience
    optim, scheduler = optimizer_and_schedule(models.actor, cfg.actor_optim, total_optimizer_steps(loop, exp.num_generations))
    actor, optim, _, _, scheduler = setup.booster.boost(models.actor, optim, lr_scheduler=scheduler)
    trainer = GRPOTrainer(
        setup.booster, actor, models.reward, models.reference, optim, scheduler, models.tokenizer,
        kl_coef=exp.kl_coef, ptx_coef=cfg.loss.ptx_coef, train_batch_size=loop.train_batch_size, buffer_limit=loop.buffer_limit,
        sample_buffer=loop.sample_buffer, offload_inference_models=loop.offload_inference_models, accumulation_steps=loop.accumulation_steps,
        save_interval=loop.save_interval, save_dir=str(setup.run_dir), num_generation=exp.num_generations,
        inference_batch_size=exp.inference_batch_size, logits_forward_batch_size=exp.logits_forward_batch_size, coordinator=setup.coordinator,
        callbacks=[PerformanceEvaluator(), *build_callbacks(cfg.callbacks), *callbacks],
        experience_config=exp, loss_config=cfg.loss, eval_interval=loop.eval_interval, eval_before_training=loop.eval_before_training,
        accuracy_fn=reward_function(loop.accuracy_function) if loop.accuracy_function else None,
        eval_generate_kwargs={"temperature": loop.eval_temperature} if loop.eval_temperature is not None else None,
        engine=build_rollout_engine(cfg.generation.engine, cfg.generation.vllm, cfg.model.actor, models.tokenizer, setup.plugin.device, cfg.model.gguf_file),
        **generate_kwargs(cfg.generation, models.stop_token_ids),
    )
    trainer.show_progress = cfg.logging.progress
    trainer.run_config = cfg.model_dump(mode="json")
    return trainer


def check_grpo_config(cfg: GRPOConfig) -> None:
    """What one section alone cannot check."""
    if cfg.loss.ptx_coef > 0 and not cfg.data.pretrain:
        raise ConfigError("loss.ptx_coef > 0 needs data.pretrain (SFT-format rows for the ptx loss)")
    if cfg.experience.overlong_buffer > cfg.generation.max_new_tokens:
        raise ConfigError(
            f"experience.overlong_buffer ({cfg.experience.overlong_buffer}) is longer than generation.max_new_tokens "
            f"({cfg.generation.max_new_tokens}): the penalty zone must fit inside the length limit"
        )


def run_grpo(cfg: GRPOConfig, *, callbacks: Sequence[Callback] = (), ctx: LogContext | None = None, evaluators: Sequence[Evaluator] = ()) -> dict:
    """Train with the GRPO family as `cfg` says; returns the run directory, final policy and eval metrics."""
    if cfg.ray.enabled:
        if ctx is not None or evaluators:
            raise ConfigError("ray.enabled is not available inside an experiment: its callbacks run in the trainer actor, not here")
        from olingo.recipes.grpo_ray import run_grpo_ray  # imports ray: only when asked for

        return run_grpo_ray(cfg, callbacks=callbacks)
    check_grpo_config(cfg)
    probe_user_functions(cfg.reward, cfg.loop.accuracy_function, cfg.data.prompts, cfg.data.eval_prompts)  # seconds, before any model loads
    # 1. seed, plugin, the run directory and checkpoint to resume (checked; written before fit)
    setup = open_run(cfg.run, cfg.plugin, cfg.actor_optim.max_grad_norm, cfg, cfg.logging)
    check_engine_config(cfg.generation.engine, setup.plugin, ray_enabled=False)
    # 2. models: policy, reward, reference only with a KL term
    models = load_models(cfg, "cpu" if cfg.loop.offload_inference_models else setup.plugin.device)
    # 3. data, validated before any training
    data: PPOData = load_data(cfg, models.tokenizer, setup.plugin)
    # 4. optimizer, schedule, the trainer
    trainer = build_trainer(cfg, setup, models, callbacks)
    attach_experiment(trainer, ctx, evaluators)
    # 5. resume, write the run directory, fit
    return resume_and_fit(trainer, setup, cfg, data)
