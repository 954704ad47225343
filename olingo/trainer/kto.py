"""`KTOTrainer`: Kahneman-Tversky optimisation on unpaired rows (Ethayarajh et al. 2024).

One optimizer step, as the algorithm reads (the shared step: `olingo.trainer.preference`):
    0. reference point z = max(0, mean over the step's mismatched pairs (prompt i with another
       row's completion) of log pi - log pi_ref), no gradient, over every micro-batch and rank
    1. per micro-batch: r = log pi(y|x) - log pi_ref(y|x) of each row's completion
    2. desirable rows lose desirable_weight (1 - sigmoid(beta (r - z))), undesirable rows
       undesirable_weight (1 - sigmoid(beta (z - r))); the step's loss is their mean
The mismatched partner of each row is fixed by the dataset (`build_unpaired_dataset`), so z, and
with it the step, does not depend on how the step is cut into micro-batches. Evaluation takes z
over the whole eval set, and never reads the training data.
Metrics: loss, kl (z), rewards/chosen and logps/chosen over desirable rows, rewards/rejected and
logps/rejected over undesirable rows (left out of a step that has none), rewards/margins.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from olingo.booster import Booster, OptimizerWrapper, Plugin
from olingo.cluster import DistCoordinator
from olingo.rl.preference import kto_loss
from olingo.trainer.callbacks import Callback
from olingo.trainer.preference import OfflinePreferenceTrainer, RowTerms, response_logps


class KTOTrainer(OfflinePreferenceTrainer):
    """Train a causal LM on completions labelled desirable or undesirable.

    ColossalChat-compatible signature (docs/coming-from-colossalchat.md); batches come from
    `UnpairedCollator` (`input_ids`, `attention_mask`, `loss_mask`, `label`, and the mismatched
    `kl_*` pair). Keyword-only extras: `precompute_ref_log_probs` (and `precompute_batch_size`), `callbacks`,
    `eval_interval`, `packing` (padding-free forwards, default on).
    With a LoRA actor and `ref_model=None` the reference is the base with adapters disabled.
    """

    reference_columns = ("ref_logps", "ref_kl_logps")

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
        desirable_weight: float = 1.0,
        undesirable_weight: float = 1.0,
        apply_loss_mask: bool = True,
        accumulation_steps: int = 1,
        start_epoch: int = 0,
        save_interval: int = 0,
        save_dir: str | None = None,
        coordinator: DistCoordinator | None = None,
        *,
        precompute_ref_log_probs: bool = False,
        precompute_batch_size: int | None = None,
        callbacks: Sequence[Callback] = (),
        eval_interval: int = 0,
        packing: bool = True,
    ) -> None:
        if beta <= 0 or desirable_weight < 0 or undesirable_weight < 0:
            raise ValueError(f"need beta > 0 and weights >= 0, got beta={beta}, desirable_weight={desirable_weight}, undesirable_weight={undesirable_weight}")
        super().__init__(
            actor=actor, booster=booster, actor_optim=actor_optim, plugin=plugin, actor_lr_scheduler=actor_lr_scheduler,
            tokenizer=tokenizer, max_epochs=max_epochs, apply_loss_mask=apply_loss_mask, accumulation_steps=accumulation_steps,
            start_epoch=start_epoch, save_interval=save_interval, save_dir=save_dir, coordinator=coordinator,
            callbacks=callbacks, eval_interval=eval_interval, packing=packing, ref_model=ref_model, needs_reference=True,
            precompute_ref_log_probs=precompute_ref_log_probs, precompute_batch_size=precompute_batch_size,
        )
        self.beta, self.desirable_weight, self.undesirable_weight = beta, desirable_weight, undesirable_weight
        self.kl = torch.zeros(())

    # ---- the reference point ---------------------------------------------------------------------
    def _reference_point(self, batches: Iterable[dict[str, torch.Tensor]]) -> torch.Tensor:
        """z = max(0, mean over rows of every rank of log pi - log pi_ref on the mismatched pairs)."""
        totals = torch.zeros(2, device=self.booster.device)
        with torch.no_grad():
            for batch in batches:
                ids, attention, mask = batch["kl_input_ids"], batch["kl_attention_mask"], self._mask(batch, "kl_")
                policy = response_logps(self.model, ids, attention, mask, packing=self.packing).sums
                reference = self._reference(batch, ("ref_kl_logps",), ids, attention, mask)
                totals += torch.stack([(policy - reference).sum(), torch.tensor(float(ids.shape[0]), device=totals.device)])
        total, rows = self.plugin.all_reduce_sum(totals).tolist()
        return torch.tensor(max(total / max(rows, 1.0), 0.0), device=self.booster.device)

    def _prepare_group(self, group: list[dict[str, Any]]) -> None:
        self.kl = self._reference_point(group)

    def _prepare_eval(self) -> None:
        self.kl = self._reference_point(self._to_device(batch) for batch in self.eval_dataloader)

    # ---- one micro-batch ---------------------------------------------------------------------------
    def _terms(self, batch: dict[str, torch.Tensor]) -> RowTerms:
        ids, attention, mask = batch["input_ids"], batch["attention_mask"], self._mask(batch)
        policy = response_logps(self.model, ids, attention, mask, packing=self.packing).sums
        reference = self._reference(batch, ("ref_logps",), ids, attention, mask)
        desirable = batch["label"].bool()
        loss = kto_loss(policy, reference, desirable, self.kl, self.beta, self.desirable_weight, self.undesirable_weight)
        rewards = self.beta * (policy.detach() - reference)
        stats = {
            "kl": (self.kl.expand_as(rewards), None),
            "rewards/chosen": (rewards, desirable),
            "rewards/rejected": (rewards, ~desirable),
            "logps/chosen": (policy.detach(), desirable),
            "logps/rejected": (policy.detach(), ~desirable),
        }
        return RowTerms(loss, stats)

    def _finish_stats(self, means: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if "rewards/chosen" in means and "rewards/rejected" in means:
            means["rewards/margins"] = means["rewards/chosen"] - means["rewards/rejected"]
        return means

    def _reference_values(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        own = self.reference.logps(batch["input_ids"], batch["attention_mask"], self._mask(batch), packing=self.packing)
        mismatched = self.reference.logps(batch["kl_input_ids"], batch["kl_attention_mask"], self._mask(batch, "kl_"), packing=self.packing)
        return torch.stack([own, mismatched], dim=1)
