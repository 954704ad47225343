"""The offline preference trainers' shared loop step (DPO, ORPO, KTO), on `SLTrainer`.

One optimizer step, as the algorithm reads:
    0. (KTO) estimate the step's reference point from its mismatched pairs, no gradient
    1. count the rows of the step: every micro-batch, every rank
    2. per micro-batch: ONE forward of all its sequences (chosen and rejected together),
       per-row losses, backward sum(losses) x world size / step rows
    3. clip, optimizer step, scheduler step
So the step's loss is the mean over all its rows, and batch 8 x accumulation 1, batch 2 x
accumulation 4 and 2 ranks x batch 4 compute the same gradient. Metrics are means over the rows
they concern (e.g. only desirable rows), reduced across ranks with their counts, so a batch
without such rows gives no metric rather than NaN.

A concrete trainer supplies `_terms(batch) -> RowTerms` (and the reference columns it can
precompute). Reference log-probs come from a `ReferencePolicy`: a frozen model, the policy with
its LoRA adapters disabled, or columns precomputed into the batches.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from olingo.booster import Booster, OptimizerWrapper, Plugin
from olingo.cluster import DistCoordinator
from olingo.experience_maker.scoring import chunked_head, head_log_probs
from olingo.models.lora import adapters_disabled, has_lora
from olingo.models.packing import lm_logits
from olingo.rl.logprobs import sequence_log_probs
from olingo.rl.masked import masked_sum
from olingo.rl.preference import SequenceLogps
from olingo.trainer.callbacks import Callback, LoopArtifacts
from olingo.trainer.reference_cache import (
    ReferencePrecompute,
    WithReferenceColumns,
    model_fingerprint,
)
from olingo.trainer.supervised import SLTrainer

logger = logging.getLogger("olingo.trainer")

Stat = tuple[torch.Tensor, torch.Tensor | None]  # per-row values (B,), rows it averages over (B,) bool or None = all


@dataclass
class RowTerms:
    """What one micro-batch gives: per-row losses (B,) with their gradient, and metrics as
    per-row values with the rows each is a mean over."""

    loss: torch.Tensor
    stats: dict[str, Stat] = field(default_factory=dict)


class StatSums:
    """Sums and counts of per-row metrics over micro-batches; `means` reduces them across ranks."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, torch.Tensor] = {}

    def add(self, stats: dict[str, Stat]) -> None:
        for name, (values, rows) in stats.items():
            values = values.detach().float()
            rows = torch.ones_like(values, dtype=torch.bool) if rows is None else rows.bool()
            total, count = torch.where(rows, values, 0.0).sum(), rows.sum().float()
            self.sums[name] = self.sums.get(name, 0) + total
            self.counts[name] = self.counts.get(name, 0) + count

    def means(self, plugin: Plugin) -> dict[str, torch.Tensor]:
        """Global means; a metric with no rows on any rank is left out (never NaN)."""
        names = list(self.sums)
        if not names:
            return {}
        totals = plugin.all_reduce_sum(torch.stack([*(self.sums[n] for n in names), *(self.counts[n] for n in names)]))
        sums, counts = totals[: len(names)], totals[len(names) :]
        return {n: sums[i] / counts[i] for i, n in enumerate(names) if counts[i] > 0}


def response_logps(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, mask: torch.Tensor, *, packing: bool = False,
) -> SequenceLogps:
    """log pi(y|x) of each row's masked tokens (see `sequence_log_probs`), from one forward.

    Only the positions from the first masked token of any row on get logits (`logits_to_keep`
    where the model takes it): the output head and the log-softmax over the vocabulary are the
    costliest part of a small model's forward, and the prompt needs neither. With `packing` the
    rows' attended tokens run padding-free (`olingo.models.packing`) and the logits come back in
    the padded layout, so each padded row keeps its own sums and counts (the chosen and rejected
    halves of a concatenated pair batch stay exact).
    """
    start = first_scored_position(mask)
    keep = input_ids.shape[1] - start
    head = chunked_head(model, input_ids.shape[0] * keep)
    if head is None:
        logits = lm_logits(model, input_ids, attention_mask, packing=packing, last=keep)
        return SequenceLogps(*sequence_log_probs(logits, input_ids[:, start:], mask[:, start:]))
    # A large vocabulary: the logits a chunk of tokens at a time, never whole (docs/packing.md).
    scored = mask[:, start + 1 :]
    log_probs, _ = head_log_probs(model, head, input_ids, attention_mask, keep, packing=packing, scored=scored)
    return SequenceLogps(masked_sum(log_probs, scored, dim=-1), scored.bool().sum(-1).to(torch.float32))


def first_scored_position(mask: torch.Tensor) -> int:
    """The last position before the first masked token of any row (mask: (B, L)); tokens
    before it are context only. 0 when nothing is masked."""
    columns = mask[:, 1:].bool().any(0).nonzero()
    return int(columns[0]) if len(columns) else 0


class ReferencePolicy:
    """Reference log-probs, from the frozen `model`, or (model None, policy with LoRA) from the
    policy with its adapters disabled: never a second copy of a LoRA model's weights."""

    def __init__(self, model: torch.nn.Module | None, policy: torch.nn.Module) -> None:
        if model is None and not has_lora(policy):
            raise ValueError("this loss needs a reference: pass ref_model, or train LoRA adapters (the reference is then the base with adapters disabled)")
        self.model = model.eval() if model is not None else None  # no dropout in the reference
        self.policy = policy
        self.is_policy = model is None
        self.released = False

    def logps(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, mask: torch.Tensor, *, packing: bool = False) -> torch.Tensor:
        """Summed reference log-probs (B,) of the masked tokens, without gradient (`packing`: padding-free forward)."""
        if self.released:
            raise RuntimeError("the reference model was released after precomputing its log-probs, and this batch has no precomputed column")
        with torch.no_grad():
            if self.model is not None:
                return response_logps(self.model, input_ids, attention_mask, mask, packing=packing).sums
            was_training = self.policy.training
            self.policy.eval()  # the reference has no dropout
            try:
                with adapters_disabled(self.policy):
                    return response_logps(self.policy, input_ids, attention_mask, mask, packing=packing).sums
            finally:
                self.policy.train(was_training)

    def fingerprint(self, all_reduce_sum: Callable[[torch.Tensor], torch.Tensor]) -> str:
        if self.model is not None:
            return model_fingerprint(self.model, all_reduce_sum)
        return "base-" + model_fingerprint(self.policy, all_reduce_sum, skip=lambda name: "lora_" in name)

    def release(self) -> None:
        """Drop the frozen reference model (its columns are precomputed); free its memory."""
        self.model, self.released = None, True
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class OfflinePreferenceTrainer(SLTrainer):
    """Shared by `DPOTrainer`, `ORPOTrainer` and `KTOTrainer`: the step above, evaluation with the
    same metrics on the eval set, and reference precomputation (`precompute_ref_log_probs`).
    `packing` (keyword-only, default on) runs every forward padding-free per micro-batch
    (`olingo.models.packing`): the same per-row log-probs, so the same step, float rounding aside."""

    reference_columns: tuple[str, ...] = ()  # batch columns a precomputed reference fills

    def __init__(
        self, *, actor: Any, booster: Booster, actor_optim: OptimizerWrapper, plugin: Plugin, actor_lr_scheduler: Any,
        tokenizer: Any, max_epochs: int, apply_loss_mask: bool, accumulation_steps: int, start_epoch: int,
        save_interval: int, save_dir: str | None, coordinator: DistCoordinator | None, callbacks: Sequence[Callback],
        eval_interval: int, ref_model: torch.nn.Module | None = None, needs_reference: bool = False,
        precompute_ref_log_probs: bool = False, precompute_batch_size: int | None = None, packing: bool = True,
    ) -> None:
        super().__init__(
            booster=booster, max_epochs=max_epochs, model=actor, optimizer=actor_optim, plugin=plugin,
            lr_scheduler=actor_lr_scheduler, start_epoch=start_epoch, accumulation_steps=accumulation_steps,
            save_interval=save_interval or 0, save_dir=save_dir, coordinator=coordinator, callbacks=callbacks,
            eval_interval=eval_interval, packing=packing,  # every policy and reference forward, the precomputed reference's included
        )
        self.tokenizer = tokenizer
        self.apply_loss_mask = apply_loss_mask
        self.reference = ReferencePolicy(ref_model, booster.unwrap(actor)) if needs_reference else None
        if precompute_ref_log_probs and self.reference is None:
            raise ValueError("precompute_ref_log_probs=True, but this loss uses no reference model")
        self.precompute_ref_log_probs = precompute_ref_log_probs
        self.precompute_batch_size = precompute_batch_size

    # ---- what a concrete trainer supplies --------------------------------------------------
    def _terms(self, batch: dict[str, torch.Tensor]) -> RowTerms:
        raise NotImplementedError

    def _reference_values(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """(B, len(reference_columns)) reference values of a batch, for precomputation."""
        raise NotImplementedError

    def _prepare_group(self, group: list[dict[str, Any]]) -> None:
        """Step-level work before the micro-batches' forwards (KTO's reference point)."""

    def _prepare_eval(self) -> None:
        """Eval-set-level work before the eval pass."""

    def _finish_stats(self, means: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Metrics derived from the reduced means (KTO's margin of two subsets' means)."""
        return means

    # ---- fit ---------------------------------------------------------------------------------
    def fit(
        self,
        train_preference_dataloader: DataLoader | None = None,
        eval_preference_dataloader: DataLoader | None = None,
        log_dir: str | None = None,
        use_wandb: bool = False,
    ) -> LoopArtifacts:
        """Train for `max_epochs`; metrics go to `log_dir` (metrics.jsonl, tb/) and W&B."""
        self.train_dataloader = train_preference_dataloader
        self.eval_dataloader = eval_preference_dataloader
        if self.precompute_ref_log_probs and train_preference_dataloader is not None:
            self._precompute_reference(log_dir)
        return self._run(log_dir, use_wandb)

    def _mask(self, batch: dict[str, torch.Tensor], prefix: str = "") -> torch.Tensor:
        """Which tokens count: the response's (loss mask) or, with apply_loss_mask=False, all."""
        return batch[f"{prefix}loss_mask" if self.apply_loss_mask else f"{prefix}attention_mask"]

    def _reference(
        self, batch: dict[str, torch.Tensor], columns: Sequence[str], input_ids: torch.Tensor, attention_mask: torch.Tensor, mask: torch.Tensor,
    ) -> torch.Tensor:
        """Reference log-probs of these rows (R,): the batch's precomputed `columns`, concatenated
        in order, when it has them; else a live reference forward of the inputs."""
        if columns[0] in batch:
            return torch.cat([batch[column] for column in columns])
        return self.reference.logps(input_ids, attention_mask, mask, packing=self.packing)

    # ---- the step ------------------------------------------------------------------------------
    def _train_group(self, group: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        self._prepare_group(group)
        local_rows = sum(self._rows(batch) for batch in group)
        step_rows = self.plugin.all_reduce_sum(torch.tensor(float(local_rows), device=self.booster.device))
        # DDP averages gradients over ranks, so each rank's share is scaled by the world size.
        scale = self.coordinator.world_size / step_rows.clamp(min=1)
        sums = StatSums()
        for i, batch in enumerate(group):
            last = i == len(group) - 1
            with nullcontext() if last else self.booster.no_sync(self.model, self.optimizer):
                terms = self._terms(batch)
                self.booster.backward(terms.loss.sum() * scale, self.optimizer)
            sums.add({"loss": (terms.loss, None), **terms.stats})
        return self._finish_stats(sums.means(self.plugin))

    def _rows(self, batch: dict[str, torch.Tensor]) -> int:
        return int(next(v for v in batch.values() if isinstance(v, torch.Tensor)).shape[0])

    def _evaluate(self) -> dict[str, float]:
        self._prepare_eval()
        sums = StatSums()
        for batch in self.eval_dataloader:
            terms = self._terms(self._to_device(batch))
            sums.add({"loss": (terms.loss, None), **terms.stats})
        return {name: float(value) for name, value in self._finish_stats(sums.means(self.plugin)).items()}

    # ---- precomputed reference -------------------------------------------------------------------
    def _precompute_reference(self, log_dir: str | None) -> None:
        """Reference columns for the train and eval rows (cached in `<run>/cache/`), added to
        the loaders' batches; then the frozen reference model is released."""
        run_dir = Path(log_dir) if log_dir else self.save_dir
        fingerprint = self.reference.fingerprint(self.plugin.all_reduce_sum)
        precompute = ReferencePrecompute(
            columns=self._reference_values, names=self.reference_columns,
            batch_size=self.precompute_batch_size or self.train_dataloader.batch_size,
            device=self.booster.device, rank=self.coordinator.rank, world_size=self.coordinator.world_size,
            all_reduce_sum=self.plugin.all_reduce_sum, barrier=self.coordinator.barrier,
            cache_file=run_dir / "cache" / f"reference_logps-{fingerprint}.pt" if run_dir else None,
            progress=self.show_progress,
        )
        gathered = self.booster.gathered(self.model) if self.reference.is_policy else nullcontext()
        with gathered:
            for loader in (self.train_dataloader, self.eval_dataloader):
                if loader is not None and not isinstance(loader.collate_fn, WithReferenceColumns):
                    table = precompute.table(loader.dataset, loader.collate_fn)
                    loader.collate_fn = WithReferenceColumns(loader.collate_fn, table, self.reference_columns)
        if not self.reference.is_policy:
            self.reference.release()
