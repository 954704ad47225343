"""`ORPOTrainer`: odds-ratio preference optimisation (Hong et al. 2024).

One micro-batch, as the algorithm reads (the step around it: `olingo.trainer.preference`):
    1. chosen and rejected rows go through ONE forward, concatenated (2B rows); no reference
    2. token-mean log-probs of each response (the loss mask: response tokens only)
    3. loss = NLL(chosen) + lam x -log sigmoid(log odds(chosen) - log odds(rejected))
The NLL covers the response tokens only (never the prompt); anomaly detection stays off.
Metrics: loss, nll_loss, or_loss (the odds-ratio term before lam), log_odds_ratio,
rewards/chosen and rewards/rejected (lam x token-mean log-probs, TRL's convention),
rewards/margins, rewards/accuracies, logps/chosen, logps/rejected (summed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from olingo.booster import Booster, OptimizerWrapper, Plugin
from olingo.cluster import DistCoordinator
from olingo.rl.preference import log_odds, orpo_loss
from olingo.trainer.callbacks import Callback
from olingo.trainer.dpo import halves, pair_inputs, preference_stats
from olingo.trainer.preference import OfflinePreferenceTrainer, RowTerms, response_logps


class ORPOTrainer(OfflinePreferenceTrainer):
    """Train a causal LM on chosen/rejected pairs with ORPO: SFT on the chosen response plus an
    odds-ratio preference term, no reference model.

    ColossalChat-compatible signature (docs/coming-from-colossalchat.md; `lam` weighs the odds-ratio
    term); keyword-only extras: `callbacks`, `eval_interval`, `packing` (padding-free forwards, default on).
    """

    def __init__(
        self,
        actor: Any,
        booster: Booster,
        actor_optim: OptimizerWrapper,
        plugin: Plugin,
        actor_lr_scheduler: Any,
        tokenizer: Any,
        max_epochs: int = 1,
        lam: float = 0.1,
        apply_loss_mask: bool = True,
        accumulation_steps: int = 1,
        start_epoch: int = 0,
        save_interval: int = 0,
        save_dir: str | None = None,
        coordinator: DistCoordinator | None = None,
        *,
        callbacks: Sequence[Callback] = (),
        eval_interval: int = 0,
        packing: bool = True,
    ) -> None:
        if lam < 0:
            raise ValueError(f"lam must be >= 0, got {lam}")
        super().__init__(
            actor=actor, booster=booster, actor_optim=actor_optim, plugin=plugin, actor_lr_scheduler=actor_lr_scheduler,
            tokenizer=tokenizer, max_epochs=max_epochs, apply_loss_mask=apply_loss_mask, accumulation_steps=accumulation_steps,
            start_epoch=start_epoch, save_interval=save_interval, save_dir=save_dir, coordinator=coordinator,
            callbacks=callbacks, eval_interval=eval_interval, packing=packing,
        )
        self.lam = lam

    def _terms(self, batch: dict[str, torch.Tensor]) -> RowTerms:
        ids, attention, mask = pair_inputs(batch, self._mask)
        chosen, rejected = halves(response_logps(self.model, ids, attention, mask, packing=self.packing))
        nll = -chosen.means
        loss, ratio_loss = orpo_loss(chosen.means, rejected.means, nll, self.lam)
        chosen_rewards, rejected_rewards = self.lam * chosen.means.detach(), self.lam * rejected.means.detach()
        stats = preference_stats(chosen.detach(), rejected.detach(), chosen_rewards, rejected_rewards)
        stats |= {
            "nll_loss": (nll, None),
            "or_loss": (ratio_loss, None),
            "log_odds_ratio": (log_odds(chosen.means.detach()) - log_odds(rejected.means.detach()), None),
        }
        return RowTerms(loss, stats)
