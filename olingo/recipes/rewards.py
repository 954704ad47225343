"""Where a run's reward comes from, shared by the RL recipes (`olingo ppo`, `olingo grpo`).

`RewardSource` is the part of a `reward:` section that names the reward: reward functions with
weights, a trained reward model, or both as weighted terms of one sum. `load_reward` builds it.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from olingo.config import StrictModel
from olingo.models import RewardModel
from olingo.models.rewards import CompositeReward, resolve_reward
from olingo.recipes.common import resolve_model_path


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

    @model_validator(mode="after")
    def _a_source(self) -> RewardSource:
        if self.model is None and not self.functions:
            raise ValueError("set reward.model (a reward-model directory), reward.functions ({name: weight}), or both")
        for spec in self.functions:
            resolve_reward(spec)  # an unknown name or a path that does not import fails here, before any loading
        return self


def load_reward(source: RewardSource, tokenizer: Any, dtype: str = "float32", trust_remote_code: bool = False) -> RewardModel | CompositeReward:
    """The reward model alone, or the weighted sum of the reward functions (and the model)."""
    neural = None
    if source.model is not None:
        neural = RewardModel.from_pretrained(resolve_model_path(source.model), pad_token_id=tokenizer.pad_token_id, dtype=dtype, trust_remote_code=trust_remote_code)
        neural = neural.eval().requires_grad_(False)
    if not source.functions:
        return neural
    return CompositeReward(source.functions, neural=neural, neural_weight=source.model_weight)
