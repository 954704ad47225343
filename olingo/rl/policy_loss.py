"""Policy and value losses: the clipped surrogate (written once, here), how token losses are
aggregated into a step's loss, PPO's `PolicyLoss` and `ValueLoss`, and the critic-free
`GroupPolicyLoss` of the GRPO family.

PPO: Schulman et al. 2017, "Proximal Policy Optimization Algorithms". The GRPO family's loss
adds DAPO's clip-higher, the dual clip, a KL-to-reference term and three ways to aggregate
token losses. Per-token tensors are (B, A) with an `action_mask` (B, A).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from olingo.rl.kl import KLEstimator, kl_estimate
from olingo.rl.masked import masked_mean, masked_sum

LossAggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]


def clipped_surrogate(
    log_ratio: torch.Tensor, advantages: torch.Tensor, eps_low: float, eps_high: float, dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped policy-gradient loss with clip-higher and the optional dual clip.

    log_ratio, advantages: (B, A) (log pi - log pi_old, and the advantage of each token).
    loss_t = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A) (PPO, Schulman et al. 2017 eq. 7;
    asymmetric bounds: DAPO's clip-higher, Yu et al. 2025 eq. 10). With `dual_clip` = c > 1 the
    loss of a token with A < 0 is also capped at -c A (Ye et al. 2020, "Mastering Complex
    Control in MOBA Games", eq. 5), so one very unlikely token cannot dominate. Returns
    (token loss, clipped) both (B, A); `clipped` marks tokens whose clipped term was taken.
    """
    ratio = log_ratio.exp()
    unclipped = -ratio * advantages
    clipped = -ratio.clamp(1 - eps_low, 1 + eps_high) * advantages
    loss = torch.max(unclipped, clipped)
    took_clip = clipped > unclipped
    if dual_clip is not None:
        if dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        capped = torch.min(loss, -dual_clip * advantages)
        loss = torch.where(advantages < 0, capped, loss)
    return loss, took_clip


def loss_units(action_mask: torch.Tensor, mode: LossAggregation) -> torch.Tensor:
    """What `aggregate_loss` divides by, counted in one micro-batch: response tokens for
    `token_mean`, responses (rows with at least one token) otherwise. A float32 scalar; the
    trainer sums it over every micro-batch and rank of the optimizer step."""
    mask = action_mask.bool()
    if mode == "token_mean":
        return mask.sum().to(torch.float32)
    return mask.any(dim=-1).sum().to(torch.float32)


def aggregate_loss(
    token_loss: torch.Tensor, action_mask: torch.Tensor, mode: LossAggregation, units: torch.Tensor | float, max_length: int | None = None,
) -> torch.Tensor:
    """One micro-batch's share of the optimizer step's loss. token_loss, action_mask: (B, A).

    token_mean (DAPO):               sum_{i,t} l_{i,t} / units, units = tokens of the whole step
    seq_mean_token_mean (GRPO):      sum_i mean_t l_{i,t} / units, units = responses of the step
    seq_mean_token_sum_norm (Dr. GRPO): sum_i (sum_t l_{i,t} / max_length) / units, with the
                                     constant `max_length` (the generation limit): no length bias
    `units` is `loss_units` summed over every micro-batch (and rank) of the step, so that the
    sum of these shares equals the loss of one big batch however it is split (docs/algorithms.md).
    """
    mask = action_mask.bool()
    if mode == "token_mean":
        total = masked_sum(token_loss, mask)
    elif mode == "seq_mean_token_mean":
        total = masked_mean(token_loss, mask, dim=-1).sum()
    elif mode == "seq_mean_token_sum_norm":
        if not max_length:
            raise ValueError("seq_mean_token_sum_norm needs max_length (the constant response-length normaliser)")
        total = masked_sum(token_loss, mask, dim=-1).sum() / max_length
    else:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose token_mean, seq_mean_token_mean or seq_mean_token_sum_norm")
    units = torch.as_tensor(units, dtype=total.dtype, device=total.device)
    return total / units.clamp(min=1)


class PolicyLoss(nn.Module):
    """PPO's clipped surrogate objective, negated (Schulman et al. 2017, eq. 7).

    log_probs, old_log_probs, advantages, action_mask: (B, A). ratio = exp(logp - logp_old);
    loss_t = -min(ratio A_t, clip(ratio, 1 - eps, 1 + eps) A_t) (`clipped_surrogate` with
    symmetric bounds and no dual clip), averaged over each sequence's
    masked tokens, then over the B sequences (so every sequence weighs the same, however long).
    `tis_weights` (B, A) or None: truncated importance weights pi_old / pi_engine of a rollout
    engine other than the trainer (`truncated_is_weights`), multiplying each token's loss.
    Returns (loss, skip, stats). `skip` is True when the mean ratio over masked tokens exceeds
    `skip_threshold`: the policy has diverged from the one that sampled, and the caller skips
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
        token_loss, _ = clipped_surrogate(log_ratio, advantages, self.clip_eps, self.clip_eps)
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
    """The policy loss of GRPO, Dr. GRPO, DAPO, RLOO and REINFORCE++ (docs/algorithms.md).

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
