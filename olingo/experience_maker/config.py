"""The experience maker's own typed settings: one section of a run config, handed to the maker alone.

`ExperienceConfig` is the `experience:` section of `olingo ppo` (KL penalty, advantage estimator,
whitening, shortcuts); `RewardShaping` is what the maker does to a sequence score before it
becomes a reward (the `reward:` section adds where the score comes from).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from olingo.config import StrictModel
from olingo.experience_maker.engine_logprobs import OldLogProbsSource


class ExperienceConfig(StrictModel):
    """How rollouts become experience: KL penalty, advantages, and two shortcuts."""

    kl_coef: float = Field(0.1, ge=0, description="KL penalty coefficient (initial value when adaptive)")
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k1", description="per-token KL estimate in the reward")
    kl_target: float | None = Field(None, gt=0, description="adaptive KL: target per-sequence KL (null: fixed kl_coef)")
    kl_horizon: int = Field(10000, ge=1, description="adaptive KL horizon in rollouts")
    advantage: Literal["gae"] = Field("gae", description="advantage estimator: gae (generalised advantage estimation; needs a critic)")
    gamma: float = Field(1.0, ge=0, le=1, description="GAE discount")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda")
    whiten_advantages: bool = Field(True, description="normalise advantages per experience batch")
    global_whitening: bool = Field(
        False,
        description="whiten with the statistics of every data-parallel rank's batch together (as one process would), not per rank",
    )
    old_logprobs: OldLogProbsSource = Field(
        "trainer",
        description="log pi_old in the PPO ratio: the trainer's forward (trainer) "
        "or, with a separate engine (vllm), the log-probs it sampled with (engine; see docs/engines.md)",
    )
    reuse_rollout_log_probs: bool = Field(
        False,
        description="take pi_old log-probs from the logits generate computes (the hf engine, one B x vocab step held at a time) "
        "instead of a second actor forward: faster, equal up to float rounding (KV cache vs full forward: ~1e-6 in fp32, more in bf16)",
    )
    skip_reference_when_kl_zero: bool = Field(False, description="with a fixed kl_coef of 0, skip the reference model's forward (the logged KL then reads 0)")


class RewardShaping(StrictModel):
    """What happens to a sequence score before it is a reward."""

    clip: float | None = Field(5.0, gt=0, description="clip the sequence score to [-clip, clip] (null: no clipping)")
    normalize: bool = Field(False, description="normalise scores with a running mean and std")
    placement: Literal["last", "every"] = Field("last", description="add the score at the last response token, or to every token")
    truncation_penalty: float = Field(0.0, ge=0, description="subtracted from the score of responses cut off at max_new_tokens")
