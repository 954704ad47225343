"""`RewardModelTrainer`: pairwise reward-model training.

One optimizer step, as the algorithm reads:
    1. chosen and rejected rows of a micro-batch go through ONE forward pass, concatenated (2B rows);
       with `packing` (the default) their attended tokens run padding-free, each row still scored
       at its own last attended token (`RewardModel.forward`); with `share_prompt` (the default)
       a pair's shared opening (its prompt) runs once where that saves work (`olingo.models.pair_prefix`)
    2. split the scores back into r_chosen (B,) and r_rejected (B,)
    3. loss = loss_fn(r_chosen, r_rejected) (LogSigLoss by default), backward on loss / micro-batches
    4. after `accumulation_steps` micro-batches: clip, optimizer step, scheduler step
Metrics per optimizer step: loss, reward_chosen, reward_rejected, dist (= mean r_c - mean r_r),
acc (= mean(r_c > r_r)), lr, grad_norm; evaluation computes the same on the eval set.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerBase

from olingo.booster import Booster, OptimizerWrapper, Plugin
from olingo.cluster import DistCoordinator
from olingo.rl.preference import LogSigLoss
from olingo.trainer.callbacks import Callback, LoopArtifacts
from olingo.trainer.supervised import SLTrainer


def score_pairs(model: torch.nn.Module, batch: dict[str, torch.Tensor], packing: bool = False, share_prompt: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores of chosen and rejected rows from one concatenated forward: two (B,) tensors.

    packing: the 2B rows' attended tokens run padding-free (`RewardModel.forward(..., packing=True)`).
    share_prompt: each pair's shared opening runs once where that saves work (`pairs=True`)."""
    input_ids = torch.cat([batch["chosen_input_ids"], batch["rejected_input_ids"]])
    attention_mask = torch.cat([batch["chosen_attention_mask"], batch["rejected_attention_mask"]])
    scores = model(input_ids=input_ids, attention_mask=attention_mask, packing=packing, **({"pairs": True} if share_prompt else {}))
    return scores.chunk(2)


PAIR_STATS = ("loss", "reward_chosen", "reward_rejected", "dist", "acc")


def pair_stats(chosen: torch.Tensor, rejected: torch.Tensor, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    """Detached per-batch means of the reward-model metrics."""
    return {
        "loss": loss.detach(),
        "reward_chosen": chosen.detach().mean(),
        "reward_rejected": rejected.detach().mean(),
        "dist": (chosen - rejected).detach().mean(),
        "acc": (chosen > rejected).float().mean(),
    }


class RewardModelTrainer(SLTrainer):
    """Train a `RewardModel` on chosen/rejected pairs.

    ColossalChat-compatible signature (docs/coming-from-colossalchat.md), plus keyword-only
    extras: `callbacks` (any olingo `Callback`), `eval_interval` (evaluate every
    N optimizer steps as well as after every epoch; 0 = only after epochs), `packing`
    (padding-free forwards, default on, as `model.packing`) and `share_prompt` (a pair's shared
    opening runs once, default on, as `train.share_prompt`; `olingo.models.pair_prefix`).
    `loss_fn=None` means `LogSigLoss(beta=beta)`; `beta` is the preference model's inverse
    temperature and is used only by that default loss. `save_interval` counts optimizer steps;
    checkpoints go to `<save_dir>/checkpoints/`. Gradient clipping is the plugin's `max_norm`.
    """

    def __init__(
        self,
        model: Any,
        booster: Booster,
        optimizer: OptimizerWrapper,
        plugin: Plugin,
        lr_scheduler: Any,
        tokenizer: PreTrainedTokenizerBase,
        loss_fn: Callable | None = None,
        max_epochs: int = 1,
        beta: float = 0.1,
        accumulation_steps: int = 1,
        start_epoch: int = 0,
        save_interval: int = 0,
        save_dir: str | None = None,
        coordinator: DistCoordinator | None = None,
        *,
        callbacks: Sequence[Callback] = (),
        eval_interval: int = 0,
        packing: bool = True,
        share_prompt: bool = True,
    ) -> None:
        super().__init__(
            booster=booster, max_epochs=max_epochs, model=model, optimizer=optimizer, plugin=plugin,
            lr_scheduler=lr_scheduler, start_epoch=start_epoch, accumulation_steps=accumulation_steps,
            save_interval=save_interval, save_dir=save_dir, coordinator=coordinator,
            callbacks=callbacks, eval_interval=eval_interval, packing=packing,
        )
        self.tokenizer = tokenizer
        self.beta = beta
        self.share_prompt = share_prompt
        self.loss_fn = loss_fn if loss_fn is not None else LogSigLoss(beta=beta)

    def _before_fit(
        self,
        train_preference_dataloader: DataLoader | None = None,
        eval_preference_dataloader: DataLoader | None = None,
        log_dir: str | None = None,
        use_wandb: bool = False,
    ) -> None:
        self.train_dataloader = train_preference_dataloader
        self.eval_dataloader = eval_preference_dataloader

    def fit(
        self,
        train_preference_dataloader: DataLoader | None = None,
        eval_preference_dataloader: DataLoader | None = None,
        log_dir: str | None = None,
        use_wandb: bool = False,
    ) -> LoopArtifacts:
        """Train for `max_epochs`; metrics go to `log_dir` (metrics.jsonl, tb/) and W&B."""
        self._before_fit(train_preference_dataloader, eval_preference_dataloader, log_dir, use_wandb)
        return self._run(log_dir, use_wandb)

    def _forward_backward(self, batch: dict[str, torch.Tensor], loss_scale: float) -> dict[str, torch.Tensor]:
        chosen, rejected = score_pairs(self.model, batch, self.packing, self.share_prompt)
        loss = self.loss_fn(chosen, rejected)
        self.booster.backward(loss * loss_scale, self.optimizer)
        return pair_stats(chosen, rejected, loss)

    def _evaluate(self) -> dict[str, float]:
        """Pair-weighted means over the whole eval set, summed across ranks."""
        totals = torch.zeros(len(PAIR_STATS) + 1, device=self.booster.device)  # stats..., pairs
        for batch in self.eval_dataloader:
            chosen, rejected = score_pairs(self.model, self._to_device(batch), self.packing, self.share_prompt)
            stats = pair_stats(chosen, rejected, self.loss_fn(chosen, rejected))
            row = torch.stack([*(stats[name] for name in PAIR_STATS), torch.ones((), device=totals.device)])
            totals += row * chosen.shape[0]
        totals = self.plugin.all_reduce_sum(totals)
        pairs = float(totals[-1])
        return {name: float(totals[i]) / max(pairs, 1.0) for i, name in enumerate(PAIR_STATS)} | {"pairs": pairs}
