"""Experience making: rollouts (through an engine), scoring, KL penalty, advantages.

See `ppo.py` for the steps of PPO's maker (`NaiveExperienceMaker` is its ColossalChat name),
`group.py` for the GRPO family's, `scoring.py` for what both share; `config.py` for the maker's
typed settings; `advantages.py` for the advantage-estimator strategy. `GenerationSettings`,
`Rollout` and `generate_rollout` live in `olingo.engines` and are re-exported here, where
earlier code imported them from.
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
from olingo.experience_maker.ppo import PPOExperienceMaker
from olingo.experience_maker.scoring import (
    ScoredRollout,
    action_log_probs,
    action_values,
    chunked_head,
    head_log_probs,
    lm_nll,
    policy_logits,
    policy_token_stats,
)

NaiveExperienceMaker = PPOExperienceMaker  # ColossalChat's name for PPO's maker

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
    "PPOExperienceMaker",
    "RewardShaping",
    "Rollout",
    "ScoredRollout",
    "action_log_probs",
    "action_values",
    "build_advantage_estimator",
    "chunked_head",
    "generate_rollout",
    "head_log_probs",
    "lm_nll",
    "make_experience_batch",
    "policy_logits",
    "policy_token_stats",
    "split_experience_batch",
]
