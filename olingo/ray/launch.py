"""`olingo ppo` with `ray.enabled: true`: PPO with experience makers and the trainer as Ray actors.

The recipe, top to bottom:
    1. check the config, seed, open the run directory
    2. join the Ray cluster named by `ray.address` / $RAY_ADDRESS, or start a local instance
    3. create `ray.num_makers` ExperienceMakerHolder actors (each loads its own actor, critic,
       reward and reference models and its own shuffle of the prompts)
    4. create the DetachedPPOTrainer actor (actor + critic + optimizers; loggers and
       checkpoints in the run directory); resume it when asked
    5. evaluate the starting policy through maker 0 (fresh runs)
    6. fit: `ppo.episodes` episodes of ceil(collect_steps * rollout_batch_size / train_batch_size)
       batches, `ppo.update_steps` passes over each; the makers are stopped when fit ends
    7. evaluate the final policy through maker 0, write ray_summary.json, remove every actor,
       and shut Ray down when this process started it
Paths are resolved here, on the driver: on a multi-node cluster they must exist on every node.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray

from olingo.booster import SingleProcessPlugin
from olingo.config import ConfigError
from olingo.dataset.prompts import PromptCollator, build_prompt_dataset
from olingo.models import RewardModel, load_causal_lm, load_tokenizer
from olingo.models.critic import Critic
from olingo.models.rlvr import RLVRRewardModel, get_reward_function
from olingo.ray.detached_trainer_ppo import DetachedPPOTrainer
from olingo.ray.experience_maker_holder import ExperienceMakerHolder
from olingo.recipes.common import (
    LoraSettings,
    OptimizerConfig,
    build_callbacks,
    check_run_dir,
    commit_run_dir,
    optimizer_and_schedule,
    resolve_path,
    resume_checkpoint,
)
from olingo.recipes.ppo import PPOConfig, generate_kwargs
from olingo.trainer.callbacks import Callback
from olingo.trainer.utils import seed_everything

logger = logging.getLogger("olingo.ray")


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
    reward: str | RLVRRewardModel | None = None  # a reward-model directory or reward functions
    dtype: str = "float32"
    trust_remote_code: bool = False
    lora: LoraSettings | None = None  # adapters on actor and critic; then only they (and the value head) are synced

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
    algo = cfg.ppo
    problems = []
    if algo.ptx_coef > 0:
        problems.append("ppo.ptx_coef must be 0 (the trainer actor has no pretrain data)")
    if algo.accumulation_steps != 1:
        problems.append("ppo.accumulation_steps must be 1 (one optimizer step per buffer batch; raise ppo.train_batch_size instead)")
    if algo.sample_buffer:
        problems.append("ppo.sample_buffer must be false (the trainer pops batches from its buffer)")
    if cfg.plugin.name != "single":
        problems.append("plugin.name must be 'single' (each Ray actor is one process)")
    if problems:
        raise ConfigError("ray.enabled: " + "; ".join(problems))


def start_ray(cfg: PPOConfig) -> bool:
    """Join `ray.address` / $RAY_ADDRESS, or start a local instance; True when started here."""
    if ray.is_initialized():
        return False
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
    if address:
        try:
            ray.init(address=address, log_to_driver=True)
        except ConnectionError as err:
            raise ConnectionError(
                f"could not join the Ray cluster at {address}: {err}. A cluster from `ray start` uses token "
                "authentication (the default since Ray 2.59): set RAY_AUTH_MODE=token here too; the token is read "
                "from ~/.ray/auth_token or RAY_AUTH_TOKEN"
            ) from None
        logger.info("joined the Ray cluster at %s", address)
        return False
    ray.init(num_cpus=cfg.ray.num_cpus, include_dashboard=False, log_to_driver=True)
    logger.info("started a local Ray instance with %s CPUs", ray.cluster_resources().get("CPU"))
    return True


def check_resources(cfg: PPOConfig) -> None:
    """The makers and the trainer must fit in the cluster at once, or the trainer would wait
    for resources forever: say so before creating any actor."""
    rc, total = cfg.ray, ray.cluster_resources()
    for key, name in (("num_cpus", "CPU"), ("num_gpus", "GPU")):
        need = rc.num_makers * getattr(rc.maker_resources, key) + getattr(rc.trainer_resources, key)
        if need > total.get(name, 0.0) + 1e-9:
            raise ConfigError(
                f"ray: {rc.num_makers} makers x {getattr(rc.maker_resources, key)} + trainer {getattr(rc.trainer_resources, key)} "
                f"= {need:g} {name}s, but the cluster has {total.get(name, 0.0):g}: lower ray.maker_resources/trainer_resources "
                "(fractions are allowed) or ray.num_makers"
            )


def episode_batches(cfg: PPOConfig) -> int:
    """Training batches per episode: as many rollouts as one single-process episode collects."""
    algo = cfg.ppo
    return math.ceil(algo.collect_steps * algo.rollout_batch_size / algo.train_batch_size)


def run_ppo_ray(cfg: PPOConfig, *, callbacks: Sequence[Callback] = ()) -> dict:
    """Train with PPO on Ray actors as `cfg` says; returns the run directory, evals and summary."""
    # 1. config, seed, run directory
    check_ray_config(cfg)
    algo, m, rc = cfg.ppo, cfg.model, cfg.ray
    seed_everything(cfg.run.seed)
    run_dir = check_run_dir(cfg.run)  # written only once the actors have loaded everything
    checkpoint = resume_checkpoint(cfg.run, run_dir)
    batches = episode_batches(cfg)
    total_steps = algo.episodes * batches

    # 2. Ray
    started_here = start_ray(cfg)
    actors: list[Any] = []
    try:
        check_resources(cfg)
        # 3. makers, each with its own models and its own prompt order
        tokenizer = resolve_path(m.tokenizer or m.actor)
        critic_start = resolve_path(m.critic or cfg.reward.model or m.actor)
        reward = RLVRRewardModel.from_weights(cfg.reward.functions) if cfg.reward.functions else resolve_path(cfg.reward.model)
        maker_models = PPOModelsFn(resolve_path(m.actor), critic_start, tokenizer, resolve_path(m.reference or m.actor), reward, m.dtype, m.trust_remote_code, m.lora)
        suffix = uuid.uuid4().hex[:6]
        trainer_name = f"{cfg.run.name}-trainer-{suffix}"
        maker_names = [f"{cfg.run.name}-maker{i}-{suffix}" for i in range(rc.num_makers)]
        makers = [
            ExperienceMakerHolder.options(name=name, max_restarts=rc.max_restarts, **rc.maker_resources.model_dump()).remote(
                [trainer_name], maker_models, TokenizerFn(tokenizer),
                PromptLoaderFn([resolve_path(s) for s in cfg.data.prompts], tokenizer, cfg.data.max_prompt_length, algo.rollout_batch_size, seed=cfg.run.seed + 1000 * i, skip_invalid=cfg.data.skip_invalid),
                algo.kl_coef,
                maker_kwargs=dict(
                    kl_estimator=algo.kl_estimator, kl_target=algo.kl_target, kl_horizon=algo.kl_horizon, gamma=algo.gamma, lam=algo.lam,
                    whiten_advantages=algo.whiten_advantages, normalize_reward=cfg.reward.normalize, reward_clip=cfg.reward.clip,
                    reward_placement=cfg.reward.placement, truncation_penalty=cfg.reward.truncation_penalty,
                    reuse_rollout_log_probs=algo.reuse_rollout_log_probs, skip_reference_when_kl_zero=algo.skip_reference_when_kl_zero,
                ),
                eval_dataloader_fn=PromptLoaderFn([resolve_path(s) for s in cfg.data.eval_prompts], tokenizer, cfg.data.max_prompt_length, algo.eval_batch_size, train=False) if cfg.data.eval_prompts and i == 0 else None,
                accuracy_fn=get_reward_function(algo.accuracy_function) if algo.accuracy_function else None,
                seed=cfg.run.seed + i, call_timeout_s=rc.call_timeout_s,
                **generate_kwargs(cfg.generation),
            )
            for i, name in enumerate(maker_names)
        ]
        actors += makers

        # 4. the trainer actor
        trainer = DetachedPPOTrainer.options(name=trainer_name, **rc.trainer_resources.model_dump()).remote(
            maker_names, PPOModelsFn(resolve_path(m.actor), critic_start, tokenizer, dtype=m.dtype, trust_remote_code=m.trust_remote_code, lora=m.lora),
            train_batch_size=algo.train_batch_size, buffer_limit=rc.buffer_limit or batches, eps_clip=algo.eps_clip, value_clip=algo.value_clip,
            callbacks=build_callbacks(cfg.callbacks) + list(callbacks), vf_coef=algo.vf_coef,
            temperature=cfg.generation.temperature if cfg.generation.do_sample else 1.0,
            optim_fn=OptimFn(cfg.actor_optim, cfg.critic_optim, total_steps * algo.update_steps),
            max_grad_norm=cfg.actor_optim.max_grad_norm, tokenizer_fn=TokenizerFn(tokenizer), seed=cfg.run.seed,
            max_staleness=rc.max_staleness, call_timeout_s=rc.call_timeout_s, experience_timeout_s=rc.experience_timeout_s,
            max_maker_restarts=rc.max_restarts * rc.num_makers, log_dir=str(run_dir), use_wandb=cfg.logging.wandb,
            show_progress=cfg.logging.progress, save_dir=str(run_dir), save_interval=algo.save_interval,
        )
        actors.append(trainer)
        ray.get(trainer.buffer_get_length.remote(), timeout=rc.call_timeout_s)  # constructed (resources granted, models loaded)
        if checkpoint is not None:
            ray.get(trainer.load_checkpoint.remote(str(checkpoint)), timeout=rc.call_timeout_s)
        commit_run_dir(cfg.run, cfg, run_dir)

        # 5-7. evaluate, fit (which logs the step-0 evaluation first), evaluate
        evaluate = _evaluator(cfg, makers[0]) if cfg.data.eval_prompts else None
        before = evaluate() if evaluate is not None and checkpoint is None else None
        summary = _wait(trainer.fit.remote(total_steps, batches, algo.update_steps, initial_eval=before))
        after = evaluate() if evaluate is not None else None
    finally:
        for actor in actors:
            ray.kill(actor)
        if started_here:
            ray.shutdown()
    if after is not None:  # the same final eval row single-process PPO writes, for `olingo report`
        with open(run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": summary["steps"], "split": "eval", "time": time.time(), "eval_name": "eval", **after}) + "\n")
    result = {"run_dir": str(run_dir), "final_model": str(run_dir / "checkpoints" / "final" / "actor"), "eval_before": before, "eval": after, "steps": summary["steps"], "ray": summary}
    (run_dir / "ray_summary.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result


def _evaluator(cfg: PPOConfig, maker: Any):  # noqa: ANN202 - a closure
    overrides = {"temperature": cfg.ppo.eval_temperature} if cfg.ppo.eval_temperature is not None else {}

    def evaluate() -> dict[str, float]:
        metrics, _ = ray.get(maker.evaluate.remote(seed=cfg.run.seed, **overrides), timeout=cfg.ray.call_timeout_s)
        return {f"eval/{k}": v for k, v in metrics.items()}

    return evaluate


def _wait(ref: Any, poll_s: float = 5.0) -> dict[str, Any]:
    """Wait for `fit` in short polls, so Ctrl-C reaches this process and the actors get killed."""
    while True:
        done, _ = ray.wait([ref], timeout=poll_s)
        if done:
            return ray.get(ref, timeout=poll_s)
