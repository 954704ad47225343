"""The sections `olingo ppo` and `olingo grpo` share: the prompts (`data:`) and the rollout
engine with how it samples (`generation:`). The loop section (`loop:`) is
`olingo.trainer.online_config.OnlineLoopConfig`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from olingo.config import StrictModel
from olingo.dataset.limits import OVERLONG_DESCRIPTION, Overlong
from olingo.engines import GenerationSettings
from olingo.engines.vllm import VLLMSettings


class PromptDataConfig(StrictModel):
    """Prompts: {prompt, gt_answer?} or {messages, gt_answer?}; pretrain rows as for olingo sft."""

    prompts: list[str] = Field(default_factory=lambda: ["builtin:prompts_train"], description="prompt files, saved datasets or hub ids")
    eval_prompts: list[str] = Field(default_factory=lambda: ["builtin:prompts_eval"], description="held-out prompts (empty list: no evaluation)")
    pretrain: list[str] = Field(default_factory=list, description="SFT-format data for the ptx loss (needed when loss.ptx_coef > 0)")
    max_prompt_length: int = Field(
        512, gt=0,
        description="prompt tokens at most, chat template and generation prompt included (a longer prompt: see data.overlong)",
    )
    max_pretrain_length: int = Field(1024, gt=0, description="tokens per pretrain row (a longer row: see data.overlong)")
    skip_invalid: bool = Field(False, description="skip bad rows (and log how many) instead of stopping")
    overlong: Overlong = Field("error", description=OVERLONG_DESCRIPTION)


class GenerationSection(StrictModel):
    """Rollout sampling and the engine that samples (docs/engines.md)."""

    engine: Literal["hf", "vllm"] = Field(
        "hf",
        description="rollout engine: hf (transformers generate on the trained model itself) or vllm "
        "(an in-process vLLM engine with its own copy of the weights, synced after every update; see the vllm section)",
    )
    vllm: VLLMSettings = Field(default_factory=VLLMSettings, description="the vLLM engine's settings (engine: vllm)")

    max_new_tokens: int = Field(64, ge=1, description="response tokens at most; longer responses are truncated")
    do_sample: bool = Field(True, description="sample (true) or decode greedily")
    temperature: float = Field(1.0, gt=0, description="sampling temperature; log-probs are taken at the same temperature")
    top_k: int = Field(0, ge=0, description="sample from the k most likely tokens (0: off)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass (1.0: off)")
    stop_strings: list[str] = Field(
        default_factory=list,
        description="extra strings that end a response "
        "(the eos tokens always do: the tokenizer's, and any other the model's generation_config.json names, e.g. an end-of-turn token)",
    )

    def settings(self, stop_token_ids: list[int], **overrides: object) -> GenerationSettings:
        """The sampling fields as the engines' `GenerationSettings` (what to sample, not which
        engine), ending at the policy's stop ids (`olingo.models.stop_token_ids`); `overrides`
        replace fields (evaluation's temperature, greedy decoding)."""
        fields = {**self.model_dump(exclude={"engine", "vllm"}), **overrides}
        return GenerationSettings(**{**fields, "stop_strings": fields["stop_strings"] or None, "stop_token_ids": list(stop_token_ids)})


class EnvironmentConfig(StrictModel):
    """Multi-turn episodes (docs/agents.md): an environment answers each assistant turn with tool
    results or observations until it says the episode is done. Unset: single-turn completions."""

    name: str | None = Field(
        None, description="the environment: a registered name or package.module:Class (null: single-turn completions, no environment)",
    )
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments the environment class is built with (once per episode)")
    max_turns: int = Field(4, ge=1, description="assistant turns per episode at most")
    max_new_tokens: int = Field(256, ge=1, description="sampled tokens per assistant turn at most (also capped by generation.max_new_tokens)")
    max_episode_tokens: int = Field(
        1024, ge=1, description="response tokens of a whole episode, sampled and environment ones; a turn or reply past it ends the episode",
    )
    step_timeout_s: float = Field(30.0, gt=0, description="seconds an environment's reset or step may take; past it the episode ends with reward 0")

    def source(self, engine: Any, tokenizer: Any) -> Any:
        """The `MultiTurnSource` of this section on `engine` (None when no environment is named)."""
        if self.name is None:
            return None
        from olingo.rollout.environment import resolve_environment
        from olingo.rollout.multi_turn import EpisodeLimits, MultiTurnSource

        cls, params = resolve_environment(self.name), dict(self.params)
        limits = EpisodeLimits(self.max_turns, self.max_new_tokens, self.max_episode_tokens)
        return MultiTurnSource(engine, tokenizer, lambda: cls(**params), limits, tokenizer.pad_token_id, self.step_timeout_s)
