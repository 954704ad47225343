"""The typed config of `olingo ppo`: one section per component.

`experience` goes to the experience maker, `loss` to the learners, `loop` to the trainer's loop
(`OnlineLoopConfig`), `generation` to the rollout engine and the maker (`GenerationSection`), `reward` to the reward (its source) and the maker (its
shaping), `ray` to the Ray launch helpers. Shared by the single-process recipe
(`olingo.recipes.ppo`) and the Ray one (`olingo.recipes.ppo_ray`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from olingo.config import StrictModel
from olingo.experience_maker.config import ExperienceConfig, RewardShaping
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
from olingo.trainer.online_config import OnlineLoopConfig
from olingo.trainer.ppo_learner import PPOLossConfig


class PPOModelConfig(StrictModel):
    """The actor and where the critic starts."""

    actor: str = Field(
        "builtin:tiny-llama",
        description="the policy to train: an SFT model directory, hub id or GGUF file (builtin:smollm2 = SmolLM2-135M-Instruct); "
        "other model paths take GGUF files too",
    )
    reference: str | None = Field(None, description="frozen reference model for the KL penalty (default: actor)")
    critic: str | None = Field(None, description="critic start: a reward-model or causal-LM directory (default: reward.model, else actor)")
    tokenizer: str | None = Field(None, description="tokenizer directory (default: actor); shared by every model")
    chat_template: str | None = Field(
        None,
        description="chat template for a model without one (a base model), replacing the tokenizer's own: "
        "a Jinja template string or the path of a file holding one; saved with the exported model",
    )
    gguf_file: str | None = Field(None, description="the GGUF file to load when model.actor is a directory holding several")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="parameter dtype")
    trust_remote_code: bool = Field(False, description="allow model code from the hub")
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward (actor and critic)")
    packing: bool = Field(True, description=PACKING_DESCRIPTION)
    lora: LoraSettings = Field(
        default_factory=LoraSettings,
        description="LoRA adapters via peft for actor and critic (lora.r > 0); reference and reward stay full",
    )


class RewardConfig(RewardShaping, RewardSource):
    """Where the reward comes from: reward functions, a trained reward model, or both as weighted
    terms of one sum; then how the score is shaped before it becomes a reward."""


class PPOConfig(StrictModel):
    """PPO (`olingo ppo`)."""

    run: RunConfig = Field(default_factory=lambda: RunConfig(name="ppo"), description="run directory, seed, resume")
    model: PPOModelConfig = Field(default_factory=PPOModelConfig, description="actor, reference, critic")
    reward: RewardConfig = Field(default_factory=lambda: RewardConfig(functions={"arithmetic_exact": 1.0}), description="reward model or functions")
    data: PromptDataConfig = Field(default_factory=PromptDataConfig, description="prompts")
    generation: GenerationSection = Field(default_factory=GenerationSection, description="rollout sampling")
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig, description="multi-turn episodes with an environment or tools (docs/agents.md)")
    agent: AgentSection = Field(
        default_factory=AgentSection, description="an existing agent program trained through an OpenAI-compatible endpoint (docs/agents.md)",
    )
    experience: ExperienceConfig = Field(default_factory=ExperienceConfig, description="KL penalty, advantages, whitening (the experience maker's settings)")
    loss: PPOLossConfig = Field(default_factory=PPOLossConfig, description="policy, value and ptx losses")
    loop: OnlineLoopConfig = Field(default_factory=OnlineLoopConfig, description="episodes, batch sizes, checkpoints, evaluation")
    actor_optim: OptimizerConfig = Field(default_factory=lambda: OptimizerConfig(lr=1e-6), description="actor optimisation")
    critic_optim: OptimizerConfig = Field(default_factory=lambda: OptimizerConfig(lr=1e-5), description="critic optimisation")
    plugin: PluginConfig = Field(default_factory=PluginConfig, description="parallel strategy")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="loggers")
    callbacks: list[CallbackSpec] = Field(default_factory=list, description="extra callbacks, [{kind, params}]")
    ray: RayConfig = Field(default_factory=RayConfig, description="detached mode on Ray (rollout workers and trainer as actors)")

    @model_validator(mode="after")
    def _some_reward(self) -> PPOConfig:
        check_one_source(self.environment, self.agent)
        self.reward.check_present(self.environment.name or self.agent.function)
        return self
