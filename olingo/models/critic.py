"""`Critic`: the PPO value model, a `RewardModel` read at every position instead of the last.

Same weights and directory format as a reward model (a `*ForSequenceClassification` with one
label), so a critic usually starts from the trained reward model, as InstructGPT's did, and a
saved critic loads back with `Critic.from_pretrained`.
"""

from __future__ import annotations

import torch

from olingo.models.reward_model import RewardModel


class Critic(RewardModel):
    """Backbone + value head; `forward` returns a value per position, shape (B, L)."""

    kind = "critic"

    def forward(  # type: ignore[override]
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, packing: bool = False, position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, attention_mask: (B, L) -> values (B, L); position t values the prefix ..t
        (packing, position_ids: see `RewardModel.values`)."""
        return self.values(input_ids, attention_mask, packing, position_ids)
