"""`olingo ppo`: PPO from an SFT model against a reward model or verifiable reward functions.

The recipe, top to bottom:
    1. parse the config, seed, open the run directory (config.yaml)
    2. load the tokenizer, the actor and its frozen copy (the reference), the critic, the reward
    3. load and validate prompts (and pretrain rows for the ptx loss)
    4. build loaders, optimizers and schedules sized in optimizer steps
    5. boost actor and critic, resume if asked, fit, report held-out metrics
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field, model_validator

from olingo.booster import Booster
from olingo.config import ConfigError, StrictModel
from olingo.dataset import SFTCollator, build_sft_dataset
from olingo.dataset.prompts import PromptCollator, build_prompt_dataset
from olingo.models import RewardModel, load_causal_lm, load_tokenizer
from olingo.models.critic import Critic
from olingo.models.rlvr import RLVRRewardModel, get_reward_function
from olingo.recipes.common import (
    CallbackSpec,
    LoggingConfig,
    LoraSettings,
    OptimizerConfig,
    PluginConfig,
    RunConfig,
    attach_experiment,
    build_callbacks,
    check_batch_fits,
    check_model_paths,
    enable_gradient_checkpointing,
    make_plugin,
    open_run,
    optimizer_and_schedule,
    resolve_path,
)
from olingo.trainer._support import Evaluator
from olingo.trainer.callbacks import Callback, LogContext
from olingo.trainer.callbacks.builtin import PerformanceEvaluator
from olingo.trainer.ppo import PPOTrainer, ppo_steps_per_episode


class PPOModelConfig(StrictModel):
    """The actor and where the critic starts."""

    actor: str = Field("builtin:tiny-llama", description="the policy to train: an SFT model directory or hub id")
    reference: str | None = Field(None, description="frozen reference model for the KL penalty (default: actor)")
    critic: str | None = Field(None, description="critic start: a reward-model or causal-LM directory (default: reward.model, else actor)")
    tokenizer: str | None = Field(None, description="tokenizer directory (default: actor); shared by every model")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="parameter dtype")
    trust_remote_code: bool = Field(False, description="allow model code from the hub")
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward (actor and critic)")
    lora: LoraSettings = Field(default_factory=LoraSettings, description="LoRA adapters via peft for actor and critic (lora.r > 0); reference and reward stay full")


class RewardConfig(StrictModel):
    """Where the reward comes from: a trained reward model, or reward functions (RLVR)."""

    model: str | None = Field(None, description="reward-model directory (olingo rm output); scored at the last real token")
    functions: dict[str, float] = Field(default_factory=dict, description="reward functions by name with weights, e.g. {arithmetic_exact: 1.0}")
    clip: float | None = Field(5.0, gt=0, description="clip the sequence score to [-clip, clip] (null: no clipping)")
    normalize: bool = Field(False, description="normalise scores with a running mean and std")
    placement: Literal["last", "every"] = Field("last", description="add the score at the last response token, or to every token")
    truncation_penalty: float = Field(0.0, ge=0, description="subtracted from the score of responses cut off at max_new_tokens")

    @model_validator(mode="after")
    def _one_source(self) -> RewardConfig:
        if (self.model is None) == (not self.functions):
            raise ValueError("set exactly one of reward.model (a reward-model directory) or reward.functions ({name: weight})")
        for name in self.functions:
            get_reward_function(name)
        return self


class PPODataConfig(StrictModel):
    """Prompts: {prompt, gt_answer?} or {messages, gt_answer?}; pretrain rows as for olingo sft."""

    prompts: list[str] = Field(default_factory=lambda: ["builtin:prompts_train"], description="prompt files, saved datasets or hub ids")
    eval_prompts: list[str] = Field(default_factory=lambda: ["builtin:prompts_eval"], description="held-out prompts (empty list: no evaluation)")
    pretrain: list[str] = Field(default_factory=list, description="SFT-format data for the ptx loss (needed when ppo.ptx_coef > 0)")
    max_prompt_length: int = Field(256, gt=0, description="prompt tokens kept (the end of longer prompts)")
    max_pretrain_length: int = Field(512, gt=0, description="tokens per pretrain row")
    skip_invalid: bool = Field(False, description="skip bad rows (and log how many) instead of stopping")


class GenerationConfig(StrictModel):
    """Rollout sampling (transformers generate with a KV cache)."""

    max_new_tokens: int = Field(64, ge=1, description="response tokens at most; longer responses are truncated")
    do_sample: bool = Field(True, description="sample (true) or decode greedily")
    temperature: float = Field(1.0, gt=0, description="sampling temperature; log-probs are taken at the same temperature")
    top_k: int = Field(0, ge=0, description="sample from the k most likely tokens (0: off)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass (1.0: off)")
    stop_strings: list[str] = Field(default_factory=list, description="extra strings that end a response (the eos token always does)")


class PPOAlgoConfig(StrictModel):
    """PPO loop and loss settings."""

    episodes: int = Field(10, ge=1, description="collect-then-learn rounds")
    collect_steps: int = Field(1, ge=1, description="prompt batches collected per episode")
    update_steps: int = Field(1, ge=1, description="PPO epochs over each episode's experience")
    rollout_batch_size: int = Field(16, ge=1, description="prompts per collect step per process")
    train_batch_size: int = Field(8, ge=1, description="rollouts per minibatch per process")
    accumulation_steps: int = Field(1, ge=1, description="minibatches per optimizer step")
    kl_coef: float = Field(0.1, ge=0, description="KL penalty coefficient (initial value when adaptive)")
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k1", description="per-token KL estimate in the reward")
    kl_target: float | None = Field(None, gt=0, description="adaptive KL: target per-sequence KL (null: fixed kl_coef)")
    kl_horizon: int = Field(10000, ge=1, description="adaptive KL horizon in rollouts")
    gamma: float = Field(1.0, ge=0, le=1, description="GAE discount")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda")
    whiten_advantages: bool = Field(True, description="normalise advantages per experience batch")
    global_whitening: bool = Field(False, description="whiten with the statistics of every data-parallel rank's batch together (as one process would), not per rank")
    reuse_rollout_log_probs: bool = Field(False, description="take pi_old log-probs from generate's own logits instead of a second actor forward (faster; holds B x A x vocab logits while generating)")
    skip_reference_when_kl_zero: bool = Field(False, description="with a fixed kl_coef of 0, skip the reference model's forward (the logged KL then reads 0)")
    eps_clip: float = Field(0.2, gt=0, description="policy ratio clip")
    value_clip: float = Field(0.2, gt=0, description="value clip around the rollout-time values")
    vf_coef: float = Field(1.0, ge=0, description="value-loss weight")
    ptx_coef: float = Field(0.0, ge=0, description="weight of the pretraining LM loss (needs data.pretrain)")
    buffer_limit: int = Field(0, ge=0, description="keep at most this many rollouts (0: all of the episode)")
    sample_buffer: bool = Field(False, description="train on randomly sampled minibatches instead of full passes")
    offload_inference_models: bool = Field(True, description="keep reference and reward models on CPU while learning")
    save_interval: int = Field(0, ge=0, description="checkpoint at the end of the episode reaching every N optimizer steps (0: final only)")
    eval_interval: int = Field(0, ge=0, description="evaluate on eval_prompts at the end of the episode reaching every N optimizer steps")
    eval_batch_size: int = Field(64, ge=1, description="prompts per evaluation batch")
    eval_temperature: float | None = Field(None, gt=0, description="sampling temperature for evaluation (default: the rollout temperature)")
    accuracy_function: str | None = Field(None, description="reward function counted as accuracy in evaluation (e.g. arithmetic_exact)")


class ActorResources(StrictModel):
    """Ray resources of one actor."""

    num_cpus: float = Field(1.0, ge=0, description="CPUs reserved for the actor (also its torch threads)")
    num_gpus: float = Field(0.0, ge=0, description="GPUs reserved for the actor (fractions share a GPU)")


class RayConfig(StrictModel):
    """Detached mode: experience makers and the trainer as separate Ray actors (olingo.ray)."""

    enabled: bool = Field(False, description="run PPO as Ray actors instead of one process")
    address: str | None = Field(None, description="Ray cluster to join (default: $RAY_ADDRESS, else start a local instance)")
    num_cpus: int | None = Field(None, ge=1, description="CPUs of the local Ray instance started when none is joined (default: all)")
    num_makers: int = Field(1, ge=1, description="experience-maker actors, each with its own actor/critic/reward/reference copies")
    maker_resources: ActorResources = Field(default_factory=ActorResources, description="resources of each maker")
    trainer_resources: ActorResources = Field(default_factory=ActorResources, description="resources of the trainer")
    buffer_limit: int = Field(0, ge=0, description="training batches the trainer's buffer holds before makers wait (0: one episode's worth)")
    max_staleness: int | None = Field(1, ge=0, description="drop experience made more than this many weight syncs ago (null: keep all)")
    max_restarts: int = Field(3, ge=0, description="times Ray restarts a dead maker (it then gets the current weights)")
    call_timeout_s: float = Field(300.0, gt=0, description="limit of every remote call")
    experience_timeout_s: float = Field(600.0, gt=0, description="longest wait for the next experience batch")


class PPOConfig(StrictModel):
    """PPO (`olingo ppo`)."""

    run: RunConfig = Field(default_factory=lambda: RunConfig(name="ppo"), description="run directory, seed, resume")
    model: PPOModelConfig = Field(default_factory=PPOModelConfig, description="actor, reference, critic")
    reward: RewardConfig = Field(default_factory=lambda: RewardConfig(functions={"arithmetic_exact": 1.0}), description="reward model or functions")
    data: PPODataConfig = Field(default_factory=PPODataConfig, description="prompts")
    generation: GenerationConfig = Field(default_factory=GenerationConfig, description="rollout sampling")
    ppo: PPOAlgoConfig = Field(default_factory=PPOAlgoConfig, description="PPO loop and losses")
    actor_optim: OptimizerConfig = Field(default_factory=lambda: OptimizerConfig(lr=1e-6), description="actor optimisation")
    critic_optim: OptimizerConfig = Field(default_factory=lambda: OptimizerConfig(lr=1e-5), description="critic optimisation")
    plugin: PluginConfig = Field(default_factory=PluginConfig, description="parallel strategy")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="loggers")
    callbacks: list[CallbackSpec] = Field(default_factory=list, description="extra callbacks, [{kind, params}]")
    ray: RayConfig = Field(default_factory=RayConfig, description="detached mode on Ray (rollout workers and trainer as actors)")


def generate_kwargs(cfg: GenerationConfig, temperature: float | None = None) -> dict:
    kwargs = cfg.model_dump()
    kwargs["stop_strings"] = kwargs["stop_strings"] or None
    if temperature is not None:
        kwargs["temperature"] = temperature
    return kwargs


def load_reward(cfg: PPOConfig, tokenizer) -> RewardModel | RLVRRewardModel:  # noqa: ANN001
    if cfg.reward.functions:
        return RLVRRewardModel.from_weights(cfg.reward.functions)
    model = RewardModel.from_pretrained(resolve_path(cfg.reward.model), pad_token_id=tokenizer.pad_token_id, dtype=cfg.model.dtype, trust_remote_code=cfg.model.trust_remote_code)
    return model.eval().requires_grad_(False)


def run_ppo(cfg: PPOConfig, *, callbacks: Sequence[Callback] = (), ctx: LogContext | None = None, evaluators: Sequence[Evaluator] = ()) -> dict:
    """Train with PPO as `cfg` says; returns the run directory, final actor and eval metrics."""
    if cfg.ray.enabled:  # olingo.ray is the only package that imports ray
        if ctx is not None or evaluators:
            raise ConfigError("ray.enabled is not available inside an experiment: its callbacks run in the trainer actor, not here")
        from olingo.ray.launch import run_ppo_ray

        return run_ppo_ray(cfg, callbacks=callbacks)
    algo, m = cfg.ppo, cfg.model
    if algo.ptx_coef > 0 and not cfg.data.pretrain:
        raise ConfigError("ppo.ptx_coef > 0 needs data.pretrain (SFT-format rows for the ptx loss)")
    # 1. seed, plugins (one per trained model: each clips its own gradients), run directory
    setup = open_run(cfg.run, cfg.plugin, cfg.actor_optim.max_grad_norm, cfg, cfg.logging)
    actor_booster, critic_booster = setup.booster, Booster(make_plugin(cfg.plugin, cfg.critic_optim.max_grad_norm))

    # 2. models: actor, frozen reference, critic, reward
    check_model_paths({"model.actor": m.actor, "model.reference": m.reference, "model.critic": m.critic, "model.tokenizer": m.tokenizer, "reward.model": cfg.reward.model})
    tokenizer = load_tokenizer(resolve_path(m.tokenizer or m.actor), padding_side="left")
    load = dict(dtype=m.dtype, trust_remote_code=m.trust_remote_code)
    actor = m.lora.apply(load_causal_lm(resolve_path(m.actor), **load))
    reference = load_causal_lm(resolve_path(m.reference or m.actor), **load).eval().requires_grad_(False)
    critic = m.lora.apply(Critic.from_pretrained(resolve_path(m.critic or cfg.reward.model or m.actor), pad_token_id=tokenizer.pad_token_id, **load))
    reward = load_reward(cfg, tokenizer)
    if m.gradient_checkpointing:
        enable_gradient_checkpointing(actor)
        enable_gradient_checkpointing(critic)
    inference_device = "cpu" if algo.offload_inference_models else setup.plugin.device
    reference.to(inference_device)
    reward.to(inference_device)

    # 3. data, validated before any training
    prompts = build_prompt_dataset([resolve_path(s) for s in cfg.data.prompts], tokenizer, cfg.data.max_prompt_length, skip_invalid=cfg.data.skip_invalid)
    eval_prompts = build_prompt_dataset([resolve_path(s) for s in cfg.data.eval_prompts], tokenizer, cfg.data.max_prompt_length) if cfg.data.eval_prompts else None
    pretrain = build_sft_dataset([resolve_path(s) for s in cfg.data.pretrain], tokenizer, cfg.data.max_pretrain_length, skip_invalid=cfg.data.skip_invalid) if cfg.data.pretrain else None

    # 4. loaders, optimizers, schedules sized in optimizer steps
    plugin, collate = setup.plugin, PromptCollator(tokenizer.pad_token_id)
    check_batch_fits(len(prompts), algo.rollout_batch_size, setup.coordinator.world_size, "ppo.rollout_batch_size", "data.prompts")
    if pretrain is not None:
        check_batch_fits(len(pretrain), algo.train_batch_size, setup.coordinator.world_size, "ppo.train_batch_size", "data.pretrain")
    prompt_loader = plugin.prepare_dataloader(prompts, algo.rollout_batch_size, shuffle=True, seed=cfg.run.seed, collate_fn=collate, drop_last=True)
    eval_loader = plugin.prepare_dataloader(eval_prompts, algo.eval_batch_size, shuffle=False, collate_fn=collate, even=False) if eval_prompts else None
    pretrain_loader = plugin.prepare_dataloader(pretrain, algo.train_batch_size, shuffle=True, seed=cfg.run.seed, collate_fn=SFTCollator(tokenizer.pad_token_id), drop_last=True) if pretrain else None
    total_steps = algo.episodes * ppo_steps_per_episode(
        algo.collect_steps, algo.rollout_batch_size, algo.update_steps, algo.train_batch_size, algo.accumulation_steps,
        buffer_limit=algo.buffer_limit, sample_buffer=algo.sample_buffer,
    )
    actor_optim, actor_scheduler = optimizer_and_schedule(actor, cfg.actor_optim, total_steps)
    critic_optim, critic_scheduler = optimizer_and_schedule(critic, cfg.critic_optim, total_steps)

    # 5. boost, resume, fit
    actor, actor_optim, _, _, actor_scheduler = actor_booster.boost(actor, actor_optim, lr_scheduler=actor_scheduler)
    critic, critic_optim, _, _, critic_scheduler = critic_booster.boost(critic, critic_optim, lr_scheduler=critic_scheduler)
    trainer = PPOTrainer(
        actor_booster, critic_booster, actor, critic, reward, reference, actor_optim, critic_optim,
        actor_scheduler, critic_scheduler, tokenizer, kl_coef=algo.kl_coef, ptx_coef=algo.ptx_coef,
        train_batch_size=algo.train_batch_size, buffer_limit=algo.buffer_limit, eps_clip=algo.eps_clip,
        vf_coef=algo.vf_coef, value_clip=algo.value_clip, sample_buffer=algo.sample_buffer,
        offload_inference_models=algo.offload_inference_models, accumulation_steps=algo.accumulation_steps,
        save_interval=algo.save_interval, save_dir=str(setup.run_dir), coordinator=setup.coordinator,
        callbacks=[PerformanceEvaluator(), *build_callbacks(cfg.callbacks), *callbacks],
        maker_kwargs=dict(
            kl_estimator=algo.kl_estimator, kl_target=algo.kl_target, kl_horizon=algo.kl_horizon, gamma=algo.gamma,
            lam=algo.lam, whiten_advantages=algo.whiten_advantages, global_whitening=algo.global_whitening, normalize_reward=cfg.reward.normalize,
            reward_clip=cfg.reward.clip, reward_placement=cfg.reward.placement, truncation_penalty=cfg.reward.truncation_penalty,
            reuse_rollout_log_probs=algo.reuse_rollout_log_probs, skip_reference_when_kl_zero=algo.skip_reference_when_kl_zero,
        ),
        eval_interval=algo.eval_interval,
        accuracy_fn=get_reward_function(algo.accuracy_function) if algo.accuracy_function else None,
        eval_generate_kwargs={"temperature": algo.eval_temperature} if algo.eval_temperature is not None else None,
        **generate_kwargs(cfg.generation),
    )
    trainer.show_progress = cfg.logging.progress
    trainer.run_config = cfg.model_dump(mode="json")
    attach_experiment(trainer, ctx, evaluators)
    if setup.checkpoint is not None:
        trainer.load_checkpoint(setup.checkpoint)
    setup.commit()
    artifacts = trainer.fit(
        algo.episodes, algo.collect_steps, algo.update_steps, prompt_loader, pretrain_loader,
        log_dir=str(setup.run_dir), use_wandb=cfg.logging.wandb, eval_dataloader=eval_loader,
    )
    return {
        "run_dir": str(setup.run_dir),
        "final_model": str(setup.run_dir / "checkpoints" / "final" / "actor"),
        "eval": trainer.last_eval_metrics,
        "steps": artifacts.completed_steps,
    }
