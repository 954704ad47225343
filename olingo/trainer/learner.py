"""What every learner shares: one trained model with its booster, optimizer and scheduler.

`TrainedModel` steps, checkpoints and (for data parallelism) suspends gradient sync for one
model; the PPO and GRPO learners are built from it. `tis_weights` is the truncated importance
sampling both policy losses apply to a separate engine's rollouts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from olingo.booster import Booster, OptimizerWrapper
from olingo.experience_maker import Experience
from olingo.rl.kl import truncated_is_weights
from olingo.trainer.checkpoint import load_trained, save_trained


def check_boosted(name: str, optim: Any) -> None:
    if not isinstance(optim, OptimizerWrapper):
        raise TypeError(f"{name}: pass the optimizer returned by booster.boost(...), not the raw torch optimizer")


def tis_weights(experience: Experience, log_probs: torch.Tensor, cap: float | None) -> torch.Tensor | None:
    """Truncated importance weights (B, A) of a minibatch, or None when off or the batch carries
    no engine log-probs. pi_old is the rollout-time trainer forward when the batch has one; else
    the batch is learnt in one optimizer step and the current policy is pi_old."""
    if cap is None or experience.engine_log_probs is None:
        return None
    old = experience.action_log_probs if experience.action_log_probs is not None else log_probs
    return truncated_is_weights(old, experience.engine_log_probs, cap, experience.action_mask)


class TrainedModel:
    """One trained model with its booster, optimizer and scheduler, saved under `name`."""

    name: str

    def __init__(self, booster: Booster, model: torch.nn.Module, optim: OptimizerWrapper, scheduler: Any) -> None:
        check_boosted(f"{self.name}_optim", optim)
        self.booster, self.model, self.optim, self.scheduler = booster, model, optim, scheduler

    def backward(self, loss: torch.Tensor) -> None:
        self.booster.backward(loss, self.optim)

    def step(self) -> dict[str, float]:
        """Optimizer and scheduler step; the learning rate used and the gradient norm."""
        lr = self.optim.param_groups[0]["lr"]
        self.optim.step()
        self.optim.zero_grad()
        if self.scheduler is not None:
            self.scheduler.step()
        return {f"train/{self.name}_lr": lr, f"train/{self.name}_grad_norm": self.optim.grad_norm}

    def no_sync(self) -> Any:
        return self.booster.no_sync(self.model, self.optim)

    def save(self, directory: Path) -> None:
        """`<name>/` (HF directory), its optimizer (`save_trained`) and scheduler."""
        save_trained(self.booster, directory, self.name, self.model, self.optim, f"{self.name}_optimizer")
        if self.scheduler is not None:
            self.booster.save_lr_scheduler(self.scheduler, directory / f"{self.name}_scheduler.pt")

    def load(self, directory: Path) -> None:
        """Each piece from its own file: never another model's into this one."""
        load_trained(self.booster, directory, self.name, self.model, self.optim, f"{self.name}_optimizer")
        if self.scheduler is not None:
            self.booster.load_lr_scheduler(self.scheduler, directory / f"{self.name}_scheduler.pt")
