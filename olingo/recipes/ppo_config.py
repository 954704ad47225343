"""The typed config of `olingo ppo`: one section per component.

`experience` goes to the experience maker, `loss` to the learners, `loop` to the trainer's loop,
`generation` to the rollout engine, `reward` to the reward (its source) and the maker (its
shaping), `ray` to the Ray launch helpers. Shared by the single-process recipe
(`olingo.recipes.ppo`) and the Ray one (`olingo.recipes.ppo_ray`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from olingo.config import StrictModel
from olingo.dataset.limits import OVERLONG_DESCRIPTION, Overlong
from olingo.engines.vllm import VLLMSettings
from olingo.experience_maker.config import ExperienceConfig, RewardShaping
from olingo.ray.config import RayConfig
from olingo.recipes.common import (
    CallbackSpec,
    LoggingConfig,
    LoraSettings,
    OptimizerConfig,
    PluginConfig,
    RunConfig,
)
from olingo.recipes.rewards import RewardSource
from olingo.trainer.ppo_learner import PPOLossConfig


class PPOModelConfig(StrictModel):
    """The actor and where the critic starts."""

    actor: str = Field("builtin:tiny-llama", description="the policy to train: an SFT model directory, hub id or GGUF file (builtin:smollm2 = SmolLM2-135M-Instruct); other model paths take GGUF files too")
    reference: str | None = Field(None, description="frozen reference model for the KL penalty (default: actor)")
    critic: str | None = Field(None, description="critic start: a reward-model or causal-LM directory (default: reward.model, else actor)")
    tokenizer: str | None = Field(None, description="tokenizer directory (default: actor); shared by every model")
    chat_template: str | None = Field(None, description="chat template for a model without one (a base model), replacing the tokenizer's own: a Jinja template string or the path of a file holding one; saved with the exported model")
    gguf_file: str | None = Field(None, description="the GGUF file to load when model.actor is a directory holding several")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32", description="parameter dtype")
    trust_remote_code: bool = Field(False, description="allow model code from the hub")
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward (actor and critic)")
    lora: LoraSettings = Field(default_factory=LoraSettings, description="LoRA adapters via peft for actor and critic (lora.r > 0); reference and reward stay full")


class RewardConfig(RewardShaping, RewardSource):
    """Where the reward comes from: reward functions, a trained reward model, or both as weighted
    terms of one sum; then how the score is shaped before it becomes a reward."""


class PPODataConfig(StrictModel):
    """Prompts: {prompt, gt_answer?} or {messages, gt_answer?}; pretrain rows as for olingo sft."""

    prompts: list[str] = Field(default_factory=lambda: ["builtin:prompts_train"], description="prompt files, saved datasets or hub ids")
    eval_prompts: list[str] = Field(default_factory=lambda: ["builtin:prompts_eval"], description="held-out prompts (empty list: no evaluation)")
    pretrain: list[str] = Field(default_factory=list, description="SFT-format data for the ptx loss (needed when loss.ptx_coef > 0)")
    max_prompt_length: int = Field(512, gt=0, description="prompt tokens at most, chat template and generation prompt included (a longer prompt: see data.overlong)")
    max_pretrain_length: int = Field(1024, gt=0, description="tokens per pretrain row (a longer row: see data.overlong)")
    skip_invalid: bool = Field(False, description="skip bad rows (and log how many) instead of stopping")
    overlong: Overlong = Field("error", description=OVERLONG_DESCRIPTION)


class GenerationConfig(StrictModel):
    """Rollout sampling and the engine that samples (docs/engines.md)."""

    engine: Literal["hf", "vllm"] = Field("hf", description="rollout engine: hf (transformers generate on the trained model itself) or vllm (an in-process vLLM engine with its own copy of the weights, synced after every update; see the vllm section)")
    vllm: VLLMSettings = Field(default_factory=VLLMSettings, description="the vLLM engine's settings (engine: vllm)")

    max_new_tokens: int = Field(64, ge=1, description="response tokens at most; longer responses are truncated")
    do_sample: bool = Field(True, description="sample (true) or decode greedily")
    temperature: float = Field(1.0, gt=0, description="sampling temperature; log-probs are taken at the same temperature")
    top_k: int = Field(0, ge=0, description="sample from the k most likely tokens (0: off)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass (1.0: off)")
    stop_strings: list[str] = Field(default_factory=list, description="extra strings that end a response (the eos tokens always do: the tokenizer's, and any other the model's generation_config.json names, e.g. an end-of-turn token)")


class PPOLoopConfig(StrictModel):
    """The PPO loop: how much to collect, how to walk it, when to checkpoint and evaluate."""

    episodes: int = Field(10, ge=1, description="collect-then-learn rounds")
    collect_steps: int = Field(1, ge=1, description="prompt batches collected per episode")
    update_steps: int = Field(1, ge=1, description="PPO epochs over each episode's experience")
    rollout_batch_size: int = Field(16, ge=1, description="prompts per collect step per process")
    train_batch_size: int = Field(8, ge=1, description="rollouts per minibatch per process")
    accumulation_steps: int = Field(1, ge=1, description="minibatches per optimizer step")
    buffer_limit: int = Field(0, ge=0, description="keep at most this many rollouts (0: all of the episode)")
    sample_buffer: bool = Field(False, description="train on randomly sampled minibatches instead of full passes")
    offload_inference_models: bool = Field(True, description="keep reference and reward models on CPU while learning")
    save_interval: int = Field(0, ge=0, description="checkpoint at the end of the episode reaching every N optimizer steps (0: final only)")
    eval_interval: int = Field(0, ge=0, description="evaluate on eval_prompts at the end of the episode reaching every N optimizer steps")
    eval_before_training: bool = Field(True, description="evaluate the starting policy on eval_prompts before the first step (eval/* at step 0, the baseline for the gain; a resumed run does not repeat it)")
    eval_batch_size: int = Field(64, ge=1, description="prompts per evaluation batch")
    eval_temperature: float | None = Field(None, gt=0, description="sampling temperature for evaluation (default: the rollout temperature)")
    accuracy_function: str | None = Field(None, description="reward function counted as accuracy in evaluation (e.g. arithmetic_exact); called like reward.functions, row fields included, and checked on one data row at start-up")


class PPOConfig(StrictModel):
    """PPO (`olingo ppo`)."""

    run: RunConfig = Field(default_factory=lambda: RunConfig(name="ppo"), description="run directory, seed, resume")
    model: PPOModelConfig = Field(default_factory=PPOModelConfig, description="actor, reference, critic")
    reward: RewardConfig = Field(default_factory=lambda: RewardConfig(functions={"arithmetic_exact": 1.0}), description="reward model or functions")
    data: PPODataConfig = Field(default_factory=PPODataConfig, description="prompts")
    generation: GenerationConfig = Field(default_factory=GenerationConfig, description="rollout sampling")
    experience: ExperienceConfig = Field(default_factory=ExperienceConfig, description="KL penalty, advantages, whitening (the experience maker's settings)")
    loss: PPOLossConfig = Field(default_factory=PPOLossConfig, description="policy, value and ptx losses")
    loop: PPOLoopConfig = Field(default_factory=PPOLoopConfig, description="episodes, batch sizes, checkpoints, evaluation")
    actor_optim: OptimizerConfig = Field(default_factory=lambda: OptimizerConfig(lr=1e-6), description="actor optimisation")
    critic_optim: OptimizerConfig = Field(default_factory=lambda: OptimizerConfig(lr=1e-5), description="critic optimisation")
    plugin: PluginConfig = Field(default_factory=PluginConfig, description="parallel strategy")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="loggers")
    callbacks: list[CallbackSpec] = Field(default_factory=list, description="extra callbacks, [{kind, params}]")
    ray: RayConfig = Field(default_factory=RayConfig, description="detached mode on Ray (rollout workers and trainer as actors)")


def generate_kwargs(cfg: GenerationConfig, stop_token_ids: list[int], temperature: float | None = None) -> dict:
    """The `GenerationSettings` keywords of the section (what to sample, not which engine), with
    the policy's stop ids (`olingo.models.stop_token_ids`)."""
    kwargs = cfg.model_dump(exclude={"engine", "vllm"})
    kwargs["stop_strings"] = kwargs["stop_strings"] or None
    kwargs["stop_token_ids"] = list(stop_token_ids)
    if temperature is not None:
        kwargs["temperature"] = temperature
    return kwargs
