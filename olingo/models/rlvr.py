"""Verifiable rewards: `RLVRRewardModel` sums reward functions over decoded text.

A reward function is any callable `(prompt: str, response: str, gt_answer: str | None) -> float`.
`response` is the decoded response without special tokens (the stop token is not part of it);
whether the response stopped at all is the experience maker's business (truncation penalty).
Built-in functions for the embedded arithmetic task are registered by name, so configs can say
`reward.functions: {arithmetic_exact: 1.0, arithmetic_format: 0.1}`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

import torch

from olingo.config_errors import did_you_mean
from olingo.tasks.arithmetic import is_correct

RewardFn = Callable[[str, str, "str | None"], float]
_CANONICAL_INTEGER = re.compile(r"0|[1-9][0-9]*")


def arithmetic_exact(prompt: str, response: str, gt_answer: str | None) -> float:
    """1.0 when the first integer of the response equals the ground truth, else 0.0."""
    if gt_answer is None:
        raise ValueError(f"arithmetic_exact needs a gt_answer for prompt {prompt!r}; add a 'gt_answer' field to the prompt data")
    return 1.0 if is_correct(response, gt_answer) else 0.0


def arithmetic_format(prompt: str, response: str, gt_answer: str | None) -> float:
    """1.0 when the response is one canonical non-negative integer and nothing else, else 0.0."""
    return 1.0 if _CANONICAL_INTEGER.fullmatch(response) else 0.0


REWARD_FUNCTIONS: dict[str, RewardFn] = {
    "arithmetic_exact": arithmetic_exact,
    "arithmetic_format": arithmetic_format,
}


def get_reward_function(name: str) -> RewardFn:
    """A built-in reward function by name; unknown names list the choices."""
    if name not in REWARD_FUNCTIONS:
        raise ValueError(f"unknown reward function '{name}'{did_you_mean(name, REWARD_FUNCTIONS)}; built-ins: {', '.join(sorted(REWARD_FUNCTIONS))}")
    return REWARD_FUNCTIONS[name]


class RLVRRewardModel:
    """Weighted sum of reward functions, scored on text.

    Args:
        reward_fn_list: callables or built-in names (ColossalChat's argument name).
        weights: one weight per function (default 1.0 each).
    """

    def __init__(self, reward_fn_list: Sequence[RewardFn | str], weights: Sequence[float] | None = None) -> None:
        if not reward_fn_list:
            raise ValueError("RLVRRewardModel needs at least one reward function")
        fns = [get_reward_function(fn) if isinstance(fn, str) else fn for fn in reward_fn_list]
        if weights is not None and len(weights) != len(fns):
            raise ValueError(f"got {len(weights)} weights for {len(fns)} reward functions")
        self.reward_fns = fns
        self.weights = list(weights) if weights is not None else [1.0] * len(fns)

    @classmethod
    def from_weights(cls, functions: Mapping[str, float]) -> RLVRRewardModel:
        """From `{name: weight}` (the config's form)."""
        return cls(list(functions), list(functions.values()))

    def score_texts(self, prompts: Sequence[str], responses: Sequence[str], gt_answers: Sequence[str | None]) -> torch.Tensor:
        """(B,) float32 rewards: sum_k w_k * fn_k(prompt, response, gt_answer)."""
        scores = [
            sum(w * float(fn(p, r, g)) for fn, w in zip(self.reward_fns, self.weights, strict=True))
            for p, r, g in zip(prompts, responses, gt_answers, strict=True)
        ]
        return torch.tensor(scores, dtype=torch.float32)

    # Both reward kinds are moved around by the trainer (offloading); text rewards have no weights.
    def to(self, *args, **kwargs) -> RLVRRewardModel:
        return self

    def eval(self) -> RLVRRewardModel:
        return self
