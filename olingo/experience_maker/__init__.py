"""Experience making: rollouts (through an engine), scoring, KL penalty, advantages.

See `naive.py` for the steps; `config.py` for the maker's typed settings; `advantages.py` for the
advantage-estimator strategy. `GenerationSettings`, `Rollout` and `generate_rollout` live in
`olingo.engines` and are re-exported here, where earlier code imported them from.
"""

from olingo.engines import GenerationSettings, Rollout, generate_rollout
from olingo.experience_maker.advantages import (
    GAE,
    AdvantageEstimator,
    AdvantageInputs,
    build_advantage_estimator,
)
from olingo.experience_maker.config import ExperienceConfig, RewardShaping
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

__all__ = [
    "GAE",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "AdvantageInputs",
    "BufferItem",
    "Experience",
    "ExperienceConfig",
    "FixedKLController",
    "GenerationSettings",
    "NaiveExperienceMaker",
    "RewardShaping",
    "Rollout",
    "ScoredRollout",
    "action_log_probs",
    "action_values",
    "build_advantage_estimator",
    "generate_rollout",
    "make_experience_batch",
    "policy_logits",
    "split_experience_batch",
]
