"""Preference losses: the Bradley-Terry reward-model losses and the DPO family.

Pairwise reward-model losses follow the Bradley-Terry model of preferences used by
InstructGPT (Ouyang et al., 2022, eq. 1): P(chosen > rejected) = sigmoid(r_c - r_r).

The DPO family's inputs are per-sequence log-probabilities of the response tokens, (B,): the
sum over the response's tokens (DPO, cDPO, KTO) or their mean (IPO, SimPO, ORPO:
length-normalised, as each function says). Every function returns per-row losses (B,); the
trainer averages them over the rows of the whole optimizer step, as the SFT and reward-model
losses are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn


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

    Mathematically equal to LogSigLoss; kept as its own class because the compatible API
    (docs/coming-from-colossalchat.md) and configs name both. chosen_reward, reject_reward: (B,).
    Returns a scalar.
    """

    def __init__(self, beta: float = 1.0) -> None:
        super().__init__()
        self.beta = beta

    def forward(self, chosen_reward: torch.Tensor, reject_reward: torch.Tensor) -> torch.Tensor:
        return F.softplus(self.beta * (reject_reward - chosen_reward)).mean()


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
    the trainers' `gamma`). margin: (B,) log-prob margins h -> (B,)."""
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
    margin `gamma`). `length_normalization` makes `sigmoid`/`cdpo` use token means too;
    `gamma` is the target margin of `sigmoid`/`cdpo`/`simpo`.

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
