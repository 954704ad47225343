"""`SLTrainer`: the supervised loop skeleton shared by SFT and reward-model training.

The loop, as the hooks see it (docs/callbacks.md has the full order):

    on_train_start(state)
    for epoch in start_epoch .. max_epochs-1:
        for each group of `accumulation_steps` micro-batches:
            forward + backward (loss / group size), no gradient sync until the last micro-batch
            optimizer step (grad-norm, clipping), scheduler step          -> state.step += 1
            metrics row written, on_step_end(state, step, batch, metrics)
            checkpoint when step % save_interval == 0                      -> on_checkpoint
            evaluation when step % eval_interval == 0                      -> on_eval
            in-loop evaluators when step % evaluator.every == 0            -> on_eval, on_benchmark_eval
            stop here when a callback called state.request_stop()
        evaluation at the end of the epoch                                -> on_eval
    final checkpoint                                                      -> on_checkpoint
    on_train_end(state, artifacts)     (also when training raised)

Subclasses supply `_forward_backward` (one micro-batch; or `_train_group` for a whole optimizer
step) and `_evaluate` (one eval pass); the skeleton owns counting, checkpoints, resume and hook
firing, so every trainer gets them right. Every step row also holds `perf/tokens_per_s` and
`perf/padding_fraction` (`step_perf_metrics`), read from the batches' `*attention_mask` tensors.
"""

from __future__ import annotations

import json
import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from olingo.booster import Booster, OptimizerWrapper, Plugin
from olingo.cluster import DistCoordinator
from olingo.dataset.sampler import ResumableSampler
from olingo.models.packing import packed_shape
from olingo.trainer.callbacks import Callback, LoopArtifacts, LoopState, ManifestRow, dispatch
from olingo.trainer.checkpoint import CheckpointManager, load_trained, save_trained
from olingo.trainer.loop import is_due, loop_scope, optimizer_step_groups
from olingo.trainer.loop_support import (
    Evaluator,
    callback_states,
    check_stop_signal,
    default_callbacks,
    due_evaluators,
    last_checkpoint_name,
    restore_callback_states,
    run_evaluator,
)
from olingo.trainer.utils import optimizer_steps_per_epoch, rng_state, set_rng_state

logger = logging.getLogger("olingo.trainer")

PAIR_PREFIXES = ("chosen_", "rejected_")  # pair trainers (RM, DPO, ORPO) forward these rows as one batch


def forward_masks(batch: dict[str, Any]) -> list[torch.Tensor]:
    """The attention masks (B, L) of a micro-batch's forwards: every `*attention_mask` tensor runs
    alone, except a chosen/rejected pair of one width, which runs concatenated (2B, L)."""
    masks = {key.removesuffix("attention_mask"): value for key, value in batch.items()
             if key.endswith("attention_mask") and isinstance(value, torch.Tensor)}
    chosen, rejected = (masks.get(prefix) for prefix in PAIR_PREFIXES)
    if chosen is None or rejected is None or chosen.shape[1:] != rejected.shape[1:]:
        return list(masks.values())
    rest = [mask for prefix, mask in masks.items() if prefix not in PAIR_PREFIXES]
    return [torch.cat([chosen, rejected]), *rest]


def step_perf_metrics(group: Sequence[dict[str, Any]], packing: bool, seconds: float) -> dict[str, float]:
    """`perf/tokens_per_s`: attended tokens of one optimizer step's micro-batches over its wall
    `seconds`; `perf/padding_fraction`: the share of the positions the forwards computed that
    are padding (packed: the `packed_shape` rows x width; padded: B x L). Both per rank: no
    collective for a diagnostic. Counted once per distinct input, however many models read it."""
    tokens = positions = 0
    for batch in group:
        for mask in forward_masks(batch):
            lengths = mask.sum(1).tolist()
            tokens += sum(lengths)
            positions += math.prod(packed_shape(lengths)) if packing else mask.numel()
    return {
        "perf/tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        "perf/padding_fraction": 1.0 - tokens / positions if positions else 0.0,
    }


class SLTrainer(ABC):
    """Supervised trainer base: epochs of micro-batches, accumulation, hooks, checkpoints."""

    def __init__(
        self,
        booster: Booster,
        max_epochs: int,
        model: torch.nn.Module,
        optimizer: OptimizerWrapper,
        plugin: Plugin,
        lr_scheduler: Any,
        start_epoch: int = 0,
        accumulation_steps: int = 1,
        save_interval: int = 0,
        save_dir: str | None = None,
        coordinator: DistCoordinator | None = None,
        callbacks: Sequence[Callback] = (),
        eval_interval: int = 0,
        *,
        packing: bool = True,
    ) -> None:
        if accumulation_steps < 1:
            raise ValueError("accumulation_steps must be >= 1")
        if not isinstance(optimizer, OptimizerWrapper):
            raise TypeError("pass the optimizer returned by booster.boost(...), not the raw torch optimizer")
        self.booster = booster
        self.plugin = plugin
        self.max_epochs = max_epochs
        self.model = model
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.start_epoch = start_epoch
        self.accumulation_steps = accumulation_steps
        self.save_interval = save_interval
        self.save_dir = Path(save_dir) if save_dir else None
        self.coordinator = coordinator or plugin.coordinator
        self.callbacks: list[Callback] = list(callbacks)
        self.eval_interval = eval_interval
        self.packing = packing  # padding-free forwards (olingo.models.packing); subclasses' forwards read it
        self.show_progress = True
        self.run_config: dict[str, Any] | None = None  # recorded by loggers when set
        self.tokenizer: Any = None  # saved beside the model in every checkpoint when set
        self.state = LoopState(is_master=self.coordinator.is_master)
        self.train_dataloader: DataLoader | None = None
        self.eval_dataloader: DataLoader | None = None
        self._resume_position: tuple[int, int] | None = None  # (epoch, global samples consumed)
        self._pending_callback_states: dict[str, Any] = {}
        self._saved_rows: list[ManifestRow] = []
        self._defaults_installed = False
        self.last_eval_metrics: dict[str, float] | None = None
        self.evaluators: list[Evaluator] = []  # scored on the live model every `every` steps

    # ---- what a concrete trainer supplies ------------------------------------------------
    def _forward_backward(self, batch: dict[str, torch.Tensor], loss_scale: float) -> dict[str, torch.Tensor]:
        """Forward one micro-batch, backward `loss * loss_scale`; return detached scalar stats."""
        raise NotImplementedError(f"{type(self).__name__} must define _forward_backward or _train_group")

    @abstractmethod
    def _evaluate(self) -> dict[str, float]:
        """One pass over `self.eval_dataloader`; metrics without the `eval/` prefix."""

    def add_callback(self, callback: Callback) -> None:
        self.callbacks.append(callback)

    # ---- the loop -------------------------------------------------------------------------
    def _run(self, log_dir: str | None, use_wandb: bool) -> LoopArtifacts:
        """Run the loop over `self.train_dataloader` (set by the subclass's `fit`)."""
        if self.train_dataloader is None:
            raise ValueError("fit() needs a training dataloader")
        if not isinstance(self.train_dataloader.sampler, ResumableSampler):
            raise TypeError("build dataloaders with plugin.prepare_dataloader(...) so they shard and resume")
        run_dir = Path(log_dir) if log_dir else self.save_dir
        self._install_default_callbacks(run_dir, use_wandb)
        self._restore_callback_states()
        state = self.state
        state.output_dir, state.config = run_dir, self.run_config
        state.policy, state.tokenizer = self.booster.unwrap(self.model), self.tokenizer
        state.num_steps = self.max_epochs * self._steps_per_epoch()
        first_epoch, consumed = self._resume_position or (self.start_epoch, 0)
        consumed = state.extra["batches_consumed"] = self._batches_from_samples(consumed)
        if self._resume_position is None:
            state.step = self.start_epoch * self._steps_per_epoch()
        with loop_scope(state, self.callbacks, self.save_dir, self._saved_rows) as run:
            for epoch in range(first_epoch, self.max_epochs):
                state.epoch = epoch
                self._train_epoch(epoch, consumed)
                consumed = 0
                if state.stop_requested:
                    break
                self._eval(epoch)
            self._save_checkpoint(last_checkpoint_name(state))
        return run.artifacts

    def _train_epoch(self, epoch: int, consumed: int) -> None:
        """Micro-batches of one epoch, starting after `consumed` batches (mid-epoch resume)."""
        loader = self.train_dataloader
        sampler: ResumableSampler = loader.sampler  # type: ignore[assignment]
        sampler.set_epoch(epoch, start=consumed * self._global_batch_size())
        self.model.train()
        batches = (self._to_device(batch) for batch in loader)
        for index, group in optimizer_step_groups(batches, self.accumulation_steps, self._batches_per_epoch(), start=consumed):
            # Timed from a loaded group to its logged stats: `_optimizer_step` reads them back to
            # the host, which waits for the device, so the time covers the step's real work.
            started = time.perf_counter()
            metrics = self._optimizer_step(self._train_group(group))
            metrics |= step_perf_metrics(group, self.packing, time.perf_counter() - started)
            self.state.extra["batches_consumed"] = index + 1
            self._after_step(group[-1], metrics)
            if self.state.stop_requested:
                return

    def _batches_from_samples(self, samples: int) -> int:
        """Per-rank batches that consume `samples` global samples under this run's geometry
        (a resumed run may have another world size or batch size than the one that saved)."""
        global_batch = self._global_batch_size()
        if samples % global_batch:
            logger.warning(
                "resuming after %d samples, not a multiple of the global batch %d: the next batch starts at sample %d",
                samples, global_batch, samples,
            )
        return samples // global_batch

    def _train_group(self, group: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        """Forward/backward the micro-batches of one optimizer step; mean of their stats.

        Each loss is divided by the number of micro-batches, and gradients are synchronised
        across ranks only on the last one. Trainers whose loss is a mean over a varying number
        of items per micro-batch (tokens in SFT) override this to normalise by the step's total.
        """
        stats = []
        for i, batch in enumerate(group):
            last = i == len(group) - 1
            with nullcontext() if last else self.booster.no_sync(self.model, self.optimizer):
                stats.append(self._forward_backward(batch, 1.0 / len(group)))
        return {name: torch.stack([s[name].float() for s in stats]).mean() for name in stats[0]}

    def _optimizer_step(self, stats: dict[str, torch.Tensor]) -> dict[str, float]:
        """Step optimizer and scheduler; average the step's stats over ranks."""
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.optimizer.zero_grad()
        if self.lr_scheduler is not None:
            self.lr_scheduler.step()
        self.state.step += 1
        names = list(stats)
        values = self.plugin.all_reduce_mean(torch.stack([stats[n] for n in names])).tolist()
        metrics = {f"train/{n}": v for n, v in zip(names, values, strict=True)}
        metrics["train/lr"] = lr
        metrics["train/grad_norm"] = self.optimizer.grad_norm
        return metrics

    def _after_step(self, batch: Any, metrics: dict[str, float]) -> None:
        step = self.state.step
        dispatch(self.callbacks, "on_step_end", self.state, step, batch, metrics)
        if check_stop_signal(self.state, self.plugin):
            return  # the loop ends now and checkpoints this step
        if is_due(self.save_interval, step - 1, step):
            self._save_checkpoint(f"step_{step}")
        if is_due(self.eval_interval, step - 1, step):
            self._run_eval()
        due = due_evaluators(self.evaluators, step - 1, step)
        if due:  # every rank gathers a sharded model; rank 0 alone evaluates it
            with self.booster.gathered(self.model):
                for evaluator in due if self.coordinator.is_master else ():
                    run_evaluator(self.callbacks, self.state, evaluator)

    def _eval(self, epoch: int) -> None:
        """End-of-epoch evaluation; writes `eval/epoch_<epoch>.json` in the run directory."""
        metrics = self._run_eval()
        if metrics is not None and self.state.output_dir and self.coordinator.is_master:
            out = self.state.output_dir / "eval"
            out.mkdir(parents=True, exist_ok=True)
            record = {"epoch": epoch, "step": self.state.step, "metrics": metrics}
            (out / f"epoch_{epoch}.json").write_text(json.dumps(record, indent=2) + "\n")

    def _run_eval(self) -> dict[str, float] | None:
        if self.eval_dataloader is None:
            return None
        self.model.eval()
        # Gathered: ranks may hold different numbers of evaluation batches (no padding).
        with torch.no_grad(), self.booster.gathered(self.model):
            metrics = {f"eval/{k}": v for k, v in self._evaluate().items()}
        self.model.train()
        self.last_eval_metrics = metrics
        dispatch(self.callbacks, "on_eval", self.state, self.state.step, "eval", metrics)
        return metrics

    # ---- counting ---------------------------------------------------------------------------
    def _global_batch_size(self) -> int:
        return self.train_dataloader.batch_size * self.coordinator.world_size

    def _batches_per_epoch(self) -> int:
        sampler: ResumableSampler = self.train_dataloader.sampler  # type: ignore[assignment]
        per_rank = math.ceil(sampler.num_samples / self.coordinator.world_size)
        return math.ceil(per_rank / self.train_dataloader.batch_size)

    def _steps_per_epoch(self) -> int:
        return optimizer_steps_per_epoch(self._batches_per_epoch(), self.accumulation_steps)

    def _to_device(self, batch: dict[str, Any]) -> dict[str, Any]:
        device = self.booster.device
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    # ---- checkpoints ------------------------------------------------------------------------
    def _checkpoints(self) -> CheckpointManager:
        return CheckpointManager(self.save_dir, self.coordinator)

    def _save_checkpoint(self, name: str) -> None:
        if self.save_dir is None:
            return
        state = self.state
        batches = state.extra.get("batches_consumed", 0)
        trainer_state = {
            "step": state.step,
            "epoch": state.epoch,
            "batches_consumed": batches,
            "samples_consumed": batches * self._global_batch_size(),  # valid under any world size
            "num_steps": state.num_steps,
            "callbacks": self._callback_states(),
        }
        rank = self.coordinator.rank

        def write(directory: Path) -> None:
            self._save_models(directory)
            if self.lr_scheduler is not None:
                self.booster.save_lr_scheduler(self.lr_scheduler, directory / "scheduler.pt")
            torch.save(rng_state(), directory / f"rng_rank{rank}.pt")
            if self.coordinator.is_master:
                (directory / "trainer_state.json").write_text(json.dumps(trainer_state, indent=2))

        row = self._checkpoints().save(name, state.step, state.epoch, batches, write)
        self._saved_rows.append(row)
        dispatch(self.callbacks, "on_checkpoint", state, row)

    def _save_models(self, directory: Path) -> None:
        """Write the trained model (and tokenizer, so the directory loads on its own) and its
        optimizer (see `save_trained`)."""
        save_trained(self.booster, directory, "model", self.model, self.optimizer, "optimizer")
        if self.coordinator.is_master and self.tokenizer is not None:
            self.tokenizer.save_pretrained(str(directory / "model"))

    def _load_models(self, directory: Path) -> None:
        load_trained(self.booster, directory, "model", self.model, self.optimizer, "optimizer")

    def load_checkpoint(self, directory: str | Path) -> None:
        """Restore models, optimizer, scheduler, RNG, data position and counters from a
        checkpoint directory; the next `fit` continues as if never stopped."""
        directory = Path(directory)
        trainer_state = json.loads((directory / "trainer_state.json").read_text())
        self._load_models(directory)
        if self.lr_scheduler is not None and (directory / "scheduler.pt").exists():
            self.booster.load_lr_scheduler(self.lr_scheduler, directory / "scheduler.pt")
        rng_file = directory / f"rng_rank{self.coordinator.rank}.pt"
        if not rng_file.exists():  # resumed under a larger world size: reuse rank 0's stream
            rng_file = directory / "rng_rank0.pt"
        set_rng_state(torch.load(rng_file, weights_only=False))
        self.state.step = trainer_state["step"]
        self.state.epoch = trainer_state["epoch"]
        self._resume_position = (trainer_state["epoch"], trainer_state["samples_consumed"])
        self._pending_callback_states = trainer_state.get("callbacks", {})
        logger.info("resumed from %s at step %d (epoch %d, sample %d)", directory, self.state.step, *self._resume_position)

    def _callback_states(self) -> dict[str, Any]:
        return callback_states(self.callbacks)

    def _restore_callback_states(self) -> None:
        restore_callback_states(self.callbacks, self._pending_callback_states)
        self._pending_callback_states = {}

    def _install_default_callbacks(self, run_dir: Path | None, use_wandb: bool) -> None:
        """Default loggers (see `default_callbacks`) in front of the user's, on rank 0 only."""
        if self._defaults_installed or not self.coordinator.is_master:
            return
        self._defaults_installed = True
        self.callbacks[:0] = default_callbacks(run_dir, use_wandb, self.show_progress)
