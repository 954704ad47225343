"""The sections `olingo ppo` and `olingo grpo` share: the prompts (`data:`) and the rollout
engine with how it samples (`generation:`). The loop section (`loop:`) is
`olingo.trainer.online_config.OnlineLoopConfig`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, model_validator

from olingo.config import StrictModel
from olingo.dataset.limits import OVERLONG_DESCRIPTION, Overlong
from olingo.engines import GenerationSettings
from olingo.engines.vllm import VLLMSettings

logger = logging.getLogger("olingo.rollout")


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


class EnvironmentChoice(StrictModel):
    """An environment a prompt row may name by an alias (`environment.choices`)."""

    name: str = Field(description="the environment: a registered name (arithmetic_retry, tools, ...) or package.module:Class")
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments the environment class is built with (once per episode)")


class EnvironmentConfig(StrictModel):
    """Multi-turn episodes (docs/agents.md): an environment answers each assistant turn with tool
    results or observations until it says the episode is done. Unset: single-turn completions."""

    name: str | None = Field(
        None,
        description="the environment: a registered name (arithmetic_retry; tools, whose params name the tools; python_tests, model-written "
        "code run in a sandbox against a row's tests) or package.module:Class "
        "(null: single-turn completions, no environment). A prompt row may name its own in a field 'environment' "
        "(an alias of environment.choices, or any such name, built without params); rows without it use this one",
    )
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="keyword arguments the environment class is built with (once per episode), checked when the config loads; for tools: "
        "{tools: [package.module:function, ...], reward: a reward-function name or path, call_timeout_s, max_invalid_calls, "
        "max_calls_per_turn, result_role}",
    )
    choices: dict[str, EnvironmentChoice] = Field(
        default_factory=dict,
        description="environments prompt rows may name by alias in their 'environment' field, each {name, params}, e.g. "
        "{calc: {name: tools, params: {tools: [my_pkg.tools:add]}}}",
    )
    max_turns: int = Field(4, ge=1, description="assistant turns per episode at most")
    max_new_tokens: int = Field(
        256, ge=1, description="sampled tokens per assistant turn at most; capped by generation.max_new_tokens (a warning at start says when it is)",
    )
    max_episode_tokens: int = Field(
        1024, ge=1, description="response tokens of a whole episode, sampled and environment ones; a turn or reply past it ends the episode",
    )
    step_timeout_s: float = Field(30.0, gt=0, description="seconds an environment's reset or step may take; past it the episode ends with reward 0")
    reward_weight: float = Field(
        1.0, ge=0, description="weight of the environment's rewards (summed over the episode's steps) in the score, beside reward.functions' own weights",
    )

    @model_validator(mode="after")
    def _environments_build(self) -> EnvironmentConfig:
        """Every environment named resolves and takes its params, before anything loads."""
        if self.choices and self.name is None:
            raise ValueError("environment.choices needs environment.name: the environment of rows that name none")
        if self.name is not None:
            self.catalog().check_all()
        return self

    def catalog(self) -> Any:
        """The `EnvironmentCatalog` of this section: the default environment and the choices."""
        from olingo.rollout.environment import EnvironmentCatalog

        choices = {alias: (choice.name, choice.params) for alias, choice in self.choices.items()}
        return EnvironmentCatalog(self.name, self.params, choices, key="environment")

    def check_tokenizer(self, tokenizer: Any) -> None:
        """A one-line error naming the field to set unless the chat template renders the tool
        results of every configured tool environment (`check_result_roles`); cheap, so it runs as
        soon as the tokenizer is loaded."""
        if self.name is not None:
            from olingo.rollout.tools import check_result_roles

            check_result_roles(self.catalog(), tokenizer)

    def source(self, engine: Any, tokenizer: Any, prompt_sources: Sequence[str] = (), *, split_rows: bool = False) -> Any:
        """The `MultiTurnSource` of this section on `engine` (None when no environment is named),
        after checking the `environment` field of every row of `prompt_sources` and the chat
        template (`check_tokenizer`). split_rows: a template split goes on in a new segment of the
        row (the forwards pack: `model.packing`)."""
        if self.name is None:
            return None
        from olingo.rollout.multi_turn import EpisodeLimits, MultiTurnSource

        self.check_tokenizer(tokenizer)
        catalog = self.catalog()
        check_row_environments(catalog, prompt_sources)
        limits = EpisodeLimits(self.max_turns, self.max_new_tokens, self.max_episode_tokens)
        return MultiTurnSource(
            engine, tokenizer, catalog.factory(), limits, tokenizer.pad_token_id, self.step_timeout_s, environment_for=catalog.factory,
            reward_weight=self.reward_weight, split_rows=split_rows,
        )


def warn_turn_cap(environment: EnvironmentConfig, generation: GenerationSection) -> None:
    """A warning at start when `generation.max_new_tokens` caps `environment.max_new_tokens`:
    every turn samples at most the smaller of the two."""
    if environment.name is not None and environment.max_new_tokens > generation.max_new_tokens:
        logger.warning(
            "environment.max_new_tokens=%d is capped by generation.max_new_tokens=%d: each assistant turn samples at most %d tokens "
            "(raise generation.max_new_tokens for longer turns, or set environment.max_new_tokens to at most it)",
            environment.max_new_tokens, generation.max_new_tokens, generation.max_new_tokens,
        )


def check_one_source(environment: EnvironmentConfig, agent: Any) -> None:
    """An environment and an agent are two rollout sources: a run has one."""
    if environment.name is not None and agent.function is not None:
        raise ValueError("environment.name and agent.function both set: episodes come from an environment or from an agent program, not both")


def check_template(environment: EnvironmentConfig, agent: Any, generation: Any, tokenizer: Any) -> None:
    """The rollout source's chat-template probe (a tool role the template lacks: one line, exit 2)
    and the environment's turn-cap warning. Both need the tokenizer alone, so the recipes call this
    as soon as it loads, before any model does."""
    if agent.function is not None:
        agent.check_tokenizer(tokenizer)
    environment.check_tokenizer(tokenizer)
    warn_turn_cap(environment, generation)


def source_section(cfg: Any) -> Any:
    """The section that builds the run's rollout source (`agent:` or `environment:`), or None
    for single-turn completions."""
    if cfg.agent.function is not None:
        return cfg.agent
    return cfg.environment if cfg.environment.name is not None else None


def check_row_environments(catalog: Any, sources: Sequence[str]) -> None:
    """A one-line error naming the file and row of the first prompt row whose `environment` field
    names no environment (with a did-you-mean). Unreadable rows are left for the data loading."""
    from olingo.dataset.errors import DataError
    from olingo.dataset.loading import iter_rows_or_errors
    from olingo.recipes.common import resolve_path
    from olingo.rollout.environment import ROW_FIELD

    checked: set[str] = set()
    for source in sources:
        try:
            for number, raw in iter_rows_or_errors(resolve_path(source)):
                name = raw.get(ROW_FIELD) if isinstance(raw, dict) else None
                if name is not None and (not isinstance(name, str) or name not in checked):
                    catalog.check_name(name, f"{source}, row {number}")
                    checked.add(name)
        except DataError:
            continue  # a source that cannot be read: loading the data says so, with its reason
