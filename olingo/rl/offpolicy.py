"""Off-policy corrections: the decoupled PPO objective's behaviour weight, and masks that drop the
tokens or whole responses sampled too far from the policy being trained (docs/async.md).

Three policies meet in one token's loss (Hilton et al. 2021, "Batch size-invariance for policy
optimization"; Fu et al. 2025, "AReaL: A Large-Scale Asynchronous Reinforcement Learning System
for Language Reasoning", its decoupled PPO objective):

    pi_theta   the policy being trained
    pi_prox    the proximal policy, the trust region's centre: the clip bounds pi_theta / pi_prox
    pi_behav   the behaviour policy that sampled the token: a rollout engine's copy of the
               weights, or weights several optimizer steps older than the learner's
    loss_t = w_t * clip-surrogate(pi_theta / pi_prox),   w_t = sg(min(pi_prox / pi_behav, cap))

olingo's truncated importance sampling (`loss.tis_cap`, `olingo.rl.kl.truncated_is_weights`) is
this w_t, with pi_prox the ratio's pi_old. The masks look at the same log-ratio
log(pi_prox / pi_behav) and zero the weight of what lies outside [low, high]: a token (`token`), or a
whole response by the product of its ratios (`sequence`) or their geometric mean (`geometric`):
verl's rollout-correction rejection sampling (`rollout_rs`), and the masked importance sampling of
Yao et al. 2025 ("Your efficient RL framework secretly brings you off-policy RL training") and
Liu et al. 2025 ("When speed kills stability").
Per-token tensors are (B, A) with an `action_mask` (B, A); nothing returned carries a gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from olingo.rl.kl import truncated_is_weights
from olingo.rl.masked import bool_mask, masked_mean

OffPolicyMask = Literal["none", "token", "sequence", "geometric"]
BehaviourSource = Literal["engine", "experience"]
# Clamp of the log-ratio in the logged KL only (as verl's exp(+-20)): a stale row may be off by
# hundreds of nats, and an inf metric helps nobody. The masks compare in log space, unclamped.
KL_LOG_RATIO_BOUND = 20.0


def behaviour_log_ratio(proximal_log_probs: torch.Tensor, behaviour_log_probs: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """log(pi_prox / pi_behav) of each sampled token, (B, A), detached and exactly 0 at padding.

    proximal_log_probs, behaviour_log_probs, action_mask: (B, A). Selected with `torch.where`
    (padding may hold -inf, and -inf - -inf is NaN)."""
    mask = bool_mask(action_mask, proximal_log_probs)
    diff = proximal_log_probs.detach() - behaviour_log_probs.detach()
    return torch.where(mask, diff, torch.zeros_like(diff))


def _log_bounds(low: float, high: float) -> tuple[float, float]:
    """log(low), log(high) of a kept band [low, high] of ratios; low may be 0 (no lower bound)."""
    if not 0 <= low < high:
        raise ValueError(f"an off-policy mask keeps ratios in [low, high] with 0 <= low < high, got [{low}, {high}]")
    return (math.log(low) if low > 0 else -math.inf), math.log(high)


def token_keep_mask(log_ratio: torch.Tensor, action_mask: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Token-level masking (masked IS; verl `rollout_rs=token`): keep token t
    when low <= pi_prox / pi_behav <= high, i.e. log low <= log_ratio <= log high (compared in log
    space, so no ratio overflows). Unlike TIS, which truncates a large weight to the cap, a token
    outside the band is dropped. log_ratio, action_mask: (B, A); returns (B, A) bool, False at padding."""
    log_low, log_high = _log_bounds(low, high)
    return bool_mask(action_mask, log_ratio) & (log_ratio >= log_low) & (log_ratio <= log_high)


def _keep_rows(row_log_ratio: torch.Tensor, action_mask: torch.Tensor, low: float, high: float) -> torch.Tensor:
    log_low, log_high = _log_bounds(low, high)
    keep = (row_log_ratio >= log_low) & (row_log_ratio <= log_high)  # (B, 1)
    return bool_mask(action_mask, row_log_ratio.expand_as(action_mask)) & keep


def sequence_keep_mask(log_ratio: torch.Tensor, action_mask: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Sequence-level masking (verl `rollout_rs=sequence`; sequence-level masked IS in Liu et al. 2025):
    keep response i when its sequence ratio prod_t pi_prox / pi_behav lies in [low, high], i.e.
    log low <= sum_t log_ratio <= log high (the product of a long response over- or underflows in
    linear space). log_ratio (0 at padding, as `behaviour_log_ratio` gives it), action_mask:
    (B, A); returns (B, A) bool, the row's verdict on each of its tokens, False at padding."""
    return _keep_rows(log_ratio.sum(-1, keepdim=True), action_mask, low, high)


def geometric_keep_mask(log_ratio: torch.Tensor, action_mask: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Geometric-mean masking (verl `rollout_rs=geometric`): keep response i when
    exp(mean_t log_ratio) lies in [low, high]. Length-normalised, so one band suits short and long
    responses alike, and a tight one (verl's preset: [0.999, 1.001]) is needed. log_ratio (0 at
    padding), action_mask: (B, A); returns (B, A) bool, False at padding."""
    count = bool_mask(action_mask, log_ratio).sum(-1, keepdim=True).clamp(min=1)
    return _keep_rows(log_ratio.sum(-1, keepdim=True) / count, action_mask, low, high)


def keep_mask(kind: OffPolicyMask, log_ratio: torch.Tensor, action_mask: torch.Tensor, low: float, high: float) -> torch.Tensor | None:
    """The (B, A) bool mask of `kind` (None for `none`): `token_keep_mask`, `sequence_keep_mask`
    or `geometric_keep_mask` of log_ratio = log(pi_prox / pi_behav) with the band [low, high]."""
    if kind == "none":
        return None
    masks = {"token": token_keep_mask, "sequence": sequence_keep_mask, "geometric": geometric_keep_mask}
    if kind not in masks:
        raise ValueError(f"unknown off-policy mask {kind!r}; choose none, token, sequence or geometric")
    return masks[kind](log_ratio, action_mask, low, high)


def masked_fraction(keep: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """The share of response tokens `keep` (B, A) drops: a scalar, 0 when there are none."""
    return masked_mean((~keep).float(), action_mask)


def behaviour_kl(log_ratio: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(pi_behav || pi_prox) per response token from the behaviour policy's own
    samples (Schulman 2020): mean of (r - 1) - log r, r = pi_prox / pi_behav, >= 0 and 0 on-policy.
    log_ratio is clamped to +-`KL_LOG_RATIO_BOUND` first, so the metric stays finite."""
    clamped = log_ratio.clamp(-KL_LOG_RATIO_BOUND, KL_LOG_RATIO_BOUND)
    return masked_mean(torch.expm1(clamped) - clamped, action_mask)


@dataclass(frozen=True)
class OffPolicyCorrection:
    """The learner's off-policy settings (the `loss:` section's fields of the same meaning).

    cap: `tis_cap`, the truncation of w_t (None: no correction at all); behaviour: where pi_behav
    comes from (`proximal_and_behaviour`); mask, low, high: which `keep_mask` and its band.
    """

    cap: float | None = None
    behaviour: BehaviourSource = "engine"
    mask: OffPolicyMask = "none"
    low: float = 0.0
    high: float = math.inf


def proximal_and_behaviour(
    source: BehaviourSource, log_probs: torch.Tensor, recorded_log_probs: torch.Tensor | None, engine_log_probs: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log pi_prox, log pi_behav) of a minibatch's tokens, (B, A); pi_behav None: the batch records
    none, so there is nothing to correct.

    log_probs: the learner's forward, pi_theta. recorded_log_probs: the experience's log pi_old
    (`Experience.action_log_probs`, taken at rollout time by the weights that sampled), or None.
    engine_log_probs: a separate engine's own log-probs, carried with `tis_cap`, or None.
    engine: pi_behav is the engine's and pi_prox the recorded forward (the current policy when
    none was recorded: one optimizer step per batch), the synchronous case of docs/engines.md.
    experience: pi_behav is what the experience recorded of its sampler (the engine's log-probs
    when carried, else the recorded forward) and pi_prox the learner's current weights, exact
    when the batch is learnt in one optimizer step (AReaL recomputes it once per batch instead).
    """
    current = log_probs.detach()
    if source == "experience":
        return current, engine_log_probs if engine_log_probs is not None else recorded_log_probs
    if source != "engine":
        raise ValueError(f"unknown behaviour source {source!r}; choose engine or experience")
    return (recorded_log_probs if recorded_log_probs is not None else current), engine_log_probs


def offpolicy_correction(
    log_probs: torch.Tensor, recorded_log_probs: torch.Tensor | None, engine_log_probs: torch.Tensor | None, action_mask: torch.Tensor,
    settings: OffPolicyCorrection,
) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]:
    """What the policy loss needs of the off-policy settings: (log pi_prox for its ratio (B, A),
    the per-token weights (B, A) or None, detached stats).

    weights: w_t = min(pi_prox / pi_behav, cap) times the keep mask (0 on what it drops), None when
    `settings.cap` is None or the batch has no pi_behav. Stats, only when there are weights:
    `behaviour_kl` (`behaviour_kl`) when pi_behav comes from the experience or a mask is on, and
    `offpolicy_masked_frac` (share of response tokens dropped) when a mask is on. A dropped token
    still counts in the loss's denominator (as AReaL's behaviour mask), so masking never rescales
    the rest of the step.
    """
    proximal, behaviour = proximal_and_behaviour(settings.behaviour, log_probs, recorded_log_probs, engine_log_probs)
    if settings.cap is None or behaviour is None:
        return proximal, None, {}
    weights = truncated_is_weights(proximal, behaviour, settings.cap, action_mask)
    log_ratio = behaviour_log_ratio(proximal, behaviour, action_mask)
    stats: dict[str, torch.Tensor] = {}
    if settings.behaviour == "experience" or settings.mask != "none":
        stats["behaviour_kl"] = behaviour_kl(log_ratio, action_mask)
    keep = keep_mask(settings.mask, log_ratio, action_mask, settings.low, settings.high)
    if keep is not None:
        weights = weights * keep
        stats["offpolicy_masked_frac"] = masked_fraction(keep, action_mask)
    return proximal, weights, stats
