"""`olingo grpo`: the GRPO family from an SFT model against reward programs (and/or a reward model).

The recipe, top to bottom (`run_grpo`):
    1. call each user function once on a prompt row (`probe_user_functions`); seed, plugin;
       check the run directory and the checkpoint to resume
    2. load the tokenizer, the policy, the reward and, only when experience.kl_coef > 0, the
       frozen reference (with LoRA: the policy with its adapters disabled; no critic exists); with
       experience.distill_coef > 0 the frozen teacher of on-policy distillation (`load_teacher`;
       with model.teacher_engine=vllm a vLLM engine of its own, `start_teacher_engine`)
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
from transformers import AutoConfig

from olingo.config import ConfigError
from olingo.engines import ScoringEngine, VLLMSettings
from olingo.experience_maker.group import GroupExperienceMaker
from olingo.models import load_causal_lm, load_tokenizer, name_stop_tokens, stop_token_ids
from olingo.models.lora import AdaptersDisabled
from olingo.recipes.common import (
    RunSetup,
    attach_experiment,
    check_engine_config,
    check_model_paths,
    enable_gradient_checkpointing,
    open_run,
    optimizer_and_schedule,
    resolve_model_path,
)
from olingo.recipes.grpo_config import GRPOConfig, check_grpo_config
from olingo.recipes.online import environment_source, load_prompt_data, online_trainer, resume_and_fit, rollouts
from olingo.recipes.online_config import check_template
from olingo.recipes.rewards import load_reward, probe_user_functions
from olingo.rewards.functions import CompositeReward
from olingo.trainer.callbacks import Callback, LogContext
from olingo.trainer.grpo_learner import GRPOLearner
from olingo.trainer.loop_support import Evaluator
from olingo.trainer.online_trainer import OnlineTrainer


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
    teacher: torch.nn.Module | ScoringEngine | None = None  # on-policy distillation's frozen teacher (experience.distill_coef > 0)


def load_models(cfg: GRPOConfig, inference_device: torch.device | str, engine_device: torch.device | str = "cpu") -> GRPOModels:
    """Policy (LoRA when asked), reward, and the reference only when the KL term needs it: with
    LoRA and no `model.reference`, the policy itself with its adapters disabled. A teacher engine
    (`model.teacher_engine=vllm`) starts on `engine_device`, where the policy trains."""
    m = cfg.model
    check_model_paths({"model.actor": m.actor, "model.reference": m.reference, "model.tokenizer": m.tokenizer, "reward.model": cfg.reward.model,
                       "model.teacher": m.teacher})
    source = resolve_model_path(m.actor, m.gguf_file)
    tokenizer = load_tokenizer(resolve_model_path(m.tokenizer) if m.tokenizer else source, padding_side="left", chat_template=m.chat_template)
    check_template(cfg.environment, cfg.agent, cfg.generation, tokenizer)  # before any model loads
    stops = stop_token_ids(tokenizer, source)
    load = dict(dtype=m.dtype, trust_remote_code=m.trust_remote_code)
    actor = m.lora.apply(load_causal_lm(source, **load))
    name_stop_tokens(actor, stops)  # the export's generate stops where rollouts do
    reference = None  # the experience maker refuses kl_coef > 0 without one (`check_reference`)
    if cfg.experience.kl_coef > 0 and m.lora.enabled and not m.reference:
        reference = AdaptersDisabled(actor)  # the base the adapters start from: no second copy
    elif cfg.experience.kl_coef > 0:
        reference = load_causal_lm(resolve_model_path(m.reference) if m.reference else source, **load).eval().requires_grad_(False).to(inference_device)
    teacher = None
    if cfg.experience.distill_coef > 0 and m.teacher_engine == "vllm":
        teacher = start_teacher_engine(m.teacher, tokenizer, cfg.generation.vllm, engine_device)
    elif cfg.experience.distill_coef > 0:
        teacher = load_teacher(m.teacher, tokenizer, load, inference_device)
    reward = load_reward(cfg.reward, tokenizer, m.dtype, m.trust_remote_code, device=inference_device)  # device: where a judge generates
    if m.gradient_checkpointing:
        enable_gradient_checkpointing(actor)
    if isinstance(reward, torch.nn.Module | CompositeReward):
        reward.to(inference_device)
    return GRPOModels(tokenizer, actor, reward, reference, stops, teacher)


def load_teacher(path: str, tokenizer: Any, load: dict[str, Any], device: torch.device | str) -> torch.nn.Module:
    """The frozen teacher of on-policy distillation, loaded like the reference, after checking it
    reads the actor's tokens: the same vocabulary, and logits over every one of its ids."""
    source = resolve_model_path(path)
    check_teacher_tokenizer(load_tokenizer(source), tokenizer)
    teacher = load_causal_lm(source, **load)
    check_teacher_vocab(path, getattr(teacher.config, "vocab_size", None), tokenizer)
    return teacher.eval().requires_grad_(False).to(device)


def start_teacher_engine(path: str, tokenizer: Any, settings: VLLMSettings, device: torch.device | str) -> ScoringEngine:
    """The teacher on a vLLM engine of its own (`VLLMEngine.score`), after the checks `load_teacher`
    makes: the actor's vocabulary, and logits over every one of its ids."""
    source = resolve_model_path(path)
    check_teacher_tokenizer(load_tokenizer(source), tokenizer)
    check_teacher_vocab(path, getattr(AutoConfig.from_pretrained(source), "vocab_size", None), tokenizer)
    from olingo.engines.vllm import VLLMEngine  # imports vllm: only when asked for

    return VLLMEngine(source, tokenizer, settings, device=device)


def check_teacher_vocab(path: str, vocab_size: int | None, tokenizer: Any) -> None:
    """A one-line error unless the teacher's logits cover every id of the actor's tokenizer."""
    if vocab_size is not None and vocab_size < len(tokenizer):
        raise ConfigError(f"model.teacher {path}: its vocab_size ({vocab_size}) does not cover the actor's tokenizer ({len(tokenizer)} tokens)")


def check_teacher_tokenizer(teacher_tokenizer: Any, tokenizer: Any) -> None:
    """A one-line error naming model.teacher unless the teacher's tokenizer maps the same strings to
    the same ids as the actor's: the teacher scores the student's token ids, so they must mean the same."""
    theirs, ours = teacher_tokenizer.get_vocab(), tokenizer.get_vocab()
    if theirs == ours:
        return
    by_id = lambda vocab: [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]  # noqa: E731
    first = next(((i, a, b) for i, (a, b) in enumerate(zip(by_id(theirs), by_id(ours), strict=False)) if a != b), None)
    where = f"id {first[0]} is {first[1]!r} for the teacher, {first[2]!r} for the actor" if first else "one vocabulary extends the other"
    raise ConfigError(f"model.teacher must share the actor's tokenizer: {len(theirs)} vs {len(ours)} tokens; {where}")


def build_trainer(cfg: GRPOConfig, setup: RunSetup, models: GRPOModels, callbacks: Sequence[Callback]) -> OnlineTrainer:
    """AdamW and a cosine schedule for the policy, boosted; the experience maker gets
    `experience:` and `generation:`, the learner `loss:` (and the KL term of `experience:`),
    the loop `loop:`."""
    optim, scheduler = optimizer_and_schedule(models.actor, cfg.actor_optim, cfg.loop.total_steps(cfg.experience.num_generations))
    actor, optim, _, _, scheduler = setup.booster.boost(models.actor, optim, lr_scheduler=scheduler)
    sampling = rollouts(cfg, setup, models.tokenizer, models.stop_token_ids)
    maker = GroupExperienceMaker(
        setup.booster.unwrap(actor), models.reward, models.reference, models.tokenizer, config=cfg.experience, generation=sampling.generation,
        engine=sampling.engine, all_reduce_sum=setup.plugin.all_reduce_sum,
        source=environment_source(cfg, sampling.engine, setup.booster.unwrap(actor), models.tokenizer), packing=cfg.model.packing,
        teacher=models.teacher,
    )
    frozen = (models.reference, models.reward, models.teacher if isinstance(models.teacher, torch.nn.Module) else None)
    learner = GRPOLearner.build(setup.booster, actor, optim, scheduler, cfg.loss, cfg.experience, sampling.generation, packing=cfg.model.packing)
    return online_trainer(cfg, setup, learner, maker, models.tokenizer, frozen, sampling.eval_generation, callbacks)


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
    check_engine_config(cfg.model.teacher_engine if cfg.experience.distill_coef > 0 else "hf", setup.plugin, ray_enabled=False, key="model.teacher_engine")
    # 2. models: policy, reward, reference only with a KL term
    models = load_models(cfg, "cpu" if cfg.loop.offload_inference_models else setup.plugin.device, setup.plugin.device)
    try:
        # 3. data, validated before any training
        data = load_prompt_data(cfg, models.tokenizer, setup.plugin)
        # 4. optimizer, schedule, the trainer
        trainer = build_trainer(cfg, setup, models, callbacks)
        attach_experiment(trainer, ctx, evaluators)
        # 5. resume, write the run directory, fit
        return resume_and_fit(trainer, setup, cfg, data)
    finally:
        if not isinstance(models.teacher, torch.nn.Module | None):
            models.teacher.close()  # a teacher engine holds its own copy of the weights and a KV cache
