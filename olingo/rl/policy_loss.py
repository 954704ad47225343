"""Policy and value losses: the clipped surrogate (written once, here), how token losses are
aggregated into a step's loss, PPO's `PolicyLoss` and `ValueLoss`, and the critic-free
`GroupPolicyLoss` of the GRPO family.

PPO: Schulman et al. 2017, "Proximal Policy Optimization Algorithms". The GRPO family's loss
adds DAPO's clip-higher, the dual clip, a KL-to-reference term and three ways to aggregate
token losses. The objectives that replace the clipped surrogate (GSPO, CISPO, SAPO, 2025) are
small functions too, picked by `GroupPolicyLoss(objective=...)`. Per-token tensors are (B, A)
with an `action_mask` (B, A).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from olingo.rl.kl import KLEstimator, kl_estimate
from olingo.rl.masked import masked_mean, masked_sum

LossAggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
PolicyObjective = Literal["ppo_clip", "gspo", "gspo_token", "cispo", "sapo"]


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


def gspo_surrogate(
    log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor, action_mask: torch.Tensor,
    eps_low: float, eps_high: float, token_level: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """GSPO's sequence-level clipped surrogate (Zheng et al. 2025, "Group Sequence Policy
    Optimization", arXiv 2507.18071), written as a per-token loss.

    log_probs, old_log_probs, advantages, action_mask: (B, A). The ratio of response i is the
    geometric mean of its token ratios, s_i = exp(mean_t (log pi - log pi_old)), the same for all
    its tokens; loss_{i,t} = -min(s_i A_{i,t}, clip(s_i, 1 - eps_low, 1 + eps_high) A_{i,t})
    (`clipped_surrogate`). With `seq_mean_token_mean` and a sequence advantage that is the paper's
    -(1/G) sum_i min(s_i A_i, clip(s_i) A_i). `token_level` (the paper's GSPO-token): s_{i,t} =
    sg(s_i) pi_t / sg(pi_t), the value of s_i but each token's own gradient, so per-token
    advantages keep their weight. Returns (token loss, clipped, s) all (B, A).
    """
    mask = action_mask.bool()
    zeros = torch.zeros_like(log_probs)
    log_probs = torch.where(mask, log_probs, zeros)  # padding may hold anything, even -inf
    log_ratio = torch.where(mask, log_probs - old_log_probs, zeros)
    log_s = log_ratio.sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1)
    log_s = log_s.detach() + log_probs - log_probs.detach() if token_level else log_s.expand_as(log_ratio)
    log_s = torch.where(mask, log_s, zeros)
    loss, clipped = clipped_surrogate(log_s, advantages, eps_low, eps_high)
    return loss, clipped, log_s.detach().exp()


def cispo_loss(
    log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor, action_mask: torch.Tensor,
    max_ratio: float, min_ratio: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO (MiniMax 2025, "MiniMax-M1", arXiv 2506.13585): clip the importance weight, not the update.

    log_probs, old_log_probs, advantages, action_mask: (B, A). loss_t = -sg(clip(r_t, min_ratio,
    max_ratio)) A_t log pi_t with r_t = pi / pi_old, so every token's gradient is its capped weight
    x A_t grad log pi_t: a token outside the band still learns, where the clipped surrogate drops
    it. The paper's clip(r, 1 - eps_low, 1 + eps_high) sets no effective lower bound (min_ratio 0);
    ScaleRL (Khatri et al. 2025) and TRL cap at eps_max = 5. Returns (token loss, clipped) (B, A);
    `clipped` marks tokens whose weight was capped.
    """
    mask = action_mask.bool()
    log_probs = torch.where(mask, log_probs, torch.zeros_like(log_probs))  # padding may hold anything, even -inf
    ratio = torch.where(mask, log_probs - old_log_probs, torch.zeros_like(log_probs)).exp().detach()
    weight = ratio.clamp(min_ratio, max_ratio)
    return -weight * advantages * log_probs, (ratio > max_ratio) | (ratio < min_ratio)


def sapo_loss(log_ratio: torch.Tensor, advantages: torch.Tensor, tau_pos: float, tau_neg: float) -> tuple[torch.Tensor, torch.Tensor]:
    """SAPO (Qwen 2025, "Soft Adaptive Policy Optimization", arXiv 2511.20347): a soft gate for the hard clip.

    log_ratio, advantages: (B, A). loss_t = -f(r_t) A_t with f(r) = (4 / tau) sigmoid(tau (r - 1)),
    tau = tau_pos where A_t > 0 and tau_neg otherwise (the paper's form; TRL's `sapo` the same).
    d f / d log pi = 4 s (1 - s) r with s = sigmoid(tau (r - 1)): exactly 1 at r = 1 (the policy
    gradient) and decaying smoothly to 0 as r leaves 1, faster for larger tau (paper: tau_neg >
    tau_pos, negative updates being the less stable). Returns (token loss, gate weight 4 s (1 - s) r) (B, A).
    """
    ratio = log_ratio.exp()
    tau = torch.where(advantages > 0, tau_pos, tau_neg).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1))
    return -gate * 4 / tau * advantages, (4 * gate * (1 - gate) * ratio).detach()


@dataclass(frozen=True)
class ObjectiveParams:
    """Settings of the objectives other than ppo_clip (which reads eps_low/eps_high/dual_clip).

    seq_eps_low/high: GSPO's clip of the sequence ratio (paper: 3e-4, 4e-4); cispo_max/min_ratio:
    CISPO's bounds on the importance weight (ScaleRL, TRL: 5, none); sapo_tau_pos/neg: SAPO's
    gate temperatures (paper, TRL: 1.0, 1.05).
    """

    seq_eps_low: float = 3e-4
    seq_eps_high: float = 4e-4
    cispo_max_ratio: float = 5.0
    cispo_min_ratio: float = 0.0
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05


def objective_token_loss(
    objective: PolicyObjective, log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor, action_mask: torch.Tensor,
    params: ObjectiveParams,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss of a non-default objective: (loss, clipped, the ratio that was clipped, extra
    detached stats), the first three (B, A). Padding of `advantages` must already be 0."""
    mask = action_mask.bool()
    log_ratio = torch.where(mask, log_probs - old_log_probs, torch.zeros_like(log_probs))
    if objective in ("gspo", "gspo_token"):
        loss, clipped, seq_ratio = gspo_surrogate(
            log_probs, old_log_probs, advantages, mask, params.seq_eps_low, params.seq_eps_high, objective == "gspo_token",
        )
        return loss, clipped, seq_ratio, {"seq_ratio_mean": masked_mean(seq_ratio, mask)}
    if objective == "cispo":
        loss, clipped = cispo_loss(log_probs, old_log_probs, advantages, mask, params.cispo_max_ratio, params.cispo_min_ratio)
        return loss, clipped, log_ratio.detach().exp(), {}
    if objective == "sapo":
        loss, weight = sapo_loss(log_ratio, advantages, params.sapo_tau_pos, params.sapo_tau_neg)
        return loss, torch.zeros_like(mask), log_ratio.detach().exp(), {"sapo_gate_weight": masked_mean(weight, mask)}
    raise ValueError(f"unknown policy objective {objective!r}; choose ppo_clip, gspo, gspo_token, cispo or sapo")


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
    `tis_weights` (B, A) or None: the off-policy correction's constant weights, multiplying each
    token's loss: truncated pi_old / pi_behaviour, 0 where a mask drops the token
    (`olingo.rl.offpolicy.offpolicy_correction`; pi_old is then the proximal policy).
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
        if tis_weights is not None:  # pi_behaviour sampled, not pi_old: reweight (truncated IS, masks)
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
    the off-policy correction's constant weights (truncated pi_old / pi_behaviour, 0 where a mask
    drops the token: `olingo.rl.offpolicy.offpolicy_correction`), multiplying each token's policy
    loss (not the KL term); adds tis_weight_mean (dropped tokens count 0). `objective`
    replaces the clipped surrogate (`objective_token_loss`, settings in `params`); clipfrac then
    counts the sequences (gspo) or importance weights (cispo) clipped, and is 0 for sapo.
    """

    def __init__(
        self, eps_low: float = 0.2, eps_high: float = 0.2, dual_clip: float | None = None, aggregation: LossAggregation = "token_mean",
        kl_coef: float = 0.0, kl_estimator: KLEstimator = "k3", max_length: int | None = None,
        objective: PolicyObjective = "ppo_clip", params: ObjectiveParams | None = None,
    ) -> None:
        super().__init__()
        if dual_clip is not None and objective != "ppo_clip":
            raise ValueError(f"dual_clip applies to the ppo_clip objective only, not {objective!r}")
        self.objective, self.params = objective, params or ObjectiveParams()
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
        extra: dict[str, torch.Tensor] = {}
        if self.objective == "ppo_clip":
            token_loss, clipped = clipped_surrogate(log_ratio, advantages, self.eps_low, self.eps_high, self.dual_clip)
            clip_ratio = log_ratio.detach().exp()
        else:
            token_loss, clipped, clip_ratio, extra = objective_token_loss(self.objective, log_probs, old, advantages, mask, self.params)
        if tis_weights is not None:  # pi_behaviour sampled, not pi_old: reweight (truncated IS, masks)
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
                "clipfrac_low": masked_mean((clipped & (clip_ratio < 1)).float(), mask),
                "clipfrac_high": masked_mean((clipped & (clip_ratio > 1)).float(), mask),
                "approx_kl": masked_mean(torch.expm1(log_ratio) - log_ratio, mask),
                "ratio_max": torch.where(mask, ratio, torch.zeros_like(ratio)).max(),
                **extra,
            }
            if tis_weights is not None:
                stats["tis_weight_mean"] = masked_mean(tis_weights, mask)
        return loss, stats
