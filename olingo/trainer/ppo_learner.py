"""`PPOLearner`: the learn half of PPO (losses, backward, optimizer steps, their checkpoints).

Shared by `PPOTrainer` (one process makes and learns) and `olingo.ray`'s `DetachedPPOTrainer`
(experience comes from remote makers), so both train with exactly the same maths. Per minibatch:
    actor:  clipped policy loss (Schulman et al. 2017) (+ ptx LM loss on a pretrain batch)
    critic: clipped value loss * vf_coef
each scaled by `loss_scale` (1 / minibatches per optimizer step) before backward.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from olingo.booster import Booster, OptimizerWrapper
from olingo.experience_maker import Experience, action_values, policy_logits
from olingo.models.functional import (
    entropy_from_logits,
    explained_variance,
    log_probs_from_logits,
    masked_mean,
)
from olingo.models.loss import GPTLMLoss, PolicyLoss, ValueLoss
from olingo.trainer.checkpoint import load_trained, save_trained


class PPOLearner:
    """Owns the trained pieces: actor and critic, their boosters, optimizers and schedulers.

    `ptx_coef` mixes a pretraining LM loss into the actor loss when a ptx batch is given
    (`apply_loss_mask`: only the batch's `loss_mask` tokens count, as in SFT).
    """

    def __init__(
        self,
        actor_booster: Booster,
        critic_booster: Booster,
        actor: torch.nn.Module,
        critic: torch.nn.Module,
        actor_optim: OptimizerWrapper,
        critic_optim: OptimizerWrapper,
        actor_scheduler: Any,
        critic_scheduler: Any,
        *,
        eps_clip: float = 0.2,
        value_clip: float = 0.2,
        vf_coef: float = 1.0,
        ptx_coef: float = 0.0,
        apply_loss_mask: bool = True,
    ) -> None:
        for name, optim in (("actor_optim", actor_optim), ("critic_optim", critic_optim)):
            if not isinstance(optim, OptimizerWrapper):
                raise TypeError(f"{name}: pass the optimizer returned by booster.boost(...), not the raw torch optimizer")
        self.actor_booster, self.critic_booster = actor_booster, critic_booster
        self.actor, self.critic = actor, critic
        self.actor_optim, self.critic_optim = actor_optim, critic_optim
        self.actor_scheduler, self.critic_scheduler = actor_scheduler, critic_scheduler
        self.actor_loss_fn, self.critic_loss_fn, self.ptx_loss_fn = PolicyLoss(eps_clip), ValueLoss(value_clip), GPTLMLoss()
        self.vf_coef, self.ptx_coef = vf_coef, ptx_coef
        self.apply_loss_mask = apply_loss_mask
        self.device = actor_booster.device

    def no_sync(self) -> ExitStack:
        """Skip the data-parallel gradient all-reduce of both models (accumulation micro-steps)."""
        stack = ExitStack()
        stack.enter_context(self.actor_booster.no_sync(self.actor, self.actor_optim))
        stack.enter_context(self.critic_booster.no_sync(self.critic, self.critic_optim))
        return stack

    def training_step(
        self, experience: Experience, loss_scale: float, temperature: float = 1.0, ptx_batch: dict[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        """Policy (+ptx) and value losses of one minibatch, backward scaled by `loss_scale`.

        `temperature` must be the one the rollout sampled at, so the ratio compares the same
        distributions the behaviour log-probs came from.
        """
        mask, num_actions = experience.action_mask, experience.num_actions
        logits = policy_logits(self.actor, experience.sequences, experience.attention_mask, num_actions, temperature)
        log_probs = log_probs_from_logits(logits, experience.sequences[:, -num_actions:])
        policy_loss, skip, policy_stats = self.actor_loss_fn(log_probs, experience.action_log_probs, experience.advantages, mask)
        actor_loss, ptx_loss = policy_loss, torch.zeros((), device=self.device)
        if ptx_batch is not None:
            ptx_loss = self.ptx_loss(ptx_batch)
            actor_loss = (1 - self.ptx_coef) * policy_loss + self.ptx_coef * ptx_loss
        skip = self.any_rank(skip)
        # A skipped minibatch still runs backward (times 0) so data-parallel ranks stay in step.
        self.actor_booster.backward(actor_loss * (0.0 if skip else loss_scale), self.actor_optim)

        values = action_values(self.critic, experience.sequences, experience.attention_mask, num_actions)
        value_loss, value_stats = self.critic_loss_fn(values, experience.values, experience.returns, mask)
        self.critic_booster.backward(value_loss * self.vf_coef * loss_scale, self.critic_optim)
        return {
            "policy_loss": policy_loss.detach(),
            "value_loss": value_loss.detach(),
            "ptx_loss": ptx_loss.detach(),
            "clipfrac": policy_stats["clipfrac"],
            "approx_kl": policy_stats["approx_kl"],
            "entropy": masked_mean(entropy_from_logits(logits.detach()), mask),
            "explained_variance": explained_variance(values.detach(), experience.returns, mask),
            "ratio_max": policy_stats["ratio_max"],
            "skip_ratio": torch.tensor(float(skip), device=self.device),
            "value_clipfrac": value_stats["value_clipfrac"],
        }

    def ptx_loss(self, batch: dict[str, Any]) -> torch.Tensor:
        """Next-token loss of the actor on a pretrain (SFT-format) batch."""
        batch = {k: v.to(self.device) for k, v in batch.items() if isinstance(v, torch.Tensor)}
        logits = self.actor(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
        mask = batch["loss_mask"] if self.apply_loss_mask and "loss_mask" in batch else batch["attention_mask"]
        return self.ptx_loss_fn(logits, batch["input_ids"], mask)

    def any_rank(self, flag: bool) -> bool:
        return bool(self.actor_booster.plugin.all_reduce_sum(torch.tensor(float(flag), device=self.device)) > 0)

    def optimizer_step(self, stats: dict[str, torch.Tensor]) -> dict[str, float]:
        """Step both optimizers and schedulers; `train/*` metrics of the step averaged over ranks."""
        lrs = {"train/actor_lr": self.actor_optim.param_groups[0]["lr"], "train/critic_lr": self.critic_optim.param_groups[0]["lr"]}
        for optim, scheduler in ((self.actor_optim, self.actor_scheduler), (self.critic_optim, self.critic_scheduler)):
            optim.step()
            optim.zero_grad()
            if scheduler is not None:
                scheduler.step()
        names = list(stats)
        values = self.actor_booster.plugin.all_reduce_mean(torch.stack([stats[n].float() for n in names])).tolist()
        metrics = {f"train/{n}": v for n, v in zip(names, values, strict=True)}
        metrics.update(lrs)
        metrics["train/actor_grad_norm"] = self.actor_optim.grad_norm
        metrics["train/critic_grad_norm"] = self.critic_optim.grad_norm
        return metrics

    # ---- checkpoints: each piece to and from its own file ---------------------------------------
    def _trained(self) -> list[tuple[str, Booster, torch.nn.Module, OptimizerWrapper, Any]]:
        return [
            ("actor", self.actor_booster, self.actor, self.actor_optim, self.actor_scheduler),
            ("critic", self.critic_booster, self.critic, self.critic_optim, self.critic_scheduler),
        ]

    def save(self, directory: Path) -> None:
        """actor/, critic/ (HF directories), their optimizers (`save_trained`) and schedulers."""
        for name, booster, model, optim, scheduler in self._trained():
            save_trained(booster, directory, name, model, optim, f"{name}_optimizer")
            if scheduler is not None:
                booster.save_lr_scheduler(scheduler, directory / f"{name}_scheduler.pt")

    def load(self, directory: Path) -> None:
        """Each model, optimizer and scheduler from its own file: never the actor's into the critic."""
        for name, booster, model, optim, scheduler in self._trained():
            load_trained(booster, directory, name, model, optim, f"{name}_optimizer")
            if scheduler is not None:
                booster.load_lr_scheduler(scheduler, directory / f"{name}_scheduler.pt")
