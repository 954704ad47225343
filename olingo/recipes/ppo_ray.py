"""`olingo ppo` with `ray.enabled: true`: PPO with experience makers and the trainer as Ray actors.

The recipe, top to bottom (`run_ppo_ray`):
    1. check the config, seed, check the run directory and the checkpoint to resume
    2. join the Ray cluster named by `ray.address` / $RAY_ADDRESS, or start a local instance
    3. create `ray.num_makers` ExperienceMakerHolder actors (each loads its own actor, critic,
       reward and reference models and its own shuffle of the prompts; with an `environment:`
       named, each runs its own multi-turn episodes, docs/agents.md)
    4. create the DetachedPPOTrainer actor (actor + critic + optimizers; loggers and
       checkpoints in the run directory); resume it when asked; write the run directory
    5. evaluate the starting policy through maker 0 (fresh runs; logged as the step-0 row)
    6. fit: `loop.episodes` episodes of ceil(collect_steps * rollout_batch_size / train_batch_size)
       batches, `loop.update_steps` passes over each; the makers are stopped when fit ends
    7. evaluate the final policy through maker 0, write ray_summary.json, remove every actor,
       and shut Ray down when this process started it
Steps 2-7 are the run both Ray recipes share (`olingo.recipes.ray_run.run_on_ray`); this module
brings PPO's part of it (`RayAlgorithm`). The factories below are built here, pickled, and called
inside the actors; paths are resolved here, on the driver.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from olingo.config import ConfigError
from olingo.errors import require
from olingo.models import (
    RewardModel,
    load_causal_lm,
    load_tokenizer,
    name_stop_tokens,
    stop_token_ids,
)
from olingo.models.critic import Critic
from olingo.ray.making import PPOMaking
from olingo.recipes.common import (
    LoraSettings,
    OptimizerConfig,
    optimizer_and_schedule,
    resolve_model_path,
)
from olingo.recipes.online_config import source_section
from olingo.recipes.ppo_config import PPOConfig

# PromptLoaderFn and TokenizerFn are re-exported: docs/ray.md's example imports them from here
from olingo.recipes.ray_run import PromptLoaderFn as PromptLoaderFn
from olingo.recipes.ray_run import RayAlgorithm, open_run, optimizer_steps, run_on_ray
from olingo.recipes.ray_run import TokenizerFn as TokenizerFn
from olingo.recipes.rewards import JudgeSection, judge_term
from olingo.rewards.functions import CompositeReward
from olingo.trainer.callbacks import Callback


# ---- picklable factories: built on the driver, called inside the actors ---------------------------
@dataclass
class PPOModelsFn:
    """Builds (actor, critic) for the trainer, or (actor, critic, reward, reference) for a maker."""

    actor: str
    critic: str
    tokenizer: str
    reference: str | None = None  # makers only
    reward: str | CompositeReward | None = None  # a reward-model directory, or reward functions
    dtype: str = "float32"
    trust_remote_code: bool = False
    lora: LoraSettings | None = None  # adapters on actor and critic; then only they (and the value head) are synced
    reward_functions: dict[str, float] | None = None  # {spec: weight}, summed with the reward model at `reward`
    reward_model_weight: float = 1.0  # the reward model's weight in that sum
    chat_template: str | None = None  # model.chat_template
    judge: JudgeSection | None = None  # reward.judge (resolved): one more term of that sum

    def __call__(self) -> tuple:
        tokenizer = load_tokenizer(self.tokenizer, chat_template=self.chat_template)
        pad = tokenizer.pad_token_id
        load = dict(dtype=self.dtype, trust_remote_code=self.trust_remote_code)
        lora = self.lora or LoraSettings()
        actor = lora.apply(load_causal_lm(self.actor, **load))
        name_stop_tokens(actor, stop_token_ids(tokenizer, self.actor))  # the export's generate stops where rollouts do
        critic = lora.apply(Critic.from_pretrained(self.critic, pad_token_id=pad, **load))
        if self.reference is None:
            return actor, critic
        reference = load_causal_lm(self.reference, **load).eval().requires_grad_(False)
        reward = self.reward
        if isinstance(reward, str):
            reward = RewardModel.from_pretrained(reward, pad_token_id=pad, **load).eval().requires_grad_(False)
        terms = list((self.reward_functions or {}).items())
        if self.judge is not None and self.judge.enabled:
            terms.append(judge_term(self.judge, self.dtype, self.trust_remote_code))
        if terms:
            reward = CompositeReward(terms, neural=reward, neural_weight=self.reward_model_weight)
        elif reward is None:  # no reward model, no functions: an environment's rewards are the only ones (`load_reward`)
            reward = CompositeReward((), allow_empty=True)
        return actor, critic, reward, reference


@dataclass
class OptimFn:
    """AdamW + cosine schedule for actor and critic, sized in the run's optimizer steps."""

    actor: OptimizerConfig
    critic: OptimizerConfig
    total_steps: int = 1

    def __call__(self, actor: Any, critic: Any) -> tuple:
        actor_optim, actor_scheduler = optimizer_and_schedule(actor, self.actor, self.total_steps)
        critic_optim, critic_scheduler = optimizer_and_schedule(critic, self.critic, self.total_steps)
        return actor_optim, critic_optim, actor_scheduler, critic_scheduler


# ---- the recipe --------------------------------------------------------------------------------------
def check_ray_config(cfg: PPOConfig) -> None:
    """What the single-process PPO supports but detached mode does not, as config errors."""
    loop = cfg.loop
    problems = []
    if cfg.loss.ptx_coef > 0:
        problems.append("loss.ptx_coef must be 0 (the trainer actor has no pretrain data)")
    if loop.accumulation_steps != 1:
        problems.append("loop.accumulation_steps must be 1 (one optimizer step per buffer batch; raise loop.train_batch_size instead)")
    if loop.sample_buffer:
        problems.append("loop.sample_buffer must be false (the trainer pops batches from its buffer)")
    if cfg.plugin.name != "single":
        problems.append("plugin.name must be 'single' (each Ray actor is one process)")
    if cfg.loss.offpolicy_mask != "none" or cfg.loss.behaviour_log_probs != "engine":
        problems.append("loss.offpolicy_mask and loss.behaviour_log_probs are not applied by the Ray PPO trainer yet (docs/async.md): leave them unset")
    if problems:
        raise ConfigError("ray.enabled: " + "; ".join(problems))


def episode_batches(cfg: PPOConfig) -> int:
    """Training batches per episode: as many rollouts as one single-process episode collects."""
    loop = cfg.loop
    return math.ceil(loop.collect_steps * loop.rollout_batch_size / loop.train_batch_size)


def maker_models(cfg: PPOConfig) -> PPOModelsFn:
    """A maker's four models: actor, critic (from the reward model by default), the reward (a
    reward model, reward functions, or both summed, as in `load_reward`), reference."""
    m, rc = cfg.model, cfg.reward
    actor = resolve_model_path(m.actor, m.gguf_file)

    def or_actor(path: str | None) -> str:
        return resolve_model_path(path) if path else actor

    return PPOModelsFn(
        actor, or_actor(m.critic or rc.model), or_actor(m.tokenizer),
        or_actor(m.reference), resolve_model_path(rc.model) if rc.model else None, m.dtype, m.trust_remote_code, m.lora,
        reward_functions=dict(rc.functions) or None, reward_model_weight=rc.model_weight, chat_template=m.chat_template,
        judge=rc.judge.resolved(),
    )


def run_ppo_ray(cfg: PPOConfig, *, callbacks: Sequence[Callback] = ()) -> dict:
    """Train with PPO on Ray actors as `cfg` says; returns the run directory, evals and summary."""
    require("ray", "ray.enabled=true (detached PPO on Ray)")

    # 1. config, seed, run directory (checked here, written once the actors have loaded everything)
    check_ray_config(cfg)
    m, loss = cfg.model, cfg.loss
    run_dir, checkpoint = open_run(cfg, {
        "model.actor": m.actor, "model.reference": m.reference, "model.critic": m.critic,
        "model.tokenizer": m.tokenizer, "reward.model": cfg.reward.model,
    })
    batches = episode_batches(cfg)
    models = maker_models(cfg)

    # 2-7. makers making PPO experience (KL-penalised rewards, GAE), the PPO trainer (actor + critic)
    ppo = RayAlgorithm(
        "ppo", models, PPOMaking(
            cfg.experience.kl_coef, cfg.experience, cfg.reward, carry_engine_log_probs=cfg.loss.tis_cap is not None,
            environment=source_section(cfg), packing=m.packing,
        ),
        trainer_models=PPOModelsFn(
            models.actor, models.critic, models.tokenizer,
            dtype=m.dtype, trust_remote_code=m.trust_remote_code, lora=m.lora, chat_template=m.chat_template,
        ),
        optim_fn=OptimFn(cfg.actor_optim, cfg.critic_optim, optimizer_steps(cfg, batches)), batches=batches,
        trainer_kwargs=dict(
            train_batch_size=cfg.loop.train_batch_size,
            eps_clip=loss.eps_clip, value_clip=loss.value_clip, vf_coef=loss.vf_coef, tis_cap=loss.tis_cap,
            packing=m.packing,
        ),
    )
    return run_on_ray(cfg, ppo, run_dir, checkpoint, callbacks)
