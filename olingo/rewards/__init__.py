"""Reward programs: functions scored on text, by name or import path, and their weighted sum.

    registry.py   names -> functions: `register_reward`, `batched`, `resolve_reward`, the
                  built-in names (loaded on first use)
    functions.py  `RewardFunction` (a function's form and validated values), the start-up
                  `probe`, `CompositeReward` (weighted terms plus an optional neural one)
    verifiers.py  built-in verifiers: math_answer, exact_match, format_regex, length_penalty
    math_verify.py `math_verify`: answers checked by Hugging Face's Math-Verify (optional package)
    rlvr.py       `RLVRRewardModel`, the ColossalChat-compatible front

This package imports no task: the embedded arithmetic task's rewards live with the task.
"""

from olingo.rewards.functions import (
    CompositeReward,
    ProbeRow,
    RewardFunction,
    RewardScores,
    probe,
    reward_function,
)
from olingo.rewards.registry import (
    REWARD_FUNCTIONS,
    RewardError,
    batched,
    register_reward,
    registered_names,
    resolve_reward,
)

__all__ = [
    "REWARD_FUNCTIONS",
    "CompositeReward",
    "ProbeRow",
    "RewardError",
    "RewardFunction",
    "RewardScores",
    "batched",
    "probe",
    "register_reward",
    "registered_names",
    "resolve_reward",
    "reward_function",
]
