"""The learn half of PPO: a policy learner and, when there is a critic, a critic learner.

`PolicyLearner` owns the actor (booster, optimizer, scheduler): clipped policy loss (Schulman
et al. 2017) plus the optional ptx LM loss. `CriticLearner` owns the critic: clipped value loss
times `vf_coef`. `PPOLearner` runs them together, minibatch by minibatch, and is shared by
`PPOTrainer` (one process makes and learns) and `olingo.ray`'s `DetachedPPOTrainer` (experience
from remote makers), so both train with exactly the same maths. A learner without a critic
builds, steps and checkpoints none. Each loss is scaled by 1 / (micro-batches of the optimizer
step) before backward. It implements `olingo.trainer.learner.Learner`.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from pydantic import Field, model_validator

from olingo.booster import Booster, OptimizerWrapper
from olingo.config import StrictModel
from olingo.experience_maker import Experience, action_values, lm_nll, policy_token_stats
from olingo.rl.masked import explained_variance, masked_mean
from olingo.rl.offpolicy import BehaviourSource, OffPolicyCorrection, OffPolicyMask, offpolicy_correction
from olingo.rl.policy_loss import PolicyLoss, ValueLoss
from olingo.trainer.learner import StepShare, TrainedModel
from olingo.trainer.offpolicy_fields import (
    behaviour_log_probs_field,
    check_offpolicy_fields,
    offpolicy_mask_field,
    offpolicy_mask_high_field,
    offpolicy_mask_low_field,
    offpolicy_settings,
    tis_cap_field,
)


class PPOLossConfig(StrictModel):
    """PPO's losses: the `loss:` section of `olingo ppo`."""

    eps_clip: float = Field(0.2, gt=0, description="policy ratio clip")
    value_clip: float = Field(0.2, gt=0, description="value clip around the rollout-time values")
    vf_coef: float = Field(1.0, ge=0, description="value-loss weight")
    ptx_coef: float = Field(0.0, ge=0, le=1, description="weight of the pretraining LM loss (needs data.pretrain); the policy loss gets 1 - ptx_coef")
    tis_cap: float | None = tis_cap_field()
    behaviour_log_probs: BehaviourSource = behaviour_log_probs_field()
    offpolicy_mask: OffPolicyMask = offpolicy_mask_field()
    offpolicy_mask_low: float | None = offpolicy_mask_low_field()
    offpolicy_mask_high: float | None = offpolicy_mask_high_field()

    @model_validator(mode="after")
    def _offpolicy(self) -> PPOLossConfig:
        check_offpolicy_fields(self)
        return self


class PolicyLearner(TrainedModel):
    """The actor: clipped policy loss, plus `ptx_coef` x the LM loss of a pretrain batch when
    one is given (`apply_loss_mask`: only its `loss_mask` tokens count, as in SFT); `packing`:
    the policy and ptx forwards run padding-free (`olingo.models.packing`, docs/packing.md);
    `offpolicy`: truncated importance sampling and masks (`olingo.rl.offpolicy`; None: off)."""

    name = "actor"

    def __init__(self, booster: Booster, actor: torch.nn.Module, optim: OptimizerWrapper, scheduler: Any, *,
                 eps_clip: float = 0.2, ptx_coef: float = 0.0, apply_loss_mask: bool = True, offpolicy: OffPolicyCorrection | None = None,
                 packing: bool = True) -> None:
        super().__init__(booster, actor, optim, scheduler)
        self.loss_fn = PolicyLoss(eps_clip)
        self.ptx_coef, self.apply_loss_mask, self.packing = ptx_coef, apply_loss_mask, packing
        self.offpolicy = offpolicy or OffPolicyCorrection()

    @property
    def tis_cap(self) -> float | None:
        return self.offpolicy.cap

    def losses(self, experience: Experience, temperature: float, ptx_batch: dict[str, Any] | None) -> tuple[torch.Tensor, bool, dict[str, torch.Tensor]]:
        """(actor loss, skip, detached stats) of one minibatch; `temperature` is the one the
        rollout sampled at, so the ratio compares the distributions the old log-probs came from."""
        mask, num_actions = experience.action_mask, experience.num_actions
        log_probs, entropy = policy_token_stats(
            self.model, experience.sequences, experience.attention_mask, num_actions, temperature, packing=self.packing, position_ids=experience.position_ids,
        )
        # pi_old of the ratio is the proximal policy; the weights correct for the behaviour policy (olingo.rl.offpolicy)
        old, weights, offpolicy_stats = offpolicy_correction(log_probs, experience.action_log_probs, experience.engine_log_probs, mask, self.offpolicy)
        policy_loss, skip, stats = self.loss_fn(log_probs, old, experience.advantages, mask, weights)
        loss, ptx_loss = policy_loss, torch.zeros((), device=self.booster.device)
        if ptx_batch is not None:
            ptx_loss = self.ptx_loss(ptx_batch)
            loss = (1 - self.ptx_coef) * policy_loss + self.ptx_coef * ptx_loss
        stats = {
            "policy_loss": policy_loss.detach(), "ptx_loss": ptx_loss.detach(),
            "clipfrac": stats["clipfrac"], "approx_kl": stats["approx_kl"], "ratio_max": stats["ratio_max"],
            "entropy": masked_mean(entropy, mask),
            **({"tis_weight_mean": stats["tis_weight_mean"]} if weights is not None else {}), **offpolicy_stats,
        }
        return loss, skip, stats

    def ptx_loss(self, batch: dict[str, Any]) -> torch.Tensor:
        """Next-token loss of the actor on a pretrain (SFT-format) batch."""
        batch = {k: v.to(self.booster.device) for k, v in batch.items() if isinstance(v, torch.Tensor)}
        mask = batch["loss_mask"] if self.apply_loss_mask and "loss_mask" in batch else batch["attention_mask"]
        total, count = lm_nll(self.model, batch["input_ids"], batch["attention_mask"], mask, packing=self.packing)
        return total / count.clamp(min=1)  # token mean, as GPTLMLoss


class CriticLearner(TrainedModel):
    """The critic: clipped value loss around the rollout-time values, times `vf_coef` (`packing`: its forward padding-free)."""

    name = "critic"

    def __init__(self, booster: Booster, critic: torch.nn.Module, optim: OptimizerWrapper, scheduler: Any, *,
                 value_clip: float = 0.2, vf_coef: float = 1.0, packing: bool = True) -> None:
        super().__init__(booster, critic, optim, scheduler)
        self.loss_fn, self.vf_coef, self.packing = ValueLoss(value_clip), vf_coef, packing

    def losses(self, experience: Experience) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(value loss x vf_coef, detached stats) of one minibatch; needs values and returns."""
        if experience.values is None or experience.returns is None:
            raise ValueError("the critic learner needs experience with values and returns (made with a critic)")
        mask = experience.action_mask
        values = action_values(
            self.model, experience.sequences, experience.attention_mask, experience.num_actions, packing=self.packing, position_ids=experience.position_ids,
        )
        value_loss, stats = self.loss_fn(values, experience.values, experience.returns, mask)
        return value_loss * self.vf_coef, {
            "value_loss": value_loss.detach(), "value_clipfrac": stats["value_clipfrac"],
            "explained_variance": explained_variance(values.detach(), experience.returns, mask),
        }


class PPOLearner:
    """A policy learner and, optionally, a critic learner, stepped together."""

    def __init__(self, policy: PolicyLearner, critic: CriticLearner | None = None) -> None:
        self.policy, self.critic_learner = policy, critic
        self.device = policy.booster.device

    @classmethod
    def build(cls, actor_booster: Booster, critic_booster: Booster | None, actor: torch.nn.Module, critic: torch.nn.Module | None,
              actor_optim: OptimizerWrapper, critic_optim: OptimizerWrapper | None, actor_scheduler: Any, critic_scheduler: Any,
              loss: PPOLossConfig | None = None, *, apply_loss_mask: bool = True, packing: bool = True) -> PPOLearner:
        """From the pieces `booster.boost` returned; `critic=None` builds no critic learner;
        `packing`: every learn forward padding-free (`model.packing`)."""
        loss = loss or PPOLossConfig()
        policy = PolicyLearner(
            actor_booster, actor, actor_optim, actor_scheduler,
            eps_clip=loss.eps_clip, ptx_coef=loss.ptx_coef, apply_loss_mask=apply_loss_mask, offpolicy=offpolicy_settings(loss), packing=packing,
        )
        if critic is None:
            return cls(policy)
        return cls(policy, CriticLearner(critic_booster, critic, critic_optim, critic_scheduler, value_clip=loss.value_clip, vf_coef=loss.vf_coef,
                                             packing=packing))

    # Names the trainers and checkpoints use.
    @property
    def actor(self) -> torch.nn.Module:
        return self.policy.model

    @property
    def critic(self) -> torch.nn.Module | None:
        return self.critic_learner.model if self.critic_learner is not None else None

    @property
    def ptx_coef(self) -> float:
        return self.policy.ptx_coef

    @property
    def packing(self) -> bool:
        return self.policy.packing

    @property
    def tis_cap(self) -> float | None:
        return self.policy.tis_cap

    @ptx_coef.setter
    def ptx_coef(self, value: float) -> None:
        self.policy.ptx_coef = value

    def _learners(self) -> list[TrainedModel]:
        return [self.policy] + ([self.critic_learner] if self.critic_learner is not None else [])

    def train(self) -> None:
        for learner in self._learners():
            learner.model.train()

    def eval(self) -> None:
        for learner in self._learners():
            learner.model.eval()

    def no_sync(self) -> ExitStack:
        """Skip the data-parallel gradient all-reduce of every trained model (accumulation micro-steps)."""
        stack = ExitStack()
        for learner in self._learners():
            stack.enter_context(learner.no_sync())
        return stack

    def step_share(self, micro_batches: list[Experience]) -> StepShare:
        """PPO's losses are means per micro-batch: each is 1 / micro-batches of the step."""
        return StepShare(len(micro_batches))

    def training_step(
        self, experience: Experience, share: StepShare, temperature: float = 1.0, ptx_batch: dict[str, torch.Tensor] | None = None
    ) -> dict[str, torch.Tensor]:
        """Policy (+ptx) and, with a critic, value losses of one micro-batch; backward x its share."""
        loss_scale = 1.0 / share.micro_batches
        actor_loss, skip, stats = self.policy.losses(experience, temperature, ptx_batch)
        skip = self.any_rank(skip)
        # A skipped minibatch still runs backward (times 0) so data-parallel ranks stay in step.
        self.policy.backward(actor_loss * (0.0 if skip else loss_scale))
        stats["skip_ratio"] = torch.tensor(float(skip), device=self.device)
        if self.critic_learner is not None:
            value_loss, value_stats = self.critic_learner.losses(experience)
            self.critic_learner.backward(value_loss * loss_scale)
            stats.update(value_stats)
        return stats

    def any_rank(self, flag: bool) -> bool:
        return bool(self.policy.booster.plugin.all_reduce_sum(torch.tensor(float(flag), device=self.device)) > 0)

    def optimizer_step(self, stats: list[dict[str, torch.Tensor]]) -> dict[str, float]:
        """Step every optimizer and scheduler; `train/*` metrics of the step: the mean over its
        micro-batches, averaged over ranks."""
        steps = [learner.step() for learner in self._learners()]
        names = list(stats[0])
        means = [torch.stack([s[n] for s in stats]).mean() for n in names]
        values = self.policy.booster.plugin.all_reduce_mean(torch.stack([m.float() for m in means])).tolist()
        metrics = {f"train/{n}": v for n, v in zip(names, values, strict=True)}
        for step in steps:
            metrics.update(step)
        return metrics

    def save(self, directory: Path) -> None:
        """actor/ (and critic/ with a critic): HF directories, optimizers and schedulers."""
        for learner in self._learners():
            learner.save(directory)

    def load(self, directory: Path) -> None:
        for learner in self._learners():
            learner.load(directory)
