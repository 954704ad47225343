"""What the online loop needs from an experience maker, and what one collect step returns.

An experience maker draws prompt rows, samples responses through its `RolloutSource`, scores
them and estimates advantages; PPO's (`PPOExperienceMaker`: critic values, GAE, KL in the
reward) and the GRPO family's (`GroupExperienceMaker`: groups, group advantages, dynamic
sampling) both implement `ExperienceMaker`, so `OnlineTrainer` runs either without knowing which.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from olingo.engines import GenerationSettings, RolloutEngine
from olingo.experience_maker.experience import Experience
from olingo.experience_maker.scoring import ScoredRollout
from olingo.rollout import PromptBatch, RolloutSource


@dataclass
class CollectedBatch:
    """One collect step's result."""

    experience: Experience
    """Scored rollouts with their advantages: ready for the buffer."""
    info: dict[str, float]
    """`rollout/*` diagnostics of what was sampled for it (dropped groups included)."""
    tokens: float
    """Response tokens generated for it (dropped groups included), for tokens per second."""


class SourceBacked:
    """What both experience makers read the same way from their source, sampling settings and
    config (`source`, `generation`, `config` are set by the maker)."""

    source: RolloutSource
    generation: GenerationSettings
    config: Any

    @property
    def engine(self) -> RolloutEngine:
        return self.source.engine

    @property
    def temperature(self) -> float:
        return self.generation.log_prob_temperature

    @property
    def old_logprobs(self) -> str:
        return self.config.old_logprobs


class ExperienceMaker(Protocol):
    """The experience half of online RL (see the module docstring)."""

    source: RolloutSource
    num_generations: int  # responses per prompt (G; 1 for PPO)
    generation: GenerationSettings
    carry_engine_log_probs: bool  # keep the engine's log-probs for truncated importance sampling
    last_samples: list[dict[str, Any]]  # texts of the last batch, for the sample logs
    packing: bool  # forwards over rollouts run padding-free (olingo.models.packing)

    @property
    def engine(self) -> RolloutEngine: ...
    @property
    def temperature(self) -> float: ...
    @property
    def old_logprobs(self) -> str: ...

    def plan(self, pi_old_needed: bool) -> None:
        """Told once per fit whether a learner step may see a policy other than the sampling one."""

    def collect(self, next_prompts: Callable[[], PromptBatch], policy_version: int) -> CollectedBatch: ...

    def rollout_and_score(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, gt_answers: list[str | None] | None = None,
        generation: GenerationSettings | None = None, row_fields: dict[str, list[Any]] | None = None, *, messages: list | None = None,
    ) -> ScoredRollout: ...

    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
