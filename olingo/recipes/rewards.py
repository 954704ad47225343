"""Where a run's reward comes from, shared by the RL recipes (`olingo ppo`, `olingo grpo`).

`RewardSource` is the part of a `reward:` section that names the reward: reward functions with
weights, a trained reward model, a generative judge (`JudgeSection`, olingo/rewards/judge.py),
or several as weighted terms of one sum. `load_reward` builds it.
`probe_user_functions` calls every user function once on a real prompt row at start-up.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from olingo.config import ConfigError, StrictModel
from olingo.dataset.errors import DataError
from olingo.dataset.loading import iter_rows_or_errors
from olingo.dataset.prompts import extra_fields, parse_prompt_row
from olingo.engines import HFEngine
from olingo.models import RewardModel, load_causal_lm, load_tokenizer
from olingo.recipes.common import check_model_paths, resolve_model_path, resolve_path
from olingo.rewards.functions import (
    CompositeReward,
    ProbeRow,
    RewardFunction,
    probe,
    reward_function,
)
from olingo.rewards.judge import JudgeReward, check_template, engine_chat
from olingo.rewards.registry import RewardError, resolve_reward


class JudgeSection(StrictModel):
    """A generative model that grades the responses, one more weighted reward term (`reward.judge`).

    It runs locally, greedily, on an olingo engine: its own frozen copy of `model`, on the
    policy's device, never the trained policy object. No `model`: no judge. See docs/algorithms.md."""

    model: str | None = Field(
        None, description="the judge (null: none): a model directory, hub id, GGUF file or builtin: name (builtin:smollm2); "
        "loaded as its own frozen copy even when it is the actor's path",
    )
    gguf_file: str | None = Field(None, description="the GGUF file to load when reward.judge.model is a directory holding several")
    mode: Literal["score", "rank"] = Field(
        "score", description="score: each response graded alone; rank: the responses to one prompt (a GRPO group) graded "
        "together, relative to each other (RULER)",
    )
    template: str | None = Field(
        None, description="the rubric: a str.format template, or the path of a file holding one (a value without '{' is a path); "
        "score mode fills {prompt}, {response}, {gt_answer}, rank mode {prompt}, {responses}, {gt_answer}; default: the mode's built-in",
    )
    weight: float = Field(1.0, ge=0, description="the judge term's weight in the reward sum (logged as rollout/reward/judge_<mode>)")
    min_score: float = Field(0.0, ge=0, description="the lowest grade the rubric asks for; grades are mapped to [0, 1] from [min_score, max_score]")
    max_score: float = Field(10.0, gt=0, description="the highest grade the rubric asks for (above min_score)")
    failure_score: float = Field(0.0, ge=0, le=1, description="the term's value, in [0, 1], for a response whose grade the reply does not give readably")
    max_new_tokens: int = Field(64, ge=1, description="the longest reply the judge may write (greedy decoding)")
    batch_size: int = Field(16, ge=1, description="judge requests generated together in one batch")
    dtype: Literal["float32", "bfloat16", "float16"] | None = Field(None, description="the judge's parameter dtype (default: the policy's)")

    @model_validator(mode="after")
    def _check(self) -> JudgeSection:
        if not self.max_score > self.min_score:
            raise ValueError(f"reward.judge.max_score ({self.max_score}) must be above reward.judge.min_score ({self.min_score})")
        self.template_text()  # a template that names the wrong fields fails at config time, not at the first step
        return self

    def template_text(self) -> str | None:
        """The rubric: the template itself, or the file's text (None: the mode's built-in), checked."""
        if self.template is None:
            return None
        text = self.template
        if "{" not in text:
            path = Path(resolve_path(text))
            if not path.is_file():
                raise ValueError(f"reward.judge.template '{text}' is neither a file nor a template (a template holds '{{response}}' or '{{responses}}')")
            text = path.read_text()
        try:
            check_template(text, self.mode)
        except ValueError as err:
            raise ValueError(f"reward.judge.template: {err}") from None
        return text

    @property
    def enabled(self) -> bool:
        """A judge is configured (`model` is set)."""
        return self.model is not None

    def resolved(self) -> JudgeSection:
        """A copy to ship to other processes (Ray actors): model path resolved, template file read (itself without a judge)."""
        if self.model is None:
            return self
        return self.model_copy(update={"model": resolve_model_path(self.model, self.gguf_file), "gguf_file": None, "template": self.template_text()})


class RewardSource(StrictModel):
    """Reward functions, a trained reward model, or both as weighted terms of one sum."""

    model: str | None = Field(None, description="reward-model directory (olingo rm output), scored at the last real token")
    model_weight: float = Field(1.0, ge=0, description="weight of the reward model's score when reward.functions are set too")
    functions: dict[str, float] = Field(
        default_factory=dict,
        description="reward functions with weights: registered names (arithmetic_exact, math_answer, math_verify, exact_match, format_regex, "
        "length_penalty, ...) or package.module:function paths, e.g. {math_answer: 1.0, my_pkg.rewards:fmt: 0.5}; "
        "each term is logged as rollout/reward/<name>",
    )
    judge: JudgeSection = Field(
        default_factory=JudgeSection,
        description="a generative model grading the responses as one more weighted term, e.g. {model: builtin:smollm2, mode: rank} "
        "(see docs/algorithms.md); off without judge.model",
    )

    def check_present(self, environment: str | None) -> None:
        """Some reward must exist: this section's, or an environment's (`environment.name`)."""
        if self.model is None and not self.functions and not self.judge.enabled and environment is None:
            raise ValueError(
                "set reward.model (a reward-model directory), reward.functions ({name: weight}), reward.judge, or several "
                "(or name an environment: its rewards may be the only ones)"
            )
        for spec in self.functions:
            resolve_reward(spec)  # an unknown name or a path that does not import fails here, before any loading
        return self


def load_reward(
    source: RewardSource, tokenizer: Any, dtype: str = "float32", trust_remote_code: bool = False, device: torch.device | str | None = None,
) -> RewardModel | CompositeReward:
    """The reward model alone, or the weighted sum of the reward functions, the judge and the model.
    device: where the judge generates, the policy's (None: the accelerator when there is one)."""
    neural = None
    if source.model is not None:
        neural = RewardModel.from_pretrained(resolve_model_path(source.model), pad_token_id=tokenizer.pad_token_id, dtype=dtype,
                                             trust_remote_code=trust_remote_code)
        neural = neural.eval().requires_grad_(False)
    if not source.functions and not source.judge.enabled:  # no model either: an environment's rewards are the only ones
        return neural if neural is not None else CompositeReward((), allow_empty=True)
    terms = list(source.functions.items())
    if source.judge.enabled:
        terms.append(judge_term(source.judge, dtype, trust_remote_code, device))
    return CompositeReward(terms, neural=neural, neural_weight=source.model_weight)


def judge_term(section: JudgeSection, dtype: str = "float32", trust_remote_code: bool = False,
               device: torch.device | str | None = None) -> tuple[JudgeReward, float]:
    """(the judge as a batched reward function, its weight): its own frozen copy of the model,
    on `device` (None: cuda when available), greedy on an `HFEngine`."""
    check_model_paths({"reward.judge.model": section.model})
    path = resolve_model_path(section.model, section.gguf_file)
    device = device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = load_tokenizer(path, padding_side="left")
    if not getattr(tokenizer, "chat_template", None):  # each request is one user turn in it (`engine_chat`)
        raise ConfigError(f"reward.judge.model '{section.model}' has no chat template: the judge must be a chat (instruct) model")
    model = load_causal_lm(path, dtype=section.dtype or dtype, trust_remote_code=trust_remote_code)
    model = model.eval().requires_grad_(False).to(device)  # frozen: generation only, never trained, never synced
    judge = JudgeReward(
        engine_chat(HFEngine(model, tokenizer), tokenizer, section.max_new_tokens), template=section.template_text(), mode=section.mode,
        min_score=section.min_score, max_score=section.max_score, failure_score=section.failure_score, batch_size=section.batch_size,
    )
    return judge, section.weight


def probe_user_functions(reward: RewardSource, accuracy_function: str | None, prompts: Sequence[str], eval_prompts: Sequence[str]) -> None:
    """Call each reward function and the accuracy function once, as the run will call them, on
    the first valid row of the data it will see (reward functions: `prompts` and `eval_prompts`;
    the accuracy function: the first `eval_prompts` row with a gt_answer), before any model
    loads, so that a function that cannot be called that way (a row field the data lacks, a
    parameter olingo never passes, a batched function taken for a single-row one) is a one-line
    `RewardError` in the first seconds of a run rather than a traceback at its first evaluation.
    The prompt is the row's text without the chat template (the turns' contents, one per line);
    training decodes the templated prompt. Unreadable data is left for the data loading to report."""
    functions = [_resolve(spec, "reward.functions") for spec in reward.functions]
    accuracy = _resolve(accuracy_function, "loop.accuracy_function") if accuracy_function else None
    for sources in (prompts, eval_prompts):
        row = next(_probe_rows(sources), None)
        for fn in functions if row is not None else ():
            probe(fn, "reward.functions", row)
    row = next((r for r in _probe_rows(eval_prompts) if r.gt_answer is not None), None)
    if accuracy is not None and row is not None:  # evaluation scores accuracy on rows with a gt_answer only
        probe(accuracy, "loop.accuracy_function", row)


def _resolve(spec: str, key: str) -> RewardFunction:
    """The function `spec` names, its form read from its signature; errors name `key`."""
    try:
        return reward_function(spec)
    except RewardError as err:
        raise RewardError(f"{err} (set in {key})") from err


def _probe_rows(sources: Sequence[str]) -> Iterator[ProbeRow]:
    """The valid prompt rows of `sources`, lazily, in order (invalid rows are skipped)."""
    for source in sources:
        try:
            for number, raw in iter_rows_or_errors(resolve_path(source)):
                if isinstance(raw, DataError):
                    continue
                try:
                    messages, answer = parse_prompt_row(raw, source, number)
                except DataError:
                    continue
                text = "\n".join(str(m.get("content") or "") for m in messages)
                yield ProbeRow(f"{source}, row {number}", text, answer, extra_fields(raw))
        except DataError:
            continue  # a source that cannot be read: loading the data says so, with its reason
