"""Experience making: rollouts, scoring, KL penalty, advantages. See `naive.py` for the steps."""

from olingo.experience_maker.experience import (
    BufferItem,
    Experience,
    make_experience_batch,
    split_experience_batch,
)
from olingo.experience_maker.kl_controller import AdaptiveKLController, FixedKLController
from olingo.experience_maker.naive import (
    NaiveExperienceMaker,
    ScoredRollout,
    action_log_probs,
    action_values,
    policy_logits,
)
from olingo.experience_maker.rollout import GenerationSettings, Rollout, generate_rollout

__all__ = [
    "AdaptiveKLController",
    "BufferItem",
    "Experience",
    "FixedKLController",
    "GenerationSettings",
    "NaiveExperienceMaker",
    "Rollout",
    "ScoredRollout",
    "action_log_probs",
    "action_values",
    "generate_rollout",
    "make_experience_batch",
    "policy_logits",
    "split_experience_batch",
]
