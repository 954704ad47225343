"""Rollout engines: generation backends behind one interface (`RolloutEngine`).

    settings   `GenerationSettings` (how to sample) and `Rollout` (the shared sequence layout)
    base       the `RolloutEngine` protocol every backend implements
    hf         `HFEngine`: transformers `generate`, the default
"""

from olingo.engines.base import RolloutEngine, repeat_prompts
from olingo.engines.hf import HFEngine, generate_rollout
from olingo.engines.settings import (
    GenerationSettings,
    Rollout,
    action_mask_from_responses,
    concat_rollouts,
    rollout_from_responses,
)

__all__ = [
    "GenerationSettings",
    "HFEngine",
    "Rollout",
    "RolloutEngine",
    "action_mask_from_responses",
    "concat_rollouts",
    "generate_rollout",
    "repeat_prompts",
    "rollout_from_responses",
]
