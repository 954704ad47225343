"""KL estimators between the policy and a reference, and the importance weights that correct
for a rollout engine whose probabilities differ from the trainer's.

Per-token tensors are (B, A) with an `action_mask` (B, A); masked-out entries are exactly 0.
"""

from __future__ import annotations

from typing import Literal

import torch

from olingo.rl.masked import bool_mask, masked_mean

KLEstimator = Literal["k1", "k2", "k3"]


def kl_estimate(
    log_probs: torch.Tensor, ref_log_probs: torch.Tensor, estimator: KLEstimator = "k1",
    action_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman 2020,
    "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html).

    log_probs, ref_log_probs: (B, A) log-probabilities of the sampled tokens. Returns (B, A).
    With log r = logp_ref - logp: k1 = -log r (unbiased, can be negative); k2 = (log r)^2 / 2
    (biased, low variance); k3 = (r - 1) - log r (unbiased and always >= 0). With
    `action_mask` (B, A), masked-out entries are exactly 0: the log-ratio is selected away
    before exp, because padding can hold any log-probability, exp of it can overflow to inf,
    and inf * 0 is NaN. Without a mask, padded entries are whatever the inputs make them.
    """
    log_ratio = ref_log_probs - log_probs
    if action_mask is not None:
        log_ratio = torch.where(bool_mask(action_mask, log_ratio), log_ratio, torch.zeros_like(log_ratio))
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    if estimator == "k3":
        return torch.expm1(log_ratio) - log_ratio
    raise ValueError(f"unknown KL estimator {estimator!r}; choose one of 'k1', 'k2', 'k3'")


def truncated_is_weights(
    trainer_log_probs: torch.Tensor, engine_log_probs: torch.Tensor, cap: float, action_mask: torch.Tensor,
) -> torch.Tensor:
    """Truncated importance sampling weights for a rollout engine's mismatch (Yao et al. 2025,
    "Your efficient RL framework secretly brings you off-policy RL training"; docs/engines.md).

    trainer_log_probs, engine_log_probs, action_mask: (B, A). The engine sampled token t with
    probability pi_engine(t), while the ratio of the policy loss divides by the trainer's
    pi_old(t) of the same weights; the two differ by kernels and precision, so the gradient
    is off-policy. w_t = min(pi_old(t) / pi_engine(t), cap), a constant (no gradient), multiplies
    each token's policy loss. Returns (B, A); 1 at masked positions (padding is multiplied by a
    zero mask anyway; 1 keeps inf/NaN out of it).
    """
    if cap <= 0:
        raise ValueError(f"tis_cap must be > 0, got {cap}")
    mask = bool_mask(action_mask, trainer_log_probs)
    log_ratio = torch.where(mask, trainer_log_probs.detach() - engine_log_probs, torch.zeros_like(trainer_log_probs))
    return log_ratio.exp().clamp(max=cap).detach()


def engine_mismatch(trainer_log_probs: torch.Tensor, engine_log_probs: torch.Tensor, action_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """How far a rollout engine's log-probs of the sampled tokens are from the trainer's.

    trainer_log_probs, engine_log_probs, action_mask: (B, A), the same tokens under the same
    weights. Returns scalars: `engine_logprob_abs_diff`, the mean |log pi_trainer - log
    pi_engine| over response tokens, its max `engine_logprob_max_diff`, and `engine_kl`, the k3
    estimate of KL(pi_engine || pi_trainer) per token from the engine's own samples (>= 0; 0
    when the two agree). Both are 0 for an exact engine; kernels and precision make them
    ~1e-6 in fp32 and ~1e-3 to 1e-2 in bf16.
    """
    mask = bool_mask(action_mask, trainer_log_probs)
    diff = torch.where(mask, trainer_log_probs - engine_log_probs, torch.zeros_like(trainer_log_probs))
    return {
        "engine_logprob_abs_diff": masked_mean(diff.abs(), mask),
        "engine_logprob_max_diff": diff.abs().max() if diff.numel() else diff.new_zeros(()),
        "engine_kl": masked_mean(kl_estimate(engine_log_probs, trainer_log_probs, "k3", mask), mask),
    }
