"""`olingo ppo` with `ray.enabled: true`: PPO with experience makers and the trainer as Ray actors.

The recipe, top to bottom (`run_ppo_ray`):
    1. check the config, seed, check the run directory and the checkpoint to resume
    2. join the Ray cluster named by `ray.address` / $RAY_ADDRESS, or start a local instance
    3. create `ray.num_makers` ExperienceMakerHolder actors (each loads its own actor, critic,
       reward and reference models and its own shuffle of the prompts)
    4. create the DetachedPPOTrainer actor (actor + critic + optimizers; loggers and
       checkpoints in the run directory); resume it when asked; write the run directory
    5. evaluate the starting policy through maker 0 (fresh runs; logged as the step-0 row)
    6. fit: `loop.episodes` episodes of ceil(collect_steps * rollout_batch_size / train_batch_size)
       batches, `loop.update_steps` passes over each; the makers are stopped when fit ends
    7. evaluate the final policy through maker 0, write ray_summary.json, remove every actor,
       and shut Ray down when this process started it
The factories below are built here, pickled, and called inside the actors. Paths are resolved
here, on the driver: on a multi-node cluster they must exist on every node. Everything that
calls `ray` is in `olingo.ray.launch`, which gets the `ray:` section only.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from olingo.booster import SingleProcessPlugin
from olingo.config import ConfigError
from olingo.dataset.prompts import PromptCollator, build_prompt_dataset
from olingo.errors import require
from olingo.models import RewardModel, load_causal_lm, load_tokenizer
from olingo.models.critic import Critic
from olingo.models.rewards import CompositeReward
from olingo.models.rlvr import get_reward_function
from olingo.recipes.common import (
    LoraSettings,
    OptimizerConfig,
    build_callbacks,
    check_model_paths,
    check_run_dir,
    commit_run_dir,
    optimizer_and_schedule,
    resolve_path,
    resume_checkpoint,
)
from olingo.recipes.ppo_config import PPOConfig, generate_kwargs
from olingo.trainer.callbacks import Callback
from olingo.trainer.utils import seed_everything


# ---- picklable factories: built on the driver, called inside the actors ---------------------------
@dataclass
class TokenizerFn:
    path: str

    def __call__(self) -> Any:
        return load_tokenizer(self.path, padding_side="left")


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

    def __call__(self) -> tuple:
        pad = load_tokenizer(self.tokenizer).pad_token_id
        load = dict(dtype=self.dtype, trust_remote_code=self.trust_remote_code)
        lora = self.lora or LoraSettings()
        actor = lora.apply(load_causal_lm(self.actor, **load))
        critic = lora.apply(Critic.from_pretrained(self.critic, pad_token_id=pad, **load))
        if self.reference is None:
            return actor, critic
        reference = load_causal_lm(self.reference, **load).eval().requires_grad_(False)
        reward = self.reward
        if isinstance(reward, str):
            reward = RewardModel.from_pretrained(reward, pad_token_id=pad, **load).eval().requires_grad_(False)
        if self.reward_functions:
            reward = CompositeReward(self.reward_functions, neural=reward, neural_weight=self.reward_model_weight)
        return actor, critic, reward, reference


@dataclass
class PromptLoaderFn:
    """A prompt DataLoader (ResumableSampler, private shuffle seed) built inside a maker."""

    sources: list[str]
    tokenizer: str
    max_prompt_length: int
    batch_size: int
    seed: int = 0
    train: bool = True  # shuffled, short last batch dropped; eval: in order, every prompt
    skip_invalid: bool = False

    def __call__(self) -> Any:
        tokenizer = load_tokenizer(self.tokenizer, padding_side="left")
        dataset = build_prompt_dataset(self.sources, tokenizer, self.max_prompt_length, skip_invalid=self.skip_invalid)
        return SingleProcessPlugin().prepare_dataloader(
            dataset, self.batch_size, shuffle=self.train, seed=self.seed, collate_fn=PromptCollator(tokenizer.pad_token_id),
            even=self.train, drop_last=self.train,
        )


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
    return PPOModelsFn(
        resolve_path(m.actor), resolve_path(m.critic or rc.model or m.actor), resolve_path(m.tokenizer or m.actor),
        resolve_path(m.reference or m.actor), resolve_path(rc.model) if rc.model else None, m.dtype, m.trust_remote_code, m.lora,
        reward_functions=dict(rc.functions) or None, reward_model_weight=rc.model_weight,
    )


def run_ppo_ray(cfg: PPOConfig, *, callbacks: Sequence[Callback] = ()) -> dict:
    """Train with PPO on Ray actors as `cfg` says; returns the run directory, evals and summary."""
    require("ray", "ray.enabled=true (detached PPO on Ray)")
    from olingo.ray import launch  # only now: it imports ray

    # 1. config, seed, run directory (checked here, written once the actors have loaded everything)
    check_ray_config(cfg)
    loop, m, rc = cfg.loop, cfg.model, cfg.ray
    check_model_paths({"model.actor": m.actor, "model.reference": m.reference, "model.critic": m.critic, "model.tokenizer": m.tokenizer, "reward.model": cfg.reward.model})
    seed_everything(cfg.run.seed)
    run_dir = check_run_dir(cfg.run)
    checkpoint = resume_checkpoint(cfg.run, run_dir)
    batches = episode_batches(cfg)
    total_steps = loop.episodes * batches
    models = maker_models(cfg)

    # 2. Ray
    started_here = launch.start_ray(rc)
    actors: list[Any] = []
    try:
        launch.check_resources(rc)
        # 3. makers, each with its own models and its own prompt order
        suffix = uuid.uuid4().hex[:6]
        trainer_name = f"{cfg.run.name}-trainer-{suffix}"
        maker_names = [f"{cfg.run.name}-maker{i}-{suffix}" for i in range(rc.num_makers)]
        makers = [
            launch.spawn_maker(
                rc, name, [trainer_name], models, TokenizerFn(models.tokenizer),
                PromptLoaderFn([resolve_path(s) for s in cfg.data.prompts], models.tokenizer, cfg.data.max_prompt_length, loop.rollout_batch_size, seed=cfg.run.seed + 1000 * i, skip_invalid=cfg.data.skip_invalid),
                cfg.experience.kl_coef, experience_config=cfg.experience, reward_shaping=cfg.reward,
                eval_dataloader_fn=PromptLoaderFn([resolve_path(s) for s in cfg.data.eval_prompts], models.tokenizer, cfg.data.max_prompt_length, loop.eval_batch_size, train=False) if cfg.data.eval_prompts and i == 0 else None,
                accuracy_fn=get_reward_function(loop.accuracy_function) if loop.accuracy_function else None,
                seed=cfg.run.seed + i, call_timeout_s=rc.call_timeout_s, **generate_kwargs(cfg.generation),
            )
            for i, name in enumerate(maker_names)
        ]
        actors += makers

        # 4. the trainer actor; resume; the run directory
        trainer = launch.spawn_trainer(
            rc, trainer_name, maker_names, PPOModelsFn(models.actor, models.critic, models.tokenizer, dtype=m.dtype, trust_remote_code=m.trust_remote_code, lora=m.lora),
            train_batch_size=loop.train_batch_size, buffer_limit=rc.buffer_limit or batches, eps_clip=cfg.loss.eps_clip, value_clip=cfg.loss.value_clip,
            callbacks=build_callbacks(cfg.callbacks) + list(callbacks), vf_coef=cfg.loss.vf_coef,
            temperature=cfg.generation.temperature if cfg.generation.do_sample else 1.0,
            optim_fn=OptimFn(cfg.actor_optim, cfg.critic_optim, total_steps * loop.update_steps),
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
    if after is not None:  # the same final eval row single-process PPO writes, for `olingo report`
        with open(run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": summary["steps"], "split": "eval", "time": time.time(), "eval_name": "eval", **after}) + "\n")
    result = {"run_dir": str(run_dir), "final_model": str(run_dir / "checkpoints" / "final" / "actor"), "eval_before": before, "eval": after, "steps": summary["steps"], "ray": summary}
    (run_dir / "ray_summary.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result


def _evaluator(cfg: PPOConfig, maker: Any, launch: Any):  # noqa: ANN202 - a closure
    overrides = {"temperature": cfg.loop.eval_temperature} if cfg.loop.eval_temperature is not None else {}

    def evaluate() -> dict[str, float]:
        metrics, _ = launch.call(cfg.ray, maker.evaluate.remote(seed=cfg.run.seed, **overrides))
        return {f"eval/{k}": v for k, v in metrics.items()}

    return evaluate
