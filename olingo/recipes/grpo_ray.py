"""`olingo grpo` with `ray.enabled: true`: the GRPO family with group makers and the trainer as Ray actors.

The recipe, top to bottom (`run_grpo_ray`):
    1. check the config, seed, check the run directory and the checkpoint to resume; with a
       distillation teacher, that it shares the actor's tokenizer (`check_teacher_tokenizer`)
    2. join the Ray cluster named by `ray.address` / $RAY_ADDRESS, or start a local instance
    3. create `ray.num_makers` ExperienceMakerHolder actors making whole groups (`GroupMaking`):
       each loads its own policy, reward, only when experience.kl_coef > 0 the reference and,
       only when experience.distill_coef > 0, the frozen teacher (`load_teacher`), and its own
       shuffle of the prompts; advantages are computed there, per prompt batch; with an
       `environment:` named, each runs its own multi-turn episodes (docs/agents.md)
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
Steps 2-7 are the run both Ray recipes share (`olingo.recipes.ray_run.run_on_ray`); this module
brings the GRPO family's part of it (`RayAlgorithm`). The factories below are built here,
pickled, and called inside the actors; paths are resolved here, on the driver.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from olingo.config import ConfigError
from olingo.errors import require
from olingo.models import load_causal_lm, load_tokenizer, name_stop_tokens, stop_token_ids
from olingo.models.lora import AdaptersDisabled
from olingo.ray.making import GroupMaking
from olingo.recipes.common import (
    LoraSettings,
    OptimizerConfig,
    enable_gradient_checkpointing,
    optimizer_and_schedule,
    resolve_model_path,
)
from olingo.recipes.grpo import check_teacher_tokenizer, load_teacher
from olingo.recipes.grpo_config import GRPOConfig, check_grpo_config
from olingo.recipes.online_config import source_section
from olingo.recipes.ray_run import RayAlgorithm, open_run, optimizer_steps, run_on_ray
from olingo.recipes.rewards import RewardSource, load_reward
from olingo.trainer.callbacks import Callback

logger = logging.getLogger("olingo.recipes")

# ---- picklable factories: built on the driver, called inside the actors ---------------------------
@dataclass
class GRPOModelsFn:
    """Builds the actor for the trainer (`reward` None), or (actor, reward, reference or None)
    for a maker: the reference only when `reference` is set (experience.kl_coef > 0), or with
    `reference_is_base` the maker's LoRA actor with its adapters disabled (no second copy; only
    adapters are synced into a maker, so its base stays the start model). With `teacher` set
    (experience.distill_coef > 0) a maker gets (actor, reward, reference or None, teacher): the
    frozen teacher of on-policy distillation, loaded as single-process GRPO loads it (`load_teacher`)."""

    actor: str
    tokenizer: str
    reward: RewardSource | Any = None  # makers only: a reward source (paths resolved), or a ready reward object
    reference: str | None = None  # makers with a KL term only
    dtype: str = "float32"
    trust_remote_code: bool = False
    lora: LoraSettings | None = None  # adapters on the actor; then only they are synced
    gradient_checkpointing: bool = False  # the trainer's actor
    reference_is_base: bool = False  # makers with a KL term, LoRA and no model.reference
    chat_template: str | None = None  # model.chat_template
    teacher: str | None = None  # makers with on-policy distillation only (experience.distill_coef > 0)

    def __call__(self) -> Any:
        load = dict(dtype=self.dtype, trust_remote_code=self.trust_remote_code)
        actor = (self.lora or LoraSettings()).apply(load_causal_lm(self.actor, **load))
        tokenizer = load_tokenizer(self.tokenizer, chat_template=self.chat_template)
        name_stop_tokens(actor, stop_token_ids(tokenizer, self.actor))  # the export's generate stops where rollouts do
        if self.reward is None:
            if self.gradient_checkpointing:
                enable_gradient_checkpointing(actor)
            return actor
        reward = self.reward
        if isinstance(reward, RewardSource):
            reward = load_reward(reward, tokenizer, self.dtype, self.trust_remote_code)
        reference = load_causal_lm(self.reference, **load).eval().requires_grad_(False) if self.reference is not None else None
        if self.reference_is_base:
            reference = AdaptersDisabled(actor)
        if self.teacher is None:
            return actor, reward, reference
        return actor, reward, reference, load_teacher(self.teacher, tokenizer, load, "cpu")  # `models_on` moves it with the others


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
    `load_reward`), the frozen reference only when the KL term needs it (with LoRA and no
    `model.reference`: the maker's actor with its adapters disabled) and the frozen teacher only
    with on-policy distillation (experience.distill_coef > 0)."""
    m, rc = cfg.model, cfg.reward
    actor = resolve_model_path(m.actor, m.gguf_file)
    reward = rc.model_copy(update={"model": resolve_model_path(rc.model) if rc.model else None, "judge": rc.judge.resolved()})
    kl = cfg.experience.kl_coef > 0
    base = kl and m.lora.enabled and not m.reference  # the actor with adapters disabled
    reference = (resolve_model_path(m.reference) if m.reference else actor) if kl and not base else None
    teacher = resolve_model_path(m.teacher) if m.teacher is not None and cfg.experience.distill_coef > 0 else None
    return GRPOModelsFn(actor, resolve_model_path(m.tokenizer) if m.tokenizer else actor, reward, reference, m.dtype, m.trust_remote_code, m.lora,
                        reference_is_base=base, chat_template=m.chat_template, teacher=teacher)


def run_grpo_ray(cfg: GRPOConfig, *, callbacks: Sequence[Callback] = ()) -> dict:
    """Train the GRPO family on Ray actors as `cfg` says; returns the run directory, evals and summary."""
    require("ray", "ray.enabled=true (detached GRPO on Ray)")

    # 1. config, seed, run directory (checked here, written once the actors have loaded everything)
    check_ray_config(cfg)
    check_grpo_config(cfg)
    loop, m = cfg.loop, cfg.model
    run_dir, checkpoint = open_run(cfg, {
        "model.actor": m.actor, "model.reference": m.reference, "model.tokenizer": m.tokenizer, "reward.model": cfg.reward.model,
        "model.teacher": m.teacher,
    })
    batches = episode_batches(cfg)
    models = maker_models(cfg)
    if models.teacher is not None:  # here, before any actor starts: a one-line error, not one from every maker
        check_teacher_tokenizer(load_tokenizer(models.teacher), load_tokenizer(models.tokenizer, chat_template=m.chat_template))

    # 2-7. makers making whole groups with their advantages; the GRPO trainer (the policy only),
    # one optimizer step per buffer batch of accumulation_steps micro-batches
    grpo = RayAlgorithm(
        "grpo", models, GroupMaking(
            cfg.experience, needs_old_log_probs=needs_old_log_probs(cfg), carry_engine_log_probs=cfg.loss.tis_cap is not None,
            environment=source_section(cfg), packing=m.packing,
        ),
        trainer_models=GRPOModelsFn(
            models.actor, models.tokenizer, dtype=m.dtype, trust_remote_code=m.trust_remote_code, lora=m.lora,
            gradient_checkpointing=m.gradient_checkpointing, chat_template=m.chat_template,
        ),
        optim_fn=GRPOOptimFn(cfg.actor_optim, optimizer_steps(cfg, batches)), batches=batches,
        trainer_kwargs=dict(
            train_batch_size=loop.train_batch_size * loop.accumulation_steps, micro_batch_size=loop.train_batch_size,
            experience_config=cfg.experience, loss_config=cfg.loss, max_new_tokens=cfg.generation.max_new_tokens,
            packing=m.packing,
        ),
    )
    return run_on_ray(cfg, grpo, run_dir, checkpoint, callbacks)
