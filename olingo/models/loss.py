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
