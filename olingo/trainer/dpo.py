"""`DPOTrainer`: direct preference optimisation and its variants (Rafailov et al. 2023).

One micro-batch, as the algorithm reads (the step around it: `olingo.trainer.preference`):
    1. chosen and rejected rows go through ONE policy forward, concatenated (2B rows)
    2. log pi(y|x) of each response: summed over its tokens (the loss mask), and token counts
    3. the same for the reference: precomputed columns, a frozen model, or the LoRA base
    4. per-pair loss of `loss_type` (`olingo.rl.preference.DPOLoss`) and implicit rewards
Metrics per step and on the eval set: loss, rewards/chosen, rewards/rejected, rewards/margins,
rewards/accuracies (chosen reward > rejected reward), logps/chosen, logps/rejected (summed
response log-probs of the policy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from olingo.booster import Booster, OptimizerWrapper, Plugin
from olingo.cluster import DistCoordinator
from olingo.models.lora import has_lora
from olingo.rl.preference import DPOLoss, DPOLossType, SequenceLogps
from olingo.trainer.callbacks import Callback
from olingo.trainer.preference import OfflinePreferenceTrainer, RowTerms, response_logps


def pair_inputs(batch: dict[str, torch.Tensor], mask_of: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask, token mask), each (2B, L): chosen rows, then rejected rows."""
    ids = torch.cat([batch["chosen_input_ids"], batch["rejected_input_ids"]])
    attention = torch.cat([batch["chosen_attention_mask"], batch["rejected_attention_mask"]])
    mask = torch.cat([mask_of(batch, "chosen_"), mask_of(batch, "rejected_")])
    return ids, attention, mask


def halves(x: SequenceLogps) -> tuple[SequenceLogps, SequenceLogps]:
    """Split (2B,) log-probs of a concatenated forward into chosen (B,) and rejected (B,)."""
    sums, counts = x.sums.chunk(2), x.counts.chunk(2)
    return SequenceLogps(sums[0], counts[0]), SequenceLogps(sums[1], counts[1])


def preference_stats(chosen: SequenceLogps, rejected: SequenceLogps, chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor) -> dict:
    """The TRL-named metrics of a batch of pairs, per pair."""
    return {
        "rewards/chosen": (chosen_rewards, None),
        "rewards/rejected": (rejected_rewards, None),
        "rewards/margins": (chosen_rewards - rejected_rewards, None),
        "rewards/accuracies": ((chosen_rewards > rejected_rewards).float(), None),
        "logps/chosen": (chosen.sums, None),
        "logps/rejected": (rejected.sums, None),
    }


def default_loss_type(ref_model: Any, actor: Any, label_smoothing: float) -> DPOLossType:
    """No reference model means the reference-free SimPO. A LoRA actor
    always has a reference: its base with adapters disabled."""
    if ref_model is None and not has_lora(actor):
        return "simpo"
    return "cdpo" if label_smoothing else "sigmoid"


class DPOTrainer(OfflinePreferenceTrainer):
    """Train a causal LM on chosen/rejected pairs with the DPO family's losses.

    ColossalChat-compatible signature (docs/coming-from-colossalchat.md): `gamma` is the target
    reward margin, `length_normalization` puts token-mean log-probs in the loss, `ref_model=None`
    (no LoRA) means SimPO. Keyword-only extras: `loss_type` (sigmoid | cdpo | ipo | simpo; default
    from the rule above), `label_smoothing` (cDPO), `precompute_ref_log_probs` (one reference pass
    before training, cached in `<save_dir>/cache/`, then the reference model is freed;
    `precompute_batch_size` rows at a time, default the training batch size), `callbacks`,
    `eval_interval`, `packing` (padding-free forwards, default on). With a LoRA actor and `ref_model=None` the reference is the base model with its
    adapters disabled.
    """

    reference_columns = ("ref_chosen_logps", "ref_rejected_logps")

    def __init__(
        self,
        actor: Any,
        ref_model: Any,
        booster: Booster,
        actor_optim: OptimizerWrapper,
        plugin: Plugin,
        actor_lr_scheduler: Any,
        tokenizer: Any,
        max_epochs: int = 1,
        beta: float = 0.1,
        gamma: float = 0.0,
        length_normalization: bool = False,
        apply_loss_mask: bool = True,
        accumulation_steps: int = 1,
        start_epoch: int = 0,
        save_interval: int = 0,
        save_dir: str | None = None,
        coordinator: DistCoordinator | None = None,
        *,
        loss_type: DPOLossType | None = None,
        label_smoothing: float = 0.0,
        precompute_ref_log_probs: bool = False,
        precompute_batch_size: int | None = None,
        callbacks: Sequence[Callback] = (),
        eval_interval: int = 0,
        packing: bool = True,
    ) -> None:
        loss_type = loss_type or default_loss_type(ref_model, booster.unwrap(actor), label_smoothing)
        self.loss = DPOLoss(loss_type, beta, gamma, label_smoothing, length_normalization)
        if ref_model is not None and not self.loss.needs_reference:
            raise ValueError(f"loss_type={loss_type} is reference-free: pass ref_model=None (a reference model would only use memory)")
        super().__init__(
            actor=actor, booster=booster, actor_optim=actor_optim, plugin=plugin, actor_lr_scheduler=actor_lr_scheduler,
            tokenizer=tokenizer, max_epochs=max_epochs, apply_loss_mask=apply_loss_mask, accumulation_steps=accumulation_steps,
            start_epoch=start_epoch, save_interval=save_interval, save_dir=save_dir, coordinator=coordinator,
            callbacks=callbacks, eval_interval=eval_interval, packing=packing, ref_model=ref_model, needs_reference=self.loss.needs_reference,
            precompute_ref_log_probs=precompute_ref_log_probs, precompute_batch_size=precompute_batch_size,
        )
        self.beta, self.gamma = beta, gamma

    def _terms(self, batch: dict[str, torch.Tensor]) -> RowTerms:
        ids, attention, mask = pair_inputs(batch, self._mask)
        chosen, rejected = halves(response_logps(self.model, ids, attention, mask, packing=self.packing))
        ref_chosen = ref_rejected = None
        if self.loss.needs_reference:
            ref = self._reference(batch, self.reference_columns, ids, attention, mask)
            ref_chosen, ref_rejected = halves(SequenceLogps(ref, torch.cat([chosen.counts, rejected.counts])))
        loss, chosen_rewards, rejected_rewards = self.loss(chosen, rejected, ref_chosen, ref_rejected)
        return RowTerms(loss, preference_stats(chosen.detach(), rejected.detach(), chosen_rewards, rejected_rewards))

    def _reference_values(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        ids, attention, mask = pair_inputs(batch, self._mask)
        return torch.stack(self.reference.logps(ids, attention, mask, packing=self.packing).chunk(2), dim=1)
