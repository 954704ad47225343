"""Loss functions. Each documents its shapes and the paper it comes from.

Pairwise reward-model losses follow the Bradley-Terry model of preferences used by
InstructGPT (Ouyang et al., 2022, eq. 1): P(chosen > rejected) = sigmoid(r_c - r_r).
The PPO actor and critic losses follow Schulman et al. 2017, "Proximal Policy Optimization
Algorithms"; the critic-free policy loss of the GRPO family (`GroupPolicyLoss`) adds DAPO's
clip-higher, the dual clip, a KL-to-reference term and three ways to aggregate token losses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from olingo.models.functional import (
    KLEstimator,
    LossAggregation,
    aggregate_loss,
    clipped_surrogate,
    kl_estimate,
    masked_mean,
    masked_sum,
)


class LogSigLoss(nn.Module):
    """-mean(log sigmoid(beta * (r_c - r_r))): the Bradley-Terry negative log-likelihood.

    chosen_reward, reject_reward: (B,). Returns a scalar. `beta` is the inverse temperature of
    the preference model (1.0 = the plain InstructGPT loss). `F.logsigmoid` is stable for large
    margins of either sign.
    """

    def __init__(self, beta: float = 1.0) -> None:
        super().__init__()
        self.beta = beta

    def forward(self, chosen_reward: torch.Tensor, reject_reward: torch.Tensor) -> torch.Tensor:
        return -F.logsigmoid(self.beta * (chosen_reward - reject_reward)).mean()


class LogExpLoss(nn.Module):
    """mean(log(1 + exp(beta * (r_r - r_c)))), computed as softplus so it never overflows.

    Mathematically equal to LogSigLoss; kept as its own class because ColossalChat exposes both
    and configs name them. chosen_reward, reject_reward: (B,). Returns a scalar.
    """

    def __init__(self, beta: float = 1.0) -> None:
        super().__init__()
        self.beta = beta

    def forward(self, chosen_reward: torch.Tensor, reject_reward: torch.Tensor) -> torch.Tensor:
        return F.softplus(self.beta * (reject_reward - chosen_reward)).mean()


def token_nll(logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token negative log-likelihood over masked positions, and their count.

    logits: (B, L, V) from a causal LM; input_ids, loss_mask: (B, L). Position t predicts token
    t+1, so the loss covers tokens 1..L-1 whose mask is 1. Returning the sum and the count (not
    the mean) lets a trainer normalise by the tokens of a whole optimizer step, so accumulation
    and data parallelism give the same gradient as one big batch.

    Both are float32 whatever the logits' dtype: a bf16 count is wrong above 256 tokens
    (887 would read 888). The NLL is summed with a select, never a product with the mask.
    """
    targets = input_ids[:, 1:]
    mask = loss_mask[:, 1:].bool()
    nll = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(), reduction="none")
    return masked_sum(nll.view(mask.shape), mask), mask.sum().to(torch.float32)


class GPTLMLoss(nn.Module):
    """Token-mean causal LM loss over masked positions (SFT and PPO's ptx term).

    logits: (B, L, V); input_ids, loss_mask: (B, L) (loss_mask defaults to all ones).
    """

    def forward(self, logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor | None = None) -> torch.Tensor:
        if loss_mask is None:
            loss_mask = torch.ones_like(input_ids)
        total, count = token_nll(logits, input_ids, loss_mask)
        return total / count.clamp(min=1)


class PolicyLoss(nn.Module):
    """PPO's clipped surrogate objective, negated (Schulman et al. 2017, eq. 7).

    log_probs, old_log_probs, advantages, action_mask: (B, A). ratio = exp(logp - logp_old);
    loss_t = -min(ratio A_t, clip(ratio, 1 - eps, 1 + eps) A_t), averaged over each sequence's
    masked tokens, then over the B sequences (so every sequence weighs the same, however long).
    `tis_weights` (B, A) or None: truncated importance weights pi_old / pi_engine of a rollout
    engine other than the trainer (`truncated_is_weights`), multiplying each token's loss.
    Returns (loss, skip, stats). `skip` is True when the mean ratio over masked tokens exceeds
    `skip_threshold`: the policy has diverged from the one that sampled, and ColossalChat skips
    that update. stats (detached scalars): clipfrac, approx_kl (k3 estimate of KL(old || new)),
    ratio_max, ratio_mean.
    """

    def __init__(self, clip_eps: float = 0.2, skip_threshold: float = 20.0) -> None:
        super().__init__()
        self.clip_eps = clip_eps
        self.skip_threshold = skip_threshold

    def forward(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        action_mask: torch.Tensor,
        tis_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, bool, dict[str, torch.Tensor]]:
        mask = action_mask.bool()
        # Zero the log-ratio of padding before exp: garbage there could overflow to inf, and
        # inf * 0 would put NaN into the gradient even though the loss masks it out.
        log_ratio = torch.where(mask, log_probs - old_log_probs, torch.zeros_like(log_probs))
        ratio = log_ratio.exp()
        advantages = torch.where(mask, advantages, torch.zeros_like(advantages))
        clipped = ratio.clamp(1 - self.clip_eps, 1 + self.clip_eps)
        token_loss = -torch.min(ratio * advantages, clipped * advantages)
        if tis_weights is not None:  # the engine sampled, not pi_old: reweight (truncated IS)
            token_loss = token_loss * tis_weights
        loss = masked_mean(token_loss, mask, dim=-1).mean()
        with torch.no_grad():
            ratio_mean = masked_mean(ratio, mask)
            stats = {
                "clipfrac": masked_mean(((ratio - 1).abs() > self.clip_eps).to(ratio.dtype), mask),
                "approx_kl": masked_mean((ratio - 1) - log_ratio, mask),
                # ratio > 0, so 0 at padding never wins the max unless the mask is empty.
                "ratio_max": torch.where(mask, ratio, torch.zeros_like(ratio)).max(),
                "ratio_mean": ratio_mean,
            }
            if tis_weights is not None:
                stats["tis_weight_mean"] = masked_mean(tis_weights, mask)
        return loss, bool(ratio_mean > self.skip_threshold), stats


class ValueLoss(nn.Module):
    """PPO's clipped value loss (Schulman et al. 2017, as implemented in OpenAI baselines ppo2).

    values, old_values, returns, action_mask: (B, A). v_clip = old + clip(v - old, -eps, eps);
    loss_t = max((v_clip - R)^2, (v - R)^2), or (v - R)^2 when clip_eps is None or 0. Loss =
    0.5 * (mean over each sequence's masked tokens, then over the batch). Returns (loss, stats);
    stats["value_clipfrac"] is the share of masked tokens where the clipped term is strictly
    larger (0 without clipping).
    """

    def __init__(self, clip_eps: float | None = 0.2) -> None:
        super().__init__()
        self.clip_eps = clip_eps

    def forward(
        self,
        values: torch.Tensor,
        old_values: torch.Tensor,
        returns: torch.Tensor,
        action_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        token_loss = (values - returns) ** 2
        clipfrac = torch.zeros((), dtype=values.dtype, device=values.device)
        if self.clip_eps:
            # The max keeps the critic from moving far from the values that made the advantages,
            # unless the move is towards the return.
            v_clip = old_values + (values - old_values).clamp(-self.clip_eps, self.clip_eps)
            clipped_loss = (v_clip - returns) ** 2
            with torch.no_grad():
                clipfrac = masked_mean((clipped_loss > token_loss).to(values.dtype), action_mask)
            token_loss = torch.max(clipped_loss, token_loss)
        loss = 0.5 * masked_mean(token_loss, action_mask, dim=-1).mean()
        return loss, {"value_clipfrac": clipfrac}


class GroupPolicyLoss(nn.Module):
    """The policy loss of GRPO, Dr. GRPO, DAPO, RLOO and REINFORCE++ (REFERENCE.md D1).

    log_probs, advantages, action_mask: (B, A); old_log_probs, ref_log_probs: (B, A) or None.
    Per token: the clipped surrogate with bounds [1 - eps_low, 1 + eps_high] and the optional
    dual clip (`clipped_surrogate`), plus `kl_coef` x the KL estimate to the reference (GRPO's
    k3 term, Shao et al. 2024 eq. 3) when `ref_log_probs` is given. Both are aggregated with
    `aggregate_loss(mode, units)`, `units` counting the whole optimizer step, so the returned
    loss is this micro-batch's share of the step's loss. `old_log_probs=None` means pi_old is
    the current policy (one update per batch): the ratio is exactly 1 and the gradient is that
    of log pi. Returns (loss, stats); stats are detached: policy_loss and kl_loss (shares, to be
    summed over the step), clipfrac, clipfrac_low/high (ratio below/above the band where the
    clip was taken), approx_kl (k3 of pi_old vs pi), ratio_max. `tis_weights` (B, A) or None:
    truncated importance weights for a rollout engine's mismatch (`truncated_is_weights`),
    multiplying each token's policy loss (not the KL term); adds tis_weight_mean.
    """

    def __init__(
        self, eps_low: float = 0.2, eps_high: float = 0.2, dual_clip: float | None = None, aggregation: LossAggregation = "token_mean",
        kl_coef: float = 0.0, kl_estimator: KLEstimator = "k3", max_length: int | None = None,
    ) -> None:
        super().__init__()
        self.eps_low, self.eps_high, self.dual_clip = eps_low, eps_high, dual_clip
        self.aggregation, self.max_length = aggregation, max_length
        self.kl_coef, self.kl_estimator = kl_coef, kl_estimator

    def forward(
        self, log_probs: torch.Tensor, old_log_probs: torch.Tensor | None, advantages: torch.Tensor, action_mask: torch.Tensor,
        units: torch.Tensor | float, ref_log_probs: torch.Tensor | None = None, tis_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        mask = action_mask.bool()
        old = log_probs.detach() if old_log_probs is None else old_log_probs
        log_ratio = torch.where(mask, log_probs - old, torch.zeros_like(log_probs))  # select: padding may hold anything
        advantages = torch.where(mask, advantages, torch.zeros_like(advantages))
        token_loss, clipped = clipped_surrogate(log_ratio, advantages, self.eps_low, self.eps_high, self.dual_clip)
        if tis_weights is not None:  # the engine sampled, not pi_old: reweight (truncated IS)
            token_loss = token_loss * tis_weights
        policy_loss = aggregate_loss(token_loss, mask, self.aggregation, units, self.max_length)
        loss, kl_loss = policy_loss, torch.zeros_like(policy_loss)
        if self.kl_coef > 0 and ref_log_probs is not None:
            kl = kl_estimate(log_probs, ref_log_probs, self.kl_estimator, mask)
            kl_loss = aggregate_loss(kl, mask, self.aggregation, units, self.max_length)
            loss = policy_loss + self.kl_coef * kl_loss
        with torch.no_grad():
            ratio = log_ratio.exp()
            clipped = clipped & mask
            stats = {
                "policy_loss": policy_loss.detach(), "kl_loss": kl_loss.detach(),
                "clipfrac": masked_mean(clipped.float(), mask),
                "clipfrac_low": masked_mean((clipped & (ratio < 1)).float(), mask),
                "clipfrac_high": masked_mean((clipped & (ratio > 1)).float(), mask),
                "approx_kl": masked_mean(torch.expm1(log_ratio) - log_ratio, mask),
                "ratio_max": torch.where(mask, ratio, torch.zeros_like(ratio)).max(),
            }
            if tis_weights is not None:
                stats["tis_weight_mean"] = masked_mean(tis_weights, mask)
        return loss, stats


# ---- offline preference optimisation (the DPO family) ------------------------------------------
# Inputs are per-sequence log-probabilities of the response tokens, (B,): the sum over the
# response's tokens (DPO, cDPO, KTO) or their mean (IPO, SimPO, ORPO: length-normalised, as each
# function says). Every function returns per-row losses (B,); the trainer averages them over the
# rows of the whole optimizer step, as the SFT and reward-model losses are.


def implicit_rewards(policy_logps: torch.Tensor, ref_logps: torch.Tensor, beta: float) -> torch.Tensor:
    """DPO's implicit reward beta (log pi(y|x) - log pi_ref(y|x)) (Rafailov et al. 2023, eq. 5). (B,) -> (B,)."""
    return beta * (policy_logps - ref_logps)


def preference_margin(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor) -> torch.Tensor:
    """h = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l)). All (B,) -> (B,)."""
    return (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)


def dpo_loss(margin: torch.Tensor, beta: float, label_smoothing: float = 0.0, gamma: float = 0.0) -> torch.Tensor:
    """DPO (Rafailov et al. 2023, eq. 7): -log sigmoid(beta h - gamma); with label smoothing e,
    cDPO (Mitchell 2023): -(1 - e) log sigmoid(beta h - gamma) - e log sigmoid(-(beta h - gamma)),
    for preferences flipped with probability e. gamma is a target reward margin (0 in the paper;
    ColossalChat's `gamma`). margin: (B,) log-prob margins h -> (B,)."""
    if not 0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    logits = beta * margin - gamma
    loss = -F.logsigmoid(logits)
    if label_smoothing:
        loss = (1 - label_smoothing) * loss - label_smoothing * F.logsigmoid(-logits)
    return loss


def ipo_loss(margin: torch.Tensor, beta: float) -> torch.Tensor:
    """IPO (Azar et al. 2023, eq. 17): (h - 1 / (2 beta))^2, a squared loss that does not push
    the margin to infinity. olingo, as TRL, takes h from length-averaged log-probs (token means),
    so the target 1/(2 beta) does not depend on response length. margin: (B,) -> (B,)."""
    return (margin - 1 / (2 * beta)) ** 2


def simpo_loss(chosen_mean_logps: torch.Tensor, rejected_mean_logps: torch.Tensor, beta: float, gamma: float) -> torch.Tensor:
    """SimPO (Meng et al. 2024, eq. 6): -log sigmoid(beta/|y_w| log pi(y_w) - beta/|y_l| log pi(y_l)
    - gamma), reference-free; inputs are token-mean log-probs (B,) -> (B,)."""
    return -F.logsigmoid(beta * (chosen_mean_logps - rejected_mean_logps) - gamma)


def log_odds(mean_logps: torch.Tensor) -> torch.Tensor:
    """log(p / (1 - p)) for p = exp(mean token log-prob), computed as logp - log(-expm1(logp)) so
    that p close to 1 does not lose precision. (B,) -> (B,); mean_logps must be < 0."""
    return mean_logps - torch.log(-torch.expm1(mean_logps))


def orpo_loss(chosen_mean_logps: torch.Tensor, rejected_mean_logps: torch.Tensor, chosen_nll: torch.Tensor, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """ORPO (Hong et al. 2024, eqs. 6-7): NLL(y_w) + lam x -log sigmoid(log odds(y_w) - log odds(y_l)).

    chosen_mean_logps, rejected_mean_logps: (B,) token-mean log-probs of the responses;
    chosen_nll: (B,) the chosen response's token-mean NLL (response tokens only). Returns
    (per-row loss (B,), the odds-ratio term (B,) before lam, for logging)."""
    ratio_loss = -F.logsigmoid(log_odds(chosen_mean_logps) - log_odds(rejected_mean_logps))
    return chosen_nll + lam * ratio_loss, ratio_loss


def kto_loss(
    policy_logps: torch.Tensor, ref_logps: torch.Tensor, desirable: torch.Tensor, kl: torch.Tensor | float, beta: float,
    desirable_weight: float = 1.0, undesirable_weight: float = 1.0,
) -> torch.Tensor:
    """KTO (Ethayarajh et al. 2024, eq. 8) on unpaired rows.

    policy_logps, ref_logps: (B,) summed response log-probs; desirable: (B,) bool; kl: the
    reference point z = max(0, mean r over mismatched prompt/response pairs), detached (the
    caller estimates it from its batch). r = log pi - log pi_ref; a desirable row loses
    desirable_weight (1 - sigmoid(beta (r - z))), an undesirable one undesirable_weight
    (1 - sigmoid(beta (z - r))). Returns (B,)."""
    r = policy_logps - ref_logps
    z = torch.as_tensor(kl, dtype=r.dtype, device=r.device).detach().clamp(min=0)
    good = desirable_weight * (1 - torch.sigmoid(beta * (r - z)))
    bad = undesirable_weight * (1 - torch.sigmoid(beta * (z - r)))
    return torch.where(desirable.bool(), good, bad)


@dataclass
class SequenceLogps:
    """Log-probabilities of a batch of responses: `sums` (B,) = log pi(y|x) summed over the
    response tokens, `counts` (B,) = how many tokens (float32, at least 1 for a valid row)."""

    sums: torch.Tensor
    counts: torch.Tensor

    @property
    def means(self) -> torch.Tensor:
        """Token-mean log-probabilities (B,): the length-normalised log pi(y|x) / |y|."""
        return self.sums / self.counts.clamp(min=1)

    def detach(self) -> SequenceLogps:
        return SequenceLogps(self.sums.detach(), self.counts)


DPOLossType = Literal["sigmoid", "cdpo", "ipo", "simpo"]
REFERENCE_FREE: tuple[str, ...] = ("simpo",)


@dataclass(frozen=True)
class DPOLoss:
    """The DPO family's loss on one batch of pairs: `sigmoid` (DPO), `cdpo` (DPO with
    `label_smoothing`), `ipo` (on token-mean log-probs), `simpo` (reference-free, token-mean,
    margin `gamma`). `length_normalization` makes `sigmoid`/`cdpo` use token means too
    (ColossalChat's flag); `gamma` is the target margin of `sigmoid`/`cdpo`/`simpo`.

    Called with the policy's and the reference's `SequenceLogps` of chosen and rejected rows
    (the reference may be None for `simpo`); returns (per-pair loss (B,), chosen implicit
    rewards (B,), rejected implicit rewards (B,)). The rewards are beta x (log pi - log pi_ref)
    for the reference-based losses and beta x token-mean log pi for SimPO (its own reward).
    """

    loss_type: DPOLossType = "sigmoid"
    beta: float = 0.1
    gamma: float = 0.0
    label_smoothing: float = 0.0
    length_normalization: bool = False

    def __post_init__(self) -> None:
        if self.loss_type not in ("sigmoid", "cdpo", "ipo", "simpo"):
            raise ValueError(f"unknown DPO loss_type {self.loss_type!r}; use sigmoid, cdpo, ipo or simpo")
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")
        if self.loss_type == "cdpo" and not 0 < self.label_smoothing < 0.5:
            raise ValueError(f"loss_type=cdpo needs label_smoothing in (0, 0.5), got {self.label_smoothing}")
        if self.loss_type != "cdpo" and self.label_smoothing:
            raise ValueError(f"label_smoothing is cDPO's: set loss_type=cdpo (got loss_type={self.loss_type})")
        if self.loss_type == "ipo" and self.gamma:
            raise ValueError("IPO has no margin gamma: its target margin is 1 / (2 beta)")

    @property
    def needs_reference(self) -> bool:
        return self.loss_type not in REFERENCE_FREE

    def __call__(
        self, chosen: SequenceLogps, rejected: SequenceLogps, ref_chosen: SequenceLogps | None, ref_rejected: SequenceLogps | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self.loss_type == "simpo":
            loss = simpo_loss(chosen.means, rejected.means, self.beta, self.gamma)
            return loss, self.beta * chosen.means.detach(), self.beta * rejected.means.detach()
        if ref_chosen is None or ref_rejected is None:
            raise ValueError(f"loss_type={self.loss_type} needs reference log-probs")
        per_token = self.length_normalization or self.loss_type == "ipo"
        def pick(x: SequenceLogps) -> torch.Tensor:
            return x.means if per_token else x.sums

        margin = preference_margin(pick(chosen), pick(rejected), pick(ref_chosen), pick(ref_rejected))
        if self.loss_type == "ipo":
            loss = ipo_loss(margin, self.beta)
        else:
            loss = dpo_loss(margin, self.beta, self.label_smoothing, self.gamma)
        rewards = (implicit_rewards(pick(p).detach(), pick(r), self.beta) for p, r in ((chosen, ref_chosen), (rejected, ref_rejected)))
        return loss, *rewards
