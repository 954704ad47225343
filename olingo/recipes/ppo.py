"""`olingo ppo`: PPO from an SFT model against a reward model or verifiable reward functions.

The recipe, top to bottom (`run_ppo`):
    1. call each user function once on a prompt row (`probe_user_functions`); seed, plugin;
       check the run directory and the checkpoint to resume
    2. load the tokenizer, the actor and its frozen copy (the reference), the critic, the reward
    3. load and validate prompts (and pretrain rows for the ptx loss); sharded loaders
    4. optimizers and schedules sized in optimizer steps; boost; the trainer
    5. resume if asked, write the run directory, fit, report held-out metrics
Each component gets its own section: the experience maker `experience` and `reward` (shaping),
the learners `loss`, the loop `loop`, the engine `generation`. With `ray.enabled` the same
config runs on Ray actors (`olingo.recipes.ppo_ray`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from olingo.booster import Booster
from olingo.config import ConfigError
from olingo.dataset import SFTCollator, build_sft_dataset
from olingo.dataset.prompts import PromptCollator, build_prompt_dataset
from olingo.models import (
    RewardModel,
    load_causal_lm,
    load_tokenizer,
    name_stop_tokens,
    stop_token_ids,
)
from olingo.models.critic import Critic
from olingo.recipes.common import (
    RunSetup,
    attach_experiment,
    build_callbacks,
    build_rollout_engine,
    check_batch_fits,
    check_engine_config,
    check_model_paths,
    check_room_for_text,
    enable_gradient_checkpointing,
    make_plugin,
    open_run,
    optimizer_and_schedule,
    resolve_model_path,
    resolve_path,
)
from olingo.recipes.ppo_config import (  # noqa: F401 - the config's classes, importable from here as before
    GenerationConfig,
    PPOConfig,
    PPODataConfig,
    PPOLoopConfig,
    PPOModelConfig,
    RewardConfig,
    generate_kwargs,
)
from olingo.recipes.rewards import load_reward, probe_user_functions
from olingo.rewards.functions import CompositeReward, reward_function
from olingo.trainer.callbacks import Callback, LogContext
from olingo.trainer.callbacks.builtin import PerformanceEvaluator
from olingo.trainer.loop_support import Evaluator
from olingo.trainer.ppo import PPOTrainer, ppo_steps_per_episode


@dataclass
class PPOModels:
    """What `load_models` loads: the shared tokenizer, the trained actor and critic, and the
    frozen reference and reward (the reward may be reward functions instead of a model)."""

    tokenizer: Any
    actor: torch.nn.Module
    critic: torch.nn.Module
    reference: torch.nn.Module
    reward: RewardModel | CompositeReward
    stop_token_ids: list[int]  # where responses end (the tokenizer's and the actor's eos ids)


@dataclass
class PPOData:
    """Loaders over validated data: prompts (training and held out) and pretrain rows for ptx."""

    prompts: Any
    eval_prompts: Any | None
    pretrain: Any | None


def load_models(cfg: PPOConfig, inference_device: torch.device | str) -> PPOModels:
    """Actor (LoRA when asked), its frozen copy as reference, the critic (from the reward model
    by default, as InstructGPT does), the reward; frozen models wait on `inference_device`."""
    m = cfg.model
    check_model_paths({"model.actor": m.actor, "model.reference": m.reference, "model.critic": m.critic, "model.tokenizer": m.tokenizer, "reward.model": cfg.reward.model})
    source = resolve_model_path(m.actor, m.gguf_file)
    tokenizer = load_tokenizer(resolve_model_path(m.tokenizer) if m.tokenizer else source, padding_side="left", chat_template=m.chat_template)
    stops = stop_token_ids(tokenizer, source)
    load = dict(dtype=m.dtype, trust_remote_code=m.trust_remote_code)
    actor = m.lora.apply(load_causal_lm(source, **load))
    name_stop_tokens(actor, stops)  # the export's generate stops where rollouts do
    reference = load_causal_lm(resolve_model_path(m.reference) if m.reference else source, **load).eval().requires_grad_(False)
    critic_source = m.critic or cfg.reward.model
    critic = m.lora.apply(Critic.from_pretrained(resolve_model_path(critic_source) if critic_source else source, pad_token_id=tokenizer.pad_token_id, **load))
    reward = load_reward(cfg.reward, tokenizer, m.dtype, m.trust_remote_code)
    if m.gradient_checkpointing:
        enable_gradient_checkpointing(actor)
        enable_gradient_checkpointing(critic)
    reference.to(inference_device)
    reward.to(inference_device)
    return PPOModels(tokenizer, actor, critic, reference, reward, stops)


def load_data(cfg: PPOConfig, tokenizer: Any, plugin: Any) -> PPOData:
    """Prompts and pretrain rows validated (errors name file, row, field), then sharded loaders."""
    loop, data = cfg.loop, cfg.data
    check_room_for_text(tokenizer, data.max_prompt_length, "data.max_prompt_length", with_response=False)
    prompts = build_prompt_dataset([resolve_path(s) for s in data.prompts], tokenizer, data.max_prompt_length, skip_invalid=data.skip_invalid, overlong=data.overlong, length_key="data.max_prompt_length")
    eval_prompts = build_prompt_dataset([resolve_path(s) for s in data.eval_prompts], tokenizer, data.max_prompt_length, overlong=data.overlong, length_key="data.max_prompt_length") if data.eval_prompts else None
    pretrain = build_sft_dataset([resolve_path(s) for s in data.pretrain], tokenizer, data.max_pretrain_length, skip_invalid=data.skip_invalid, overlong=data.overlong, length_key="data.max_pretrain_length") if data.pretrain else None
    world = plugin.coordinator.world_size
    check_batch_fits(len(prompts), loop.rollout_batch_size, world, "loop.rollout_batch_size", "data.prompts")
    if pretrain is not None:
        check_batch_fits(len(pretrain), loop.train_batch_size, world, "loop.train_batch_size", "data.pretrain")
    collate = PromptCollator(tokenizer.pad_token_id)
    return PPOData(
        prompts=plugin.prepare_dataloader(prompts, loop.rollout_batch_size, shuffle=True, seed=cfg.run.seed, collate_fn=collate, drop_last=True),
        eval_prompts=plugin.prepare_dataloader(eval_prompts, loop.eval_batch_size, shuffle=False, collate_fn=collate, even=False) if eval_prompts else None,
        pretrain=plugin.prepare_dataloader(pretrain, loop.train_batch_size, shuffle=True, seed=cfg.run.seed, collate_fn=SFTCollator(tokenizer.pad_token_id), drop_last=True) if pretrain else None,
    )


def total_optimizer_steps(loop: PPOLoopConfig) -> int:
    """Optimizer steps of the whole run, the unit the schedules are sized in."""
    return loop.episodes * ppo_steps_per_episode(
        loop.collect_steps, loop.rollout_batch_size, loop.update_steps, loop.train_batch_size, loop.accumulation_steps,
        buffer_limit=loop.buffer_limit, sample_buffer=loop.sample_buffer,
    )


def build_trainer(cfg: PPOConfig, setup: RunSetup, models: PPOModels, callbacks: Sequence[Callback]) -> PPOTrainer:
    """AdamW and cosine schedules for actor and critic, each boosted by its own plugin (each
    clips its own gradients), and the trainer with every section of the config it needs."""
    loop, total_steps = cfg.loop, total_optimizer_steps(cfg.loop)
    critic_booster = Booster(make_plugin(cfg.plugin, cfg.critic_optim.max_grad_norm))
    actor_optim, actor_scheduler = optimizer_and_schedule(models.actor, cfg.actor_optim, total_steps)
    critic_optim, critic_scheduler = optimizer_and_schedule(models.critic, cfg.critic_optim, total_steps)
    actor, actor_optim, _, _, actor_scheduler = setup.booster.boost(models.actor, actor_optim, lr_scheduler=actor_scheduler)
    critic, critic_optim, _, _, critic_scheduler = critic_booster.boost(models.critic, critic_optim, lr_scheduler=critic_scheduler)
    trainer = PPOTrainer(
        setup.booster, critic_booster, actor, critic, models.reward, models.reference, actor_optim, critic_optim,
        actor_scheduler, critic_scheduler, models.tokenizer, kl_coef=cfg.experience.kl_coef, ptx_coef=cfg.loss.ptx_coef,
        train_batch_size=loop.train_batch_size, buffer_limit=loop.buffer_limit, eps_clip=cfg.loss.eps_clip,
        vf_coef=cfg.loss.vf_coef, value_clip=cfg.loss.value_clip, sample_buffer=loop.sample_buffer,
        offload_inference_models=loop.offload_inference_models, accumulation_steps=loop.accumulation_steps,
        save_interval=loop.save_interval, save_dir=str(setup.run_dir), coordinator=setup.coordinator,
        callbacks=[PerformanceEvaluator(), *build_callbacks(cfg.callbacks), *callbacks],
        experience_config=cfg.experience, reward_shaping=cfg.reward, eval_interval=loop.eval_interval, eval_before_training=loop.eval_before_training, tis_cap=cfg.loss.tis_cap,
        accuracy_fn=reward_function(loop.accuracy_function) if loop.accuracy_function else None,
        eval_generate_kwargs={"temperature": loop.eval_temperature} if loop.eval_temperature is not None else None,
        engine=build_rollout_engine(cfg.generation.engine, cfg.generation.vllm, cfg.model.actor, models.tokenizer, setup.plugin.device, cfg.model.gguf_file),
        **generate_kwargs(cfg.generation, models.stop_token_ids),
    )
    trainer.show_progress = cfg.logging.progress
    trainer.run_config = cfg.model_dump(mode="json")
    return trainer


def check_ppo_config(cfg: PPOConfig) -> None:
    """What one section alone cannot check."""
    if cfg.loss.ptx_coef > 0 and not cfg.data.pretrain:
        raise ConfigError("loss.ptx_coef > 0 needs data.pretrain (SFT-format rows for the ptx loss)")


def run_ppo(cfg: PPOConfig, *, callbacks: Sequence[Callback] = (), ctx: LogContext | None = None, evaluators: Sequence[Evaluator] = ()) -> dict:
    """Train with PPO as `cfg` says; returns the run directory, final actor and eval metrics."""
    if cfg.ray.enabled:
        if ctx is not None or evaluators:
            raise ConfigError("ray.enabled is not available inside an experiment: its callbacks run in the trainer actor, not here")
        from olingo.recipes.ppo_ray import run_ppo_ray  # imports ray: only when asked for

        return run_ppo_ray(cfg, callbacks=callbacks)
    check_ppo_config(cfg)
    probe_user_functions(cfg.reward, cfg.loop.accuracy_function, cfg.data.prompts, cfg.data.eval_prompts)  # seconds, before any model loads
    # 1. seed, plugin, the run directory and checkpoint to resume (checked; written before fit)
    setup = open_run(cfg.run, cfg.plugin, cfg.actor_optim.max_grad_norm, cfg, cfg.logging)
    check_engine_config(cfg.generation.engine, setup.plugin, ray_enabled=False)
    # 2. models: actor, frozen reference, critic, reward
    models = load_models(cfg, "cpu" if cfg.loop.offload_inference_models else setup.plugin.device)
    # 3. data, validated before any training
    data = load_data(cfg, models.tokenizer, setup.plugin)
    # 4. optimizers, schedules, the trainer
    trainer = build_trainer(cfg, setup, models, callbacks)
    attach_experiment(trainer, ctx, evaluators)
    # 5. resume, write the run directory, fit
    return resume_and_fit(trainer, setup, cfg, data)


def resume_and_fit(trainer: Any, setup: RunSetup, cfg: Any, data: PPOData) -> dict:
    """The last step of an RL recipe (PPO, GRPO): restore the checkpoint to resume, write the
    run directory, fit; the run directory, final actor, held-out metrics and step count."""
    if setup.checkpoint is not None:
        trainer.load_checkpoint(setup.checkpoint)
    setup.commit()
    loop, engine = cfg.loop, trainer.experience_maker.engine
    try:
        artifacts = trainer.fit(
            loop.episodes, loop.collect_steps, loop.update_steps, data.prompts, data.pretrain,
            log_dir=str(setup.run_dir), use_wandb=cfg.logging.wandb, eval_dataloader=data.eval_prompts,
        )
    finally:
        if not getattr(engine, "shares_weights", True):
            engine.close()  # a separate engine (vLLM) holds memory and, on CUDA, a share of the GPU
    return {
        "run_dir": str(setup.run_dir),
        "final_model": str(setup.run_dir / "checkpoints" / "final" / "actor"),
        "eval_before": trainer.initial_eval_metrics,  # None when not evaluated (off, no eval prompts, resumed)
        "eval": trainer.last_eval_metrics,
        "steps": artifacts.completed_steps,
    }
