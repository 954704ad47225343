"""Advantage estimation as a strategy: chosen by config, called after scoring.

An estimator turns one scored batch (`AdvantageInputs`) into per-token advantages and, when it
trains a critic, returns (the critic's targets). `gae` needs the critic's values; the
group-relative estimators of the GRPO family need none. The maths lives in
`olingo.models.functional`; an estimator only picks the inputs and the function.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from olingo.experience_maker.config import ExperienceConfig
from olingo.models.functional import compute_gae


@dataclass
class AdvantageInputs:
    """What an estimator may use. rewards, action_mask: (B, A); score: (B,) the shaped sequence
    score; values: (B, A) V_old, or None without a critic."""

    rewards: torch.Tensor
    score: torch.Tensor
    action_mask: torch.Tensor
    values: torch.Tensor | None = None


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


def build_advantage_estimator(config: ExperienceConfig) -> AdvantageEstimator:
    """The estimator `config.advantage` names, with its parameters."""
    if config.advantage == "gae":
        return GAE(config.gamma, config.lam)
    raise ValueError(f"unknown advantage estimator {config.advantage!r}")
