"""Loss functions. Each documents its shapes and the paper it comes from.

Pairwise reward-model losses follow the Bradley-Terry model of preferences used by
InstructGPT (Ouyang et al., 2022, eq. 1): P(chosen > rejected) = sigmoid(r_c - r_r).
"""

from __future__ import annotations

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
    """
    targets = input_ids[:, 1:]
    mask = loss_mask[:, 1:].to(logits.dtype)
    nll = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(), reduction="none")
    return (nll.view_as(mask) * mask).sum(), mask.sum()


class GPTLMLoss(nn.Module):
    """Token-mean causal LM loss over masked positions (SFT and PPO's ptx term).

    logits: (B, L, V); input_ids, loss_mask: (B, L) (loss_mask defaults to all ones).
    """

    def forward(self, logits: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor | None = None) -> torch.Tensor:
        if loss_mask is None:
            loss_mask = torch.ones_like(input_ids)
        total, count = token_nll(logits, input_ids, loss_mask)
        return total / count.clamp(min=1)
