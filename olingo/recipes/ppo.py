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
from olingo.experience_maker import PPOExperienceMaker
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
    check_engine_config,
    check_model_paths,
    enable_gradient_checkpointing,
    make_plugin,
    open_run,
    optimizer_and_schedule,
    resolve_model_path,
)
from olingo.recipes.online import environment_source, load_prompt_data, online_trainer, resume_and_fit, rollouts
from olingo.recipes.online_config import check_template
from olingo.recipes.ppo_config import PPOConfig, PPOModelConfig, RewardConfig  # noqa: F401 - importable from here as before
from olingo.recipes.rewards import load_reward, probe_user_functions
from olingo.rewards.functions import CompositeReward
from olingo.trainer.callbacks import Callback, LogContext
from olingo.trainer.loop_support import Evaluator
from olingo.trainer.offpolicy_fields import check_one_step_per_episode
from olingo.trainer.online_trainer import OnlineTrainer
from olingo.trainer.ppo_learner import PPOLearner


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


def load_models(cfg: PPOConfig, inference_device: torch.device | str) -> PPOModels:
    """Actor (LoRA when asked), its frozen copy as reference, the critic (from the reward model
    by default, as InstructGPT does), the reward; frozen models wait on `inference_device`."""
    m = cfg.model
    check_model_paths({
        "model.actor": m.actor, "model.reference": m.reference, "model.critic": m.critic,
        "model.tokenizer": m.tokenizer, "reward.model": cfg.reward.model,
    })
    source = resolve_model_path(m.actor, m.gguf_file)
    tokenizer = load_tokenizer(resolve_model_path(m.tokenizer) if m.tokenizer else source, padding_side="left", chat_template=m.chat_template)
    check_template(cfg.environment, cfg.agent, cfg.generation, tokenizer)  # before any model loads
    stops = stop_token_ids(tokenizer, source)
    load = dict(dtype=m.dtype, trust_remote_code=m.trust_remote_code)
    actor = m.lora.apply(load_causal_lm(source, **load))
    name_stop_tokens(actor, stops)  # the export's generate stops where rollouts do
    reference = load_causal_lm(resolve_model_path(m.reference) if m.reference else source, **load).eval().requires_grad_(False)
    critic_source = m.critic or cfg.reward.model
    critic = m.lora.apply(Critic.from_pretrained(resolve_model_path(critic_source) if critic_source else source, pad_token_id=tokenizer.pad_token_id, **load))
    reward = load_reward(cfg.reward, tokenizer, m.dtype, m.trust_remote_code, device=inference_device)  # device: where a judge generates
    if m.gradient_checkpointing:
        enable_gradient_checkpointing(actor)
        enable_gradient_checkpointing(critic)
    reference.to(inference_device)
    reward.to(inference_device)
    return PPOModels(tokenizer, actor, critic, reference, reward, stops)


def build_trainer(cfg: PPOConfig, setup: RunSetup, models: PPOModels, callbacks: Sequence[Callback]) -> OnlineTrainer:
    """AdamW and cosine schedules for actor and critic, each boosted by its own plugin (each
    clips its own gradients); the learner gets `loss:`, the experience maker `experience:`,
    `reward:` (its shaping) and `generation:`, the loop `loop:`."""
    total_steps = cfg.loop.total_steps()
    critic_booster = Booster(make_plugin(cfg.plugin, cfg.critic_optim.max_grad_norm))
    actor_optim, actor_scheduler = optimizer_and_schedule(models.actor, cfg.actor_optim, total_steps)
    critic_optim, critic_scheduler = optimizer_and_schedule(models.critic, cfg.critic_optim, total_steps)
    actor, actor_optim, _, _, actor_scheduler = setup.booster.boost(models.actor, actor_optim, lr_scheduler=actor_scheduler)
    critic, critic_optim, _, _, critic_scheduler = critic_booster.boost(models.critic, critic_optim, lr_scheduler=critic_scheduler)
    learner = PPOLearner.build(setup.booster, critic_booster, actor, critic, actor_optim, critic_optim, actor_scheduler, critic_scheduler, cfg.loss,
                               packing=cfg.model.packing)
    sampling = rollouts(cfg, setup, models.tokenizer, models.stop_token_ids)
    # Unwrapped models: rollouts are forward-only, so DDP's per-forward bookkeeping is not wanted.
    maker = PPOExperienceMaker(
        setup.booster.unwrap(actor), critic_booster.unwrap(critic), models.reward, models.reference, models.tokenizer, config=cfg.experience,
        shaping=cfg.reward, engine=sampling.engine, generation=sampling.generation, all_reduce_sum=setup.plugin.all_reduce_sum,
        source=environment_source(cfg, sampling.engine, setup.booster.unwrap(actor), models.tokenizer), packing=cfg.model.packing,
    )
    return online_trainer(cfg, setup, learner, maker, models.tokenizer, (models.reference, models.reward), sampling.eval_generation, callbacks)


def check_ppo_config(cfg: PPOConfig) -> None:
    """What one section alone cannot check."""
    check_one_step_per_episode(cfg.loss, cfg.loop.steps_per_episode())
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
    data = load_prompt_data(cfg, models.tokenizer, setup.plugin)
    # 4. optimizers, schedules, the trainer
    trainer = build_trainer(cfg, setup, models, callbacks)
    attach_experiment(trainer, ctx, evaluators)
    # 5. resume, write the run directory, fit
    return resume_and_fit(trainer, setup, cfg, data)
