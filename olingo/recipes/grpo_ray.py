"""`olingo grpo` with `ray.enabled: true`: the GRPO family with group makers and the trainer as Ray actors.

The recipe, top to bottom (`run_grpo_ray`):
    1. check the config, seed, check the run directory and the checkpoint to resume
    2. join the Ray cluster named by `ray.address` / $RAY_ADDRESS, or start a local instance
    3. create `ray.num_makers` ExperienceMakerHolder actors making whole groups (`GroupMaking`):
       each loads its own policy, reward and, only when experience.kl_coef > 0, reference, and
       its own shuffle of the prompts; advantages are computed there, per prompt batch
    4. create the DetachedGRPOTrainer actor (the policy and its optimizer; no critic, no
       reference; loggers and checkpoints in the run directory); resume when asked; write the
       run directory
    5. evaluate the starting policy through maker 0 (fresh runs; logged as the step-0 row)
    6. fit: `loop.episodes` episodes of ceil(collect_steps x rollout_batch_size x G /
       (train_batch_size x accumulation_steps)) optimizer steps, `loop.update_steps` passes
       over each; each step normalises its loss over its accumulation_steps micro-batches, as
       single-process GRPO does; the makers are stopped when fit ends
    7. evaluate the final policy through maker 0, write ray_summary.json, remove every actor,
       and shut Ray down when this process started it
The factories below are built here, pickled, and called inside the actors; paths are resolved
here, on the driver. Everything that calls `ray` is in `olingo.ray.launch`.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from olingo.config import ConfigError
from olingo.errors import require
from olingo.models import load_causal_lm, load_tokenizer
from olingo.models.rlvr import get_reward_function
from olingo.ray.making import GroupMaking
from olingo.recipes.common import (
    LoraSettings,
    OptimizerConfig,
    build_callbacks,
    check_model_paths,
    check_run_dir,
    commit_run_dir,
    enable_gradient_checkpointing,
    optimizer_and_schedule,
    resolve_path,
    resume_checkpoint,
)
from olingo.recipes.grpo import check_grpo_config
from olingo.recipes.grpo_config import GRPOConfig
from olingo.recipes.ppo_config import generate_kwargs
from olingo.recipes.ppo_ray import PromptLoaderFn, TokenizerFn, _evaluator
from olingo.recipes.rewards import RewardSource, load_reward
from olingo.trainer.callbacks import Callback
from olingo.trainer.utils import seed_everything

logger = logging.getLogger("olingo.recipes")

# ---- picklable factories: built on the driver, called inside the actors ---------------------------
@dataclass
class GRPOModelsFn:
    """Builds the actor for the trainer (`reward` None), or (actor, reward, reference or None)
    for a maker: the reference only when `reference` is set (experience.kl_coef > 0)."""

    actor: str
    tokenizer: str
    reward: RewardSource | Any = None  # makers only: a reward source (paths resolved), or a ready reward object
    reference: str | None = None  # makers with a KL term only
    dtype: str = "float32"
    trust_remote_code: bool = False
    lora: LoraSettings | None = None  # adapters on the actor; then only they are synced
    gradient_checkpointing: bool = False  # the trainer's actor

    def __call__(self) -> Any:
        load = dict(dtype=self.dtype, trust_remote_code=self.trust_remote_code)
        actor = (self.lora or LoraSettings()).apply(load_causal_lm(self.actor, **load))
        if self.reward is None:
            if self.gradient_checkpointing:
                enable_gradient_checkpointing(actor)
            return actor
        reward = self.reward
        if isinstance(reward, RewardSource):
            reward = load_reward(reward, load_tokenizer(self.tokenizer), self.dtype, self.trust_remote_code)
        reference = load_causal_lm(self.reference, **load).eval().requires_grad_(False) if self.reference is not None else None
        return actor, reward, reference


@dataclass
class GRPOOptimFn:
    """AdamW + cosine schedule for the actor, sized in the run's optimizer steps."""

    actor: OptimizerConfig
    total_steps: int = 1

    def __call__(self, actor: Any) -> tuple:
        return optimizer_and_schedule(actor, self.actor, self.total_steps)


# ---- the recipe --------------------------------------------------------------------------------------
def check_ray_config(cfg: GRPOConfig) -> None:
    """What single-process GRPO supports but detached mode does not, as config errors."""
    loop = cfg.loop
    problems = []
    if cfg.loss.ptx_coef > 0:
        problems.append("loss.ptx_coef must be 0 (the trainer actor has no pretrain data)")
    if loop.sample_buffer:
        problems.append("loop.sample_buffer must be false (the trainer pops batches from its buffer)")
    if loop.buffer_limit:
        problems.append("loop.buffer_limit must be 0 (the trainer's buffer is bounded by ray.buffer_limit, in training batches)")
    if cfg.plugin.name != "single":
        problems.append("plugin.name must be 'single' (each Ray actor is one process)")
    if problems:
        raise ConfigError("ray.enabled: " + "; ".join(problems))
    if loop.eval_interval:  # the packaged config sets it; refusing would break `olingo grpo ray.enabled=true`
        logger.warning("ray.enabled: loop.eval_interval=%d is not used; Ray mode evaluates the starting and the final policy", loop.eval_interval)


def episode_batches(cfg: GRPOConfig) -> int:
    """Optimizer steps (buffer batches) per episode: as many rollouts as one single-process
    episode collects, G per prompt, in steps of train_batch_size x accumulation_steps."""
    loop = cfg.loop
    rollouts = loop.collect_steps * loop.rollout_batch_size * cfg.experience.num_generations
    return math.ceil(rollouts / (loop.train_batch_size * loop.accumulation_steps))


def needs_old_log_probs(cfg: GRPOConfig) -> bool:
    """Whether a batch may be learnt on by weights other than those that made it: several
    steps or passes per weight sync, or batches older than the last sync allowed. Only when
    none of these holds is pi_old the current policy (ratio 1, its forward skipped)."""
    return cfg.loop.update_steps > 1 or episode_batches(cfg) > 1 or cfg.ray.max_staleness != 0


def maker_models(cfg: GRPOConfig) -> GRPOModelsFn:
    """A maker's models: the policy, the reward (functions and/or a reward model, as in
    `load_reward`) and the frozen reference only when the KL term needs it."""
    m, rc = cfg.model, cfg.reward
    reward = rc.model_copy(update={"model": resolve_path(rc.model) if rc.model else None})
    reference = resolve_path(m.reference or m.actor) if cfg.experience.kl_coef > 0 else None
    return GRPOModelsFn(resolve_path(m.actor), resolve_path(m.tokenizer or m.actor), reward, reference, m.dtype, m.trust_remote_code, m.lora)


def run_grpo_ray(cfg: GRPOConfig, *, callbacks: Sequence[Callback] = ()) -> dict:
    """Train the GRPO family on Ray actors as `cfg` says; returns the run directory, evals and summary."""
    require("ray", "ray.enabled=true (detached GRPO on Ray)")
    from olingo.ray import launch  # only now: it imports ray

    # 1. config, seed, run directory (checked here, written once the actors have loaded everything)
    check_ray_config(cfg)
    check_grpo_config(cfg)
    loop, m, rc = cfg.loop, cfg.model, cfg.ray
    check_model_paths({"model.actor": m.actor, "model.reference": m.reference, "model.tokenizer": m.tokenizer, "reward.model": cfg.reward.model})
    seed_everything(cfg.run.seed)
    run_dir = check_run_dir(cfg.run)
    checkpoint = resume_checkpoint(cfg.run, run_dir)
    batches = episode_batches(cfg)
    total_steps = loop.episodes * batches
    models = maker_models(cfg)
    making = GroupMaking(cfg.experience, needs_old_log_probs=needs_old_log_probs(cfg))

    # 2. Ray
    started_here = launch.start_ray(rc)
    actors: list[Any] = []
    try:
        launch.check_resources(rc)
        # 3. makers, each with its own models and its own prompt order, making whole groups
        suffix = uuid.uuid4().hex[:6]
        trainer_name = f"{cfg.run.name}-trainer-{suffix}"
        maker_names = [f"{cfg.run.name}-maker{i}-{suffix}" for i in range(rc.num_makers)]
        prompts = [resolve_path(s) for s in cfg.data.prompts]
        makers = [
            launch.spawn_maker(
                rc, name, [trainer_name], models, TokenizerFn(models.tokenizer),
                PromptLoaderFn(prompts, models.tokenizer, cfg.data.max_prompt_length, loop.rollout_batch_size, seed=cfg.run.seed + 1000 * i, skip_invalid=cfg.data.skip_invalid),
                making=making,
                eval_dataloader_fn=PromptLoaderFn([resolve_path(s) for s in cfg.data.eval_prompts], models.tokenizer, cfg.data.max_prompt_length, loop.eval_batch_size, train=False) if cfg.data.eval_prompts and i == 0 else None,
                accuracy_fn=get_reward_function(loop.accuracy_function) if loop.accuracy_function else None,
                seed=cfg.run.seed + i, call_timeout_s=rc.call_timeout_s, **generate_kwargs(cfg.generation),
            )
            for i, name in enumerate(maker_names)
        ]
        actors += makers

        # 4. the trainer actor (one optimizer step per buffer batch of accumulation_steps micro-batches); resume; the run directory
        trainer = launch.spawn_trainer(
            rc, trainer_name, maker_names, GRPOModelsFn(models.actor, models.tokenizer, dtype=m.dtype, trust_remote_code=m.trust_remote_code, lora=m.lora, gradient_checkpointing=m.gradient_checkpointing),
            algorithm="grpo", train_batch_size=loop.train_batch_size * loop.accumulation_steps, micro_batch_size=loop.train_batch_size,
            buffer_limit=rc.buffer_limit or batches, callbacks=build_callbacks(cfg.callbacks) + list(callbacks),
            experience_config=cfg.experience, loss_config=cfg.loss, max_new_tokens=cfg.generation.max_new_tokens,
            temperature=cfg.generation.temperature if cfg.generation.do_sample else 1.0,
            optim_fn=GRPOOptimFn(cfg.actor_optim, total_steps * loop.update_steps),
            max_grad_norm=cfg.actor_optim.max_grad_norm, tokenizer_fn=TokenizerFn(models.tokenizer), seed=cfg.run.seed,
            max_staleness=rc.max_staleness, call_timeout_s=rc.call_timeout_s, experience_timeout_s=rc.experience_timeout_s,
            max_maker_restarts=rc.max_restarts * rc.num_makers, log_dir=str(run_dir), use_wandb=cfg.logging.wandb,
            show_progress=cfg.logging.progress, save_dir=str(run_dir), save_interval=loop.save_interval,
        )
        actors.append(trainer)
        if checkpoint is not None:
            launch.call(rc, trainer.load_checkpoint.remote(str(checkpoint)))
        commit_run_dir(cfg.run, cfg, run_dir)

        # 5-7. evaluate, fit (which logs the step-0 evaluation first), evaluate
        evaluate = _evaluator(cfg, makers[0], launch) if cfg.data.eval_prompts else None
        before = evaluate() if evaluate is not None and checkpoint is None else None
        summary = launch.wait_for(trainer.fit.remote(total_steps, batches, loop.update_steps, initial_eval=before))
        after = evaluate() if evaluate is not None else None
    finally:
        launch.shut_down(actors, started_here)
    if after is not None:  # the same final eval row single-process GRPO writes, for `olingo report`
        with open(run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": summary["steps"], "split": "eval", "time": time.time(), "eval_name": "eval", **after}) + "\n")
    result = {"run_dir": str(run_dir), "final_model": str(run_dir / "checkpoints" / "final" / "actor"), "eval_before": before, "eval": after, "steps": summary["steps"], "ray": summary}
    (run_dir / "ray_summary.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result
