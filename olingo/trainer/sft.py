"""`SFTTrainer`: supervised fine-tuning on assistant tokens.

One optimizer step, as the algorithm reads:
    1. count the assistant tokens of the step: every micro-batch, every rank
    2. per micro-batch: summed next-token NLL over assistant tokens / that count, backward
    3. clip, optimizer step, scheduler step
Dividing by the step's token count (not by each micro-batch's own) makes batch 8 x accumulation 1,
batch 2 x accumulation 4 and 2 ranks x batch 4 compute the very same gradient: the mean over all
trained tokens of the step. With `packing` (the default) each micro-batch's rows run padding-free
(`olingo.models.packing.lm_logits`): the same logits at every attended position, so the same NLL
and normalisation, float rounding aside.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch
from torch.utils.data import DataLoader

from olingo.booster import Booster, OptimizerWrapper, Plugin
from olingo.cluster import DistCoordinator
from olingo.experience_maker.scoring import lm_nll
from olingo.trainer.callbacks import Callback, LoopArtifacts
from olingo.trainer.supervised import SLTrainer


class SFTTrainer(SLTrainer):
    """Fine-tune a causal LM on conversations; the loss covers assistant tokens only.

    ColossalChat-compatible signature (docs/coming-from-colossalchat.md); `apply_loss_mask=False`
    trains on every token. Keyword-only extras: `tokenizer` (saved with every checkpoint),
    `callbacks`, `eval_interval`, `packing` (padding-free forwards, default on, as `model.packing`).
    """

    def __init__(
        self,
        model: Any,
        booster: Booster,
        optim: OptimizerWrapper,
        lr_scheduler: Any,
        max_epochs: int = 2,
        plugin: Plugin | None = None,
        accumulation_steps: int = 8,
        apply_loss_mask: bool = True,
        start_epoch: int = 0,
        save_interval: int | None = None,
        save_dir: str | None = None,
        coordinator: DistCoordinator | None = None,
        *,
        tokenizer: Any = None,
        callbacks: Sequence[Callback] = (),
        eval_interval: int = 0,
        packing: bool = True,
    ) -> None:
        super().__init__(
            booster=booster, max_epochs=max_epochs, model=model, optimizer=optim,
            plugin=plugin or booster.plugin, lr_scheduler=lr_scheduler, start_epoch=start_epoch,
            accumulation_steps=accumulation_steps, save_interval=save_interval or 0, save_dir=save_dir,
            coordinator=coordinator, callbacks=callbacks, eval_interval=eval_interval, packing=packing,
        )
        self.apply_loss_mask = apply_loss_mask
        self.tokenizer = tokenizer

    def fit(
        self,
        train_dataloader: DataLoader,
        eval_dataloader: DataLoader | None = None,
        log_dir: str | None = None,
        use_wandb: bool = False,
    ) -> LoopArtifacts:
        """Train for `max_epochs`; metrics go to `log_dir` (metrics.jsonl, tb/) and W&B."""
        self.train_dataloader = train_dataloader
        self.eval_dataloader = eval_dataloader
        return self._run(log_dir, use_wandb)

    def _mask(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return batch["loss_mask"] if self.apply_loss_mask else batch["attention_mask"]

    def _nll(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        return lm_nll(self.model, batch["input_ids"], batch["attention_mask"], self._mask(batch), packing=self.packing)

    def _train_group(self, group: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        local_tokens = torch.tensor(float(sum(int(self._mask(b)[:, 1:].sum()) for b in group)), device=self.booster.device)
        step_tokens = self.plugin.all_reduce_sum(local_tokens).clamp(min=1)
        # DDP averages gradients over ranks, so each rank's share is scaled by the world size.
        scale = self.coordinator.world_size / step_tokens
        loss = torch.zeros((), device=self.booster.device)
        for i, batch in enumerate(group):
            last = i == len(group) - 1
            with nullcontext() if last else self.booster.no_sync(self.model, self.optimizer):
                nll_sum, _ = self._nll(batch)
                self.booster.backward(nll_sum * scale, self.optimizer)
            loss += nll_sum.detach() * scale
        return {"loss": loss}  # the mean over ranks of these shares is the step's token-mean NLL

    def _evaluate(self) -> dict[str, float]:
        # float64: a long evaluation adds up more tokens than float32 counts exactly (2^24).
        totals = torch.zeros(2, dtype=torch.float64, device=self.booster.device)
        for batch in self.eval_dataloader:
            nll_sum, count = self._nll(self._to_device(batch))
            totals += torch.stack([nll_sum, count]).double()
        nll_sum, count = self.plugin.all_reduce_sum(totals).tolist()
        loss = nll_sum / max(count, 1.0)
        return {"loss": loss, "ppl": float(torch.tensor(loss).exp()), "tokens": count}
