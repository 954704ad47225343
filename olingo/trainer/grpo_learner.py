"""The learn half of the GRPO family: one policy, no critic.

`GRPOLearner` owns the actor (booster, optimizer, scheduler) and the `GroupPolicyLoss`. One
optimizer step, as the maths reads:
    1. count the step's loss units (tokens for token_mean, responses otherwise) over every
       micro-batch and every data-parallel rank (`step_share`)
    2. per micro-batch: the loss share = sum of its token losses / that count, times the world
       size (data parallelism averages gradients over ranks), plus the ptx LM loss when asked;
       backward
    3. clip, optimizer and scheduler step
So batch 8 x accumulation 1, batch 2 x accumulation 4 and 2 ranks x batch 4 give the gradient
of one batch of 8 (docs/algorithms.md, "The loss"). Shared by `GRPOTrainer` and Ray's
`DetachedGRPOTrainer` through `olingo.trainer.learner.learn_step`.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field, model_validator

from olingo.booster import Booster, OptimizerWrapper
from olingo.config import StrictModel
from olingo.engines import GenerationSettings
from olingo.experience_maker import Experience, lm_nll, policy_token_stats
from olingo.experience_maker.group import GroupExperienceConfig
from olingo.rl.kl import KLEstimator
from olingo.rl.masked import masked_mean
from olingo.rl.offpolicy import BehaviourSource, OffPolicyMask, offpolicy_correction
from olingo.rl.policy_loss import GroupPolicyLoss, LossAggregation, ObjectiveParams, PolicyObjective, loss_units
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

# Stats that are shares of the step's loss: summed over micro-batches and ranks, not averaged.
SUMMED_STATS = ("policy_loss", "kl_loss")


class GRPOLossConfig(StrictModel):
    """The policy loss of `olingo grpo`: its `loss:` section."""

    eps_low: float = Field(0.2, gt=0, lt=1, description="lower ratio clip: the ratio is kept above 1 - eps_low")
    eps_high: float = Field(0.2, gt=0, description="upper ratio clip: below 1 + eps_high (DAPO clip-higher: 0.28)")
    dual_clip: float | None = Field(
        None, gt=1,
        description="dual clip c: a token with negative advantage loses at most c x |A| (null: off; 3 in Ye et al. 2020)",
    )
    aggregation: LossAggregation = Field(
        "token_mean", description="token_mean: over every token of the step (DAPO); seq_mean_token_mean: per response, then over "
        "responses (GRPO); seq_mean_token_sum_norm: token sums / max_new_tokens, over responses (Dr. GRPO)",
    )
    ptx_coef: float = Field(0.0, ge=0, le=1, description="weight of the pretraining LM loss (needs data.pretrain); the policy loss gets 1 - ptx_coef")
    tis_cap: float | None = tis_cap_field()
    behaviour_log_probs: BehaviourSource = behaviour_log_probs_field()
    offpolicy_mask: OffPolicyMask = offpolicy_mask_field()
    offpolicy_mask_low: float | None = offpolicy_mask_low_field()
    offpolicy_mask_high: float | None = offpolicy_mask_high_field()
    objective: PolicyObjective = Field(
        "ppo_clip", description="ppo_clip: the token-ratio clipped surrogate (eps_low/eps_high/dual_clip); gspo / gspo_token: the "
        "sequence ratio clipped by seq_eps_*; cispo: clipped IS weight x A x log pi; sapo: soft sigmoid gate (docs/algorithms.md)",
    )
    seq_eps_low: float = Field(3e-4, gt=0, lt=1, description="gspo: the sequence ratio is kept above 1 - seq_eps_low (GSPO paper: 3e-4)")
    seq_eps_high: float = Field(4e-4, gt=0, description="gspo: the sequence ratio is kept below 1 + seq_eps_high (GSPO paper: 4e-4)")
    cispo_max_ratio: float = Field(5.0, gt=1, description="cispo: cap on the stop-gradient importance weight (ScaleRL and TRL: 5)")
    cispo_min_ratio: float = Field(0.0, ge=0, lt=1, description="cispo: floor on the importance weight (0: none, as in MiniMax-M1)")
    sapo_tau_pos: float = Field(1.0, gt=0, description="sapo: gate temperature of tokens with A > 0 (paper: 1.0)")
    sapo_tau_neg: float = Field(1.05, gt=0, description="sapo: gate temperature of tokens with A <= 0 (paper: 1.05)")

    @model_validator(mode="after")
    def _dual_clip_ppo_only(self) -> GRPOLossConfig:
        if self.dual_clip is not None and self.objective != "ppo_clip":
            raise ValueError(f"loss.dual_clip applies to loss.objective ppo_clip only, not {self.objective}")
        return self

    @model_validator(mode="after")
    def _offpolicy(self) -> GRPOLossConfig:
        check_offpolicy_fields(self)
        return self

    def objective_params(self) -> ObjectiveParams:
        """The settings of a non-default objective, for `GroupPolicyLoss`."""
        return ObjectiveParams(self.seq_eps_low, self.seq_eps_high, self.cispo_max_ratio, self.cispo_min_ratio, self.sapo_tau_pos, self.sapo_tau_neg)


class GRPOLearner(TrainedModel):
    """The actor and its critic-free policy loss (see the module docstring).

    Args beyond the boosted model: `loss` (`GRPOLossConfig`), `kl_coef` and `kl_estimator`
    of the KL term (used only when `kl_in_loss` and experience carries reference log-probs),
    `max_length` (the generation limit: Dr. GRPO's constant normaliser), `apply_loss_mask`
    (ptx rows: only their loss_mask tokens count), `packing` (the policy and ptx forwards run
    padding-free: `olingo.models.packing`, docs/packing.md; the same gradient up to rounding).
    The loss's off-policy fields (tis_cap, behaviour_log_probs, offpolicy_mask) become `offpolicy`,
    applied by `olingo.rl.offpolicy.offpolicy_correction` (docs/async.md).
    """

    name = "actor"

    def __init__(
        self, booster: Booster, actor: torch.nn.Module, optim: OptimizerWrapper, scheduler: Any, loss: GRPOLossConfig | None = None, *,
        kl_coef: float = 0.0, kl_estimator: KLEstimator = "k3", kl_in_loss: bool = True, max_length: int | None = None, apply_loss_mask: bool = True,
        packing: bool = True,
    ) -> None:
        super().__init__(booster, actor, optim, scheduler)
        self.loss = loss or GRPOLossConfig()
        self.loss_fn = GroupPolicyLoss(
            self.loss.eps_low, self.loss.eps_high, self.loss.dual_clip, self.loss.aggregation,
            kl_coef=kl_coef if kl_in_loss else 0.0, kl_estimator=kl_estimator, max_length=max_length,
            objective=self.loss.objective, params=self.loss.objective_params(),
        )
        self.apply_loss_mask, self.packing = apply_loss_mask, packing
        self.offpolicy = offpolicy_settings(self.loss)
        self.device = booster.device

    @classmethod
    def build(
        cls, booster: Booster, actor: torch.nn.Module, optim: OptimizerWrapper, scheduler: Any, loss: GRPOLossConfig, experience: GroupExperienceConfig,
        generation: GenerationSettings, *, apply_loss_mask: bool = True, packing: bool = True,
    ) -> GRPOLearner:
        """From the `loss:` section, the KL term of the `experience:` section (a loss term only with
        kl_penalty "loss") and the generation limit (Dr. GRPO's normaliser)."""
        return cls(
            booster, actor, optim, scheduler, loss, kl_coef=experience.kl_coef, kl_estimator=experience.estimator_name,
            kl_in_loss=experience.kl_penalty == "loss", max_length=generation.max_new_tokens, apply_loss_mask=apply_loss_mask,
            packing=packing,
        )

    @property
    def actor(self) -> torch.nn.Module:
        return self.model

    @property
    def tis_cap(self) -> float | None:
        return self.loss.tis_cap

    @property
    def ptx_coef(self) -> float:
        return self.loss.ptx_coef

    @ptx_coef.setter
    def ptx_coef(self, value: float) -> None:
        self.loss.ptx_coef = value

    def train(self) -> None:
        self.model.train()

    def eval(self) -> None:
        self.model.eval()

    def step_share(self, micro_batches: list[Experience]) -> StepShare:
        """Loss units of one optimizer step: its micro-batches on every rank (float32 scalar)."""
        units = sum(loss_units(mb.action_mask, self.loss.aggregation) for mb in micro_batches)
        return StepShare(len(micro_batches), self.booster.plugin.all_reduce_sum(torch.as_tensor(units, dtype=torch.float32, device=self.device)))

    def training_step(
        self, experience: Experience, share: StepShare, temperature: float = 1.0, ptx_batch: dict[str, Any] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Forward and backward of one micro-batch's share of the step; its detached stats.

        `share`: `step_share` of the step (its units normalise the policy loss; the ptx loss, a
        mean per micro-batch, is divided by its micro-batch count); `temperature`: the rollout's."""
        units, micro_batches = share.units, share.micro_batches
        if experience.advantages is None:
            raise ValueError("experience without advantages: pass it through the maker's finish() first")
        mask, num_actions = experience.action_mask, experience.num_actions
        log_probs, entropy = policy_token_stats(
            self.model, experience.sequences, experience.attention_mask, num_actions, temperature, packing=self.packing, position_ids=experience.position_ids,
        )
        # pi_old of the ratio is the proximal policy; the weights correct for the behaviour policy (olingo.rl.offpolicy)
        old, weights, offpolicy_stats = offpolicy_correction(log_probs, experience.action_log_probs, experience.engine_log_probs, mask, self.offpolicy)
        policy_loss, stats = self.loss_fn(log_probs, old, experience.advantages, mask, units, experience.base_action_log_probs, weights)
        stats.update(offpolicy_stats)
        world = self.booster.plugin.coordinator.world_size
        loss = policy_loss * world  # data parallelism averages gradients over ranks; the share is of the global step
        ptx_loss = torch.zeros((), device=self.device)
        if ptx_batch is not None:
            ptx_loss = self.ptx_loss(ptx_batch)
            loss = (1 - self.ptx_coef) * loss + self.ptx_coef * ptx_loss / micro_batches
        self.backward(loss)
        stats["ptx_loss"] = ptx_loss.detach()
        stats["entropy"] = masked_mean(entropy, mask)
        return stats

    def ptx_loss(self, batch: dict[str, Any]) -> torch.Tensor:
        """Next-token loss of the actor on a pretrain (SFT-format) batch."""
        batch = {k: v.to(self.device) for k, v in batch.items() if isinstance(v, torch.Tensor)}
        mask = batch["loss_mask"] if self.apply_loss_mask and "loss_mask" in batch else batch["attention_mask"]
        total, count = lm_nll(self.model, batch["input_ids"], batch["attention_mask"], mask, packing=self.packing)
        return total / count.clamp(min=1)  # token mean, as GPTLMLoss

    def optimizer_step(self, stats: list[dict[str, torch.Tensor]]) -> dict[str, float]:
        """Step optimizer and scheduler; `train/*` metrics of the step over its micro-batches and
        ranks: loss shares summed (the step's loss), everything else averaged."""
        step = self.step()
        names = list(stats[0])
        world = self.booster.plugin.coordinator.world_size
        local = torch.stack([
            torch.stack([s[n].float() for s in stats]).sum() * world if n in SUMMED_STATS else torch.stack([s[n].float() for s in stats]).mean()
            for n in names
        ])
        values = self.booster.plugin.all_reduce_mean(local).tolist()
        return {**{f"train/{n}": v for n, v in zip(names, values, strict=True)}, **step}
