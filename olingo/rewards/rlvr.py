"""Verifiable rewards as `RLVRRewardModel(reward_fn_list, weights)`.

ColossalChat-compatible signature: see docs/coming-from-colossalchat.md.

A thin front of `olingo.rewards.functions` (one code path): functions are names, import paths
('package.module:function') or callables, in either form that module describes (single-row
`(prompt, response, gt_answer) -> float` or batched). Built-ins, such as the embedded
arithmetic task's, are known by name, so configs can say
`reward.functions: {arithmetic_exact: 1.0, arithmetic_format: 0.1}`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from olingo.rewards.functions import CompositeReward, RewardFn
from olingo.rewards.registry import REWARD_FUNCTIONS, resolve_reward

__all__ = [
    "REWARD_FUNCTIONS",
    "RLVRRewardModel",
    "RewardFn",
    "get_reward_function",
]


def get_reward_function(name: str) -> Callable[..., Any]:
    """The reward function a name or an import path names; unknown names get a did-you-mean
    (`RewardError`, a ValueError)."""
    return resolve_reward(name)


class RLVRRewardModel(CompositeReward):
    """Weighted sum of reward functions, scored on text.

    Args:
        reward_fn_list: callables, names or import paths.
        weights: one weight per function (default 1.0 each).
    """

    def __init__(self, reward_fn_list: Sequence[RewardFn | Callable[..., Any] | str], weights: Sequence[float] | None = None) -> None:
        if not reward_fn_list:
            raise ValueError("RLVRRewardModel needs at least one reward function")
        if weights is not None and len(weights) != len(reward_fn_list):
            raise ValueError(f"got {len(weights)} weights for {len(reward_fn_list)} reward functions")
        self.weights = list(weights) if weights is not None else [1.0] * len(reward_fn_list)
        super().__init__(list(zip(reward_fn_list, self.weights, strict=True)))
        self.reward_fns = [f.fn for f in self.functions]

    @classmethod
    def from_weights(cls, functions: Mapping[str, float]) -> RLVRRewardModel:
        """From `{spec: weight}` (the config's form)."""
        return cls(list(functions), list(functions.values()))

    def score_texts(
        self, prompts: Sequence[str], responses: Sequence[str], gt_answers: Sequence[str | None],
        row_fields: Mapping[str, Sequence[Any]] | None = None,
    ) -> torch.Tensor:
        """(B,) float32 rewards: sum_k w_k * fn_k(...); `score` gives each term as well."""
        return self.score(prompts, responses, gt_answers, row_fields).total
