"""Where a run's reward comes from, shared by the RL recipes (`olingo ppo`, `olingo grpo`).

`RewardSource` is the part of a `reward:` section that names the reward: reward functions with
weights, a trained reward model, or both as weighted terms of one sum. `load_reward` builds it.
`probe_user_functions` calls every user function once on a real prompt row at start-up.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pydantic import Field

from olingo.config import StrictModel
from olingo.dataset.errors import DataError
from olingo.dataset.loading import iter_rows_or_errors
from olingo.dataset.prompts import extra_fields, parse_prompt_row
from olingo.models import RewardModel
from olingo.recipes.common import resolve_model_path, resolve_path
from olingo.rewards.functions import (
    CompositeReward,
    ProbeRow,
    RewardFunction,
    probe,
    reward_function,
)
from olingo.rewards.registry import RewardError, resolve_reward


class RewardSource(StrictModel):
    """Reward functions, a trained reward model, or both as weighted terms of one sum."""

    model: str | None = Field(None, description="reward-model directory (olingo rm output), scored at the last real token")
    model_weight: float = Field(1.0, ge=0, description="weight of the reward model's score when reward.functions are set too")
    functions: dict[str, float] = Field(
        default_factory=dict,
        description="reward functions with weights: registered names (arithmetic_exact, math_answer, exact_match, format_regex, "
        "length_penalty, ...) or package.module:function paths, e.g. {math_answer: 1.0, my_pkg.rewards:fmt: 0.5}; "
        "each term is logged as rollout/reward/<name>",
    )

    def check_present(self, environment: str | None) -> None:
        """Some reward must exist: this section's, or an environment's (`environment.name`)."""
        if self.model is None and not self.functions and environment is None:
            raise ValueError(
                "set reward.model (a reward-model directory), reward.functions ({name: weight}), or both "
                "(or name an environment: its rewards may be the only ones)"
            )
        for spec in self.functions:
            resolve_reward(spec)  # an unknown name or a path that does not import fails here, before any loading
        return self


def load_reward(source: RewardSource, tokenizer: Any, dtype: str = "float32", trust_remote_code: bool = False) -> RewardModel | CompositeReward:
    """The reward model alone, or the weighted sum of the reward functions (and the model)."""
    neural = None
    if source.model is not None:
        neural = RewardModel.from_pretrained(resolve_model_path(source.model), pad_token_id=tokenizer.pad_token_id, dtype=dtype,
                                             trust_remote_code=trust_remote_code)
        neural = neural.eval().requires_grad_(False)
    if not source.functions:  # no model either: an environment's rewards are the only ones
        return neural if neural is not None else CompositeReward((), allow_empty=True)
    return CompositeReward(source.functions, neural=neural, neural_weight=source.model_weight)


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
