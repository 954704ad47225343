"""The typed config of `olingo grpo`: one section per component.

`experience` goes to the group experience maker, `loss` to the learner, `loop` to the trainer's
loop, `generation` to the rollout engine, `reward` to the reward. No critic section exists:
the GRPO family trains none. Shared by the single-process recipe (`olingo.recipes.grpo`) and the
Ray one (`olingo.recipes.grpo_ray`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from olingo.config import ConfigError, StrictModel
from olingo.experience_maker.group import GroupExperienceConfig
from olingo.gateway.config import AgentSection
from olingo.models.packing import PACKING_DESCRIPTION
from olingo.ray.config import RayConfig
from olingo.recipes.common import (
    CallbackSpec,
    LoggingConfig,
    LoraSettings,
    OptimizerConfig,
    PluginConfig,
    RunConfig,
)
from olingo.recipes.online_config import EnvironmentConfig, GenerationSection, PromptDataConfig, check_one_source
from olingo.recipes.rewards import RewardSource
from olingo.trainer.grpo_learner import GRPOLossConfig
from olingo.trainer.offpolicy_fields import check_one_step_per_episode
from olingo.trainer.online_config import OnlineLoopConfig


class GRPOModelConfig(StrictModel):
    """The policy and, when the KL term is on, its frozen reference."""

    actor: str = Field(
        "builtin:tiny-llama",
        description="the policy to train: an SFT model directory, hub id or GGUF file (builtin:smollm2 = SmolLM2-135M-Instruct); "
        "other model paths take GGUF files too",
    )
    reference: str | None = Field(
        None,
        description="frozen reference model for the KL term "
        "(default: actor; with LoRA: the actor's base with adapters disabled, no second copy); not loaded when experience.kl_coef is 0",
    )
    teacher: str | None = Field(
        None,
        description="frozen teacher for on-policy distillation (experience.distill_coef > 0): a causal LM directory, hub id, "
        "GGUF file or builtin: name sharing the actor's tokenizer; not loaded otherwise",
    )
    teacher_engine: Literal["hf", "vllm"] = Field(
        "hf",
        description="where the teacher scores the samples: hf = a frozen model in the trainer's process (like the reference); "
        "vllm = an in-process vLLM engine of its own, built with generation.vllm's settings, scoring at temperature 1 only "
        "(needs generation.engine=hf, one process, no Ray; docs/algorithms.md)",
    )
    tokenizer: str | None = Field(None, description="tokenizer directory (default: actor)")
    chat_template: str | None = Field(
        None,
        description="chat template for a model without one (a base model), replacing the tokenizer's own: "
        "a Jinja template string or the path of a file holding one; saved with the exported model",
    )
    gguf_file: str | None = Field(None, description="the GGUF file to load when model.actor is a directory holding several")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="parameter dtype")
    trust_remote_code: bool = Field(False, description="allow model code from the hub")
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward")
    packing: bool = Field(True, description=PACKING_DESCRIPTION)
    lora: LoraSettings = Field(
        default_factory=LoraSettings,
        description="LoRA adapters via peft for the actor (lora.r > 0); "
        "the reference (KL term) is then the actor with its adapters disabled unless model.reference is set",
    )


class GRPOLoopConfig(OnlineLoopConfig):
    """The GRPO loop: the online loop with GRPO's batch sizes and mu (update_steps)."""

    update_steps: int = Field(
        1, ge=1,
        description="mu: passes over each episode's rollouts (DAPO/TRL num_iterations); "
        "1 with one optimizer step per episode needs no pi_old forward",
    )
    rollout_batch_size: int = Field(8, ge=1, description="prompts per collect step per process (each answered experience.num_generations times)")
    train_batch_size: int = Field(16, ge=1, description="rollouts per minibatch per process")


class GRPOConfig(StrictModel):
    """GRPO and its family (`olingo grpo`): Dr. GRPO, DAPO, RLOO, REINFORCE++ by settings."""

    run: RunConfig = Field(default_factory=lambda: RunConfig(name="grpo"), description="run directory, seed, resume")
    model: GRPOModelConfig = Field(default_factory=GRPOModelConfig, description="policy and reference")
    reward: RewardSource = Field(
        default_factory=lambda: RewardSource(functions={"arithmetic_exact": 1.0}),
        description="reward functions and/or a reward model",
    )
    data: PromptDataConfig = Field(default_factory=PromptDataConfig, description="prompts")
    generation: GenerationSection = Field(default_factory=GenerationSection, description="rollout sampling")
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig, description="multi-turn episodes with an environment or tools (docs/agents.md)")
    agent: AgentSection = Field(
        default_factory=AgentSection, description="an existing agent program trained through an OpenAI-compatible endpoint (docs/agents.md)",
    )
    experience: GroupExperienceConfig = Field(
        default_factory=GroupExperienceConfig,
        description="groups, advantage estimator, KL, dynamic sampling, overlong punishment",
    )
    loss: GRPOLossConfig = Field(default_factory=GRPOLossConfig, description="the objective (ppo_clip, gspo, cispo, sapo), clipping, aggregation, ptx")
    loop: GRPOLoopConfig = Field(default_factory=GRPOLoopConfig, description="episodes, batch sizes, checkpoints, evaluation")
    actor_optim: OptimizerConfig = Field(default_factory=lambda: OptimizerConfig(lr=1e-6), description="policy optimisation")
    plugin: PluginConfig = Field(default_factory=PluginConfig, description="parallel strategy")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="loggers")
    callbacks: list[CallbackSpec] = Field(default_factory=list, description="extra callbacks, [{kind, params}]")
    ray: RayConfig = Field(default_factory=RayConfig, description="detached mode on Ray (rollout workers and trainer as actors)")

    @model_validator(mode="after")
    def _some_reward(self) -> GRPOConfig:
        check_one_source(self.environment, self.agent)
        distilling = self.experience.distill_coef > 0
        if (self.model.teacher is not None) != distilling:
            raise ValueError("model.teacher and experience.distill_coef > 0 come together (on-policy distillation): set both or neither")
        if distilling and self.model.teacher_engine == "vllm":
            check_teacher_engine(self)
        if distilling and not self._has_reward_terms():  # distillation alone: the teacher is the only signal
            if self.experience.dynamic_sampling:
                raise ValueError("experience.dynamic_sampling drops groups of equal scores, and distillation without reward terms scores all equal")
            return self
        self.reward.check_present(self.environment.name or self.agent.function)
        return self

    def _has_reward_terms(self) -> bool:
        r = self.reward
        return r.model is not None or bool(r.functions) or r.judge.enabled or self.environment.name is not None or self.agent.function is not None


def check_teacher_engine(cfg: GRPOConfig) -> None:
    """What a teacher on its own vLLM engine needs: a process without a second vLLM engine and
    log-probs at temperature 1 (vLLM's prompt log-probs are of the raw logits)."""
    if cfg.generation.engine == "vllm":
        raise ValueError("model.teacher_engine=vllm needs generation.engine=hf: two in-process vLLM engines cannot share one process")
    if cfg.ray.enabled:
        raise ValueError("model.teacher_engine=vllm runs in one process; with ray.enabled each maker loads the teacher as a model (teacher_engine=hf)")
    sampled = cfg.generation.temperature if cfg.generation.do_sample else 1.0
    evaluated = cfg.loop.eval_temperature if cfg.loop.eval_temperature is not None and cfg.generation.do_sample else sampled
    if sampled != 1.0 or evaluated != 1.0:
        raise ValueError(f"model.teacher_engine=vllm scores at temperature 1 only (vLLM's prompt log-probs are of the raw logits): "
                         f"generation.temperature={cfg.generation.temperature}, loop.eval_temperature={cfg.loop.eval_temperature}; "
                         "use teacher_engine=hf at other temperatures")


def check_grpo_config(cfg: GRPOConfig) -> None:
    """What one section alone cannot check."""
    check_one_step_per_episode(cfg.loss, cfg.loop.steps_per_episode(cfg.experience.num_generations))
    if cfg.loss.ptx_coef > 0 and not cfg.data.pretrain:
        raise ConfigError("loss.ptx_coef > 0 needs data.pretrain (SFT-format rows for the ptx loss)")
    if cfg.experience.overlong_buffer > cfg.generation.max_new_tokens:
        raise ConfigError(
            f"experience.overlong_buffer ({cfg.experience.overlong_buffer}) is longer than generation.max_new_tokens "
            f"({cfg.generation.max_new_tokens}): the penalty zone must fit inside the length limit"
        )
