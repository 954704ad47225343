"""Which log-probs of the sampled tokens the learner divides by: the trainer's or the engine's.

A rollout engine with its own copy of the weights (vLLM) reports log pi_engine of each token it
sampled. The trainer's forward on the same weights gives log pi_old, and the two differ by kernels
and precision (docs/engines.md, "The log-prob mismatch"), so training on one while sampling from the
other is quietly off-policy. Every such rollout therefore gets both, and the gap is logged:
    rollout/engine_logprob_abs_diff, rollout/engine_logprob_max_diff, rollout/engine_kl
`old_logprobs` (experience section) chooses what the ratio uses: `trainer` (the default, what
the policy being trained assigns) or `engine` (the behaviour policy itself). With `trainer`,
truncated importance sampling (`loss.tis_cap`) reweights each token by
min(pi_old / pi_engine, cap) to correct for the engine having sampled it.

An engine that samples with the trained module itself (`HFEngine`, `shares_weights`) has no
second copy: its log-probs, when it returns them, are the trainer's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import torch

from olingo.engines import Rollout
from olingo.rl.kl import engine_mismatch

OldLogProbsSource = Literal["trainer", "engine"]


@dataclass
class PolicyLogProbs:
    """Log-probs of a rollout's sampled tokens, (B, A) each, or None where not computed.

    trainer: log pi_old by the trainer's forward (or an engine sharing the trainer's weights).
    engine: as a separate engine reported them while sampling.
    info: the mismatch metrics (`engine_mismatch`), empty without a separate engine.
    """

    trainer: torch.Tensor | None
    engine: torch.Tensor | None = None
    info: dict[str, float] = field(default_factory=dict)

    def old(self, source: OldLogProbsSource) -> torch.Tensor | None:
        """What the ratio divides by under `old_logprobs: source`."""
        return self.engine if source == "engine" and self.engine is not None else self.trainer


def policy_log_probs(
    rollout: Rollout, engine_shares_weights: bool, score: Callable[[], torch.Tensor], wanted: bool,
) -> PolicyLogProbs:
    """The trainer's and the engine's log-probs of `rollout`'s tokens, and their gap.

    score: runs the trainer's forward, (B, A). wanted: the caller needs log pi_old. A separate
    engine always gets the trainer's forward too, because every rollout logs the mismatch.
    """
    if rollout.log_probs is None:
        return PolicyLogProbs(score() if wanted else None)
    reported = rollout.log_probs.to(rollout.sequences.device)  # an engine may answer on another device
    if engine_shares_weights:  # the trained module sampled: its own logits are the trainer's
        return PolicyLogProbs(reported)
    trainer = score()
    metrics = engine_mismatch(trainer.float(), reported.float(), rollout.action_mask.to(trainer.device))
    return PolicyLogProbs(trainer, reported, {k: float(v) for k, v in metrics.items()})
