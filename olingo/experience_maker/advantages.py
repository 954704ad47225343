"""Advantage estimation as a strategy: chosen by config, called after scoring.

An estimator turns one scored batch (`AdvantageInputs`) into per-token advantages and, when it
trains a critic, returns (the critic's targets). `gae` needs the critic's values; the
group-relative estimators of the GRPO family need none. The maths lives in
`olingo.rl`; an estimator only picks the inputs and the function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import torch

from olingo.experience_maker.config import ExperienceConfig
from olingo.rl.advantages import (
    compute_gae,
    dr_grpo_advantages,
    grpo_advantages,
    reinforce_pp_advantages,
    reward_to_go,
    rloo_advantages,
)
from olingo.rl.masked import AllReduceSum

GroupEstimator = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp"]


@dataclass
class AdvantageInputs:
    """What an estimator may use. rewards, action_mask: (B, A); score: (B,) the shaped sequence
    score; values: (B, A) V_old, or None without a critic; kl_rewards: (B, A) the KL-penalty
    part of `rewards` alone (-kl_coef * kl_t), or None when the KL is not in the reward."""

    rewards: torch.Tensor
    score: torch.Tensor
    action_mask: torch.Tensor
    values: torch.Tensor | None = None
    kl_rewards: torch.Tensor | None = None


class AdvantageEstimator(Protocol):
    needs_critic: bool

    def __call__(self, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(advantages (B, A), returns (B, A) or None)."""
        ...


@dataclass
class GAE:
    """Generalised advantage estimation (Schulman et al. 2016) over the per-token rewards."""

    gamma: float = 1.0
    lam: float = 0.95
    needs_critic: bool = True

    def __call__(self, inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor | None]:
        if inputs.values is None:
            raise ValueError("gae needs the critic's values")
        return compute_gae(inputs.rewards, inputs.values, inputs.action_mask, self.gamma, self.lam)


@dataclass
class GroupRelative:
    """A sequence advantage from each prompt's group of `num_generations` responses (grpo, dr_grpo,
    rloo; formulas in `olingo.rl`), given to every token of the response. With
    the KL penalty in the reward, each token also gets the penalty still to come (reward-to-go
    of `kl_rewards`, gamma 1), as OpenRLHF does for its group estimators."""

    kind: Literal["grpo", "dr_grpo", "rloo"]
    num_generations: int
    eps: float = 1e-6
    needs_critic: bool = False

    def __call__(self, inputs: AdvantageInputs) -> tuple[torch.Tensor, None]:
        score = inputs.score.float()
        if self.kind == "grpo":
            sequence = grpo_advantages(score, self.num_generations, self.eps)
        elif self.kind == "dr_grpo":
            sequence = dr_grpo_advantages(score, self.num_generations)
        else:
            sequence = rloo_advantages(score, self.num_generations)
        mask = inputs.action_mask.bool()
        advantages = sequence.unsqueeze(-1).expand(mask.shape)
        if inputs.kl_rewards is not None:
            advantages = advantages + reward_to_go(inputs.kl_rewards, mask)
        return torch.where(mask, advantages, torch.zeros_like(advantages)), None


@dataclass
class ReinforcePP:
    """REINFORCE++ (`reinforce_pp_advantages`): reward-to-go of the per-token rewards, minus the
    group mean score when `num_generations` is set (the baseline variant), whitened over the batch
    of every rank (`all_reduce_sum`) or this rank alone (None)."""

    num_generations: int | None
    all_reduce_sum: AllReduceSum | None = None
    needs_critic: bool = False

    def __call__(self, inputs: AdvantageInputs) -> tuple[torch.Tensor, None]:
        return reinforce_pp_advantages(inputs.rewards.float(), inputs.score.float(), inputs.action_mask, self.num_generations, self.all_reduce_sum), None


def build_group_estimator(
    kind: GroupEstimator, num_generations: int, *, eps: float = 1e-6, group_baseline: bool = True, all_reduce_sum: AllReduceSum | None = None,
) -> AdvantageEstimator:
    """The critic-free estimator `kind` names, for batches of whole groups of `num_generations`."""
    if kind == "reinforce_pp":
        return ReinforcePP(num_generations if group_baseline else None, all_reduce_sum)
    if kind in ("grpo", "dr_grpo", "rloo"):
        return GroupRelative(kind, num_generations, eps)
    raise ValueError(f"unknown group advantage estimator {kind!r}; choose grpo, dr_grpo, rloo or reinforce_pp")


def build_advantage_estimator(config: ExperienceConfig) -> AdvantageEstimator:
    """The estimator `config.advantage` names, with its parameters."""
    if config.advantage == "gae":
        return GAE(config.gamma, config.lam)
    raise ValueError(f"unknown advantage estimator {config.advantage!r}")
