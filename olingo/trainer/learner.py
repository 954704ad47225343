"""The learn half of online RL: the `Learner` interface and the one learn step every loop runs.

A learner owns what is trained (models, optimizers, schedulers) and its losses. The PPO learner
(actor and critic) and the GRPO-family learner (actor only) both implement `Learner`, and
`learn_step` is the single optimizer step that the local loop (`OnlineTrainer`) and Ray's
trainer actors (`olingo.ray`) run with them:

    share = learner.step_share(micro_batches)          what each micro-batch's loss is a share of
    for each micro-batch (gradient sync on the last only):
        stats += learner.training_step(micro_batch, share, temperature, ptx batch)   backward
    metrics = learner.optimizer_step(stats)             clip, step, schedule; train/* metrics

`TrainedModel` steps, checkpoints and (for data parallelism) suspends gradient sync for one
model; the learners are built from it. Both policy losses correct for a separate engine's rollouts
with `olingo.rl.offpolicy.offpolicy_correction` (truncated importance sampling, masks).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from olingo.booster import Booster, OptimizerWrapper
from olingo.experience_maker import Experience
from olingo.models.packing import packed_shape
from olingo.trainer.checkpoint import load_trained, save_trained


@dataclass
class StepShare:
    """What one micro-batch's loss is a share of: the optimizer step it belongs to.

    `micro_batches`: how many micro-batches the step has on this rank. `units`: the step's
    loss units (tokens or responses) summed over its micro-batches and every rank, float32
    scalar, for losses normalised by the whole step (the GRPO family); None for losses that
    average per micro-batch (PPO: each loss is scaled by 1 / micro_batches)."""

    micro_batches: int
    units: torch.Tensor | None = None


class Learner(Protocol):
    """What a loop needs from the learn half (see the module docstring)."""

    ptx_coef: float  # weight of the pretraining LM loss; > 0 makes the loop draw pretrain batches
    packing: bool  # the learn forwards run padding-free (olingo.models.packing)

    def train(self) -> None: ...
    def eval(self) -> None: ...
    def no_sync(self) -> Any: ...
    def step_share(self, micro_batches: list[Experience]) -> StepShare: ...
    def training_step(
        self, experience: Experience, share: StepShare, temperature: float, ptx_batch: dict[str, Any] | None = None
    ) -> dict[str, torch.Tensor]: ...
    def optimizer_step(self, stats: list[dict[str, torch.Tensor]]) -> dict[str, float]: ...
    def save(self, directory: Path) -> None: ...
    def load(self, directory: Path) -> None: ...


def learn_step(
    learner: Learner, micro_batches: list[Experience], temperature: float, next_ptx_batch: Callable[[], Any] | None = None,
    around_micro_batch: Callable[[Experience], Any] | None = None,
) -> dict[str, float]:
    """One optimizer step on `micro_batches` (already on the learner's device): the share,
    forward/backward of each (data-parallel gradients averaged on the last only), the step.

    `temperature`: the one the rollouts were sampled at. `next_ptx_batch`: draws the pretrain
    batch of each micro-batch (None: no ptx loss). `around_micro_batch(experience)`: a context
    manager around each micro-batch (the loop's learn-batch hooks). The metrics add the step's
    `learn_forward_metrics`."""
    start = time.perf_counter()
    share = learner.step_share(micro_batches)
    stats = []
    for i, experience in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        with nullcontext() if last else learner.no_sync(), around_micro_batch(experience) if around_micro_batch else nullcontext():
            ptx_batch = next_ptx_batch() if next_ptx_batch is not None else None
            stats.append(learner.training_step(experience, share, temperature, ptx_batch))
    metrics = learner.optimizer_step(stats)
    return {**metrics, **learn_forward_metrics(micro_batches, learner.packing, time.perf_counter() - start)}


def learn_forward_metrics(micro_batches: list[Experience], packing: bool, seconds: float) -> dict[str, float]:
    """This rank's `perf/padding_fraction` of one optimizer step's policy forwards (the share of
    computed positions that are padding: packed, the rows x width `packed_shape` gives each
    micro-batch; padded, its B x L) and `perf/learn_tokens_per_s` (attended tokens / `seconds`)."""
    real = computed = 0
    for experience in micro_batches:
        lengths = experience.attention_mask.sum(-1).tolist()
        rows, width = packed_shape(lengths) if packing else experience.attention_mask.shape
        real, computed = real + sum(lengths), computed + rows * width
    return {"perf/padding_fraction": 1.0 - real / max(computed, 1), "perf/learn_tokens_per_s": real / seconds if seconds > 0 else 0.0}


def check_boosted(name: str, optim: Any) -> None:
    if not isinstance(optim, OptimizerWrapper):
        raise TypeError(f"{name}: pass the optimizer returned by booster.boost(...), not the raw torch optimizer")


class TrainedModel:
    """One trained model with its booster, optimizer and scheduler, saved under `name`."""

    name: str

    def __init__(self, booster: Booster, model: torch.nn.Module, optim: OptimizerWrapper, scheduler: Any) -> None:
        check_boosted(f"{self.name}_optim", optim)
        self.booster, self.model, self.optim, self.scheduler = booster, model, optim, scheduler

    def backward(self, loss: torch.Tensor) -> None:
        self.booster.backward(loss, self.optim)

    def step(self) -> dict[str, float]:
        """Optimizer and scheduler step; the learning rate used and the gradient norm."""
        lr = self.optim.param_groups[0]["lr"]
        self.optim.step()
        self.optim.zero_grad()
        if self.scheduler is not None:
            self.scheduler.step()
        return {f"train/{self.name}_lr": lr, f"train/{self.name}_grad_norm": self.optim.grad_norm}

    def no_sync(self) -> Any:
        return self.booster.no_sync(self.model, self.optim)

    def save(self, directory: Path) -> None:
        """`<name>/` (HF directory), its optimizer (`save_trained`) and scheduler."""
        save_trained(self.booster, directory, self.name, self.model, self.optim, f"{self.name}_optimizer")
        if self.scheduler is not None:
            self.booster.save_lr_scheduler(self.scheduler, directory / f"{self.name}_scheduler.pt")

    def load(self, directory: Path) -> None:
        """Each piece from its own file: never another model's into this one."""
        load_trained(self.booster, directory, self.name, self.model, self.optim, f"{self.name}_optimizer")
        if self.scheduler is not None:
            self.booster.load_lr_scheduler(self.scheduler, directory / f"{self.name}_scheduler.pt")
