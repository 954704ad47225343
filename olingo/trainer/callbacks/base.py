"""The one `Callback` class that carries every hook olingo fires.

Four families of hooks live on the same class, so one object can watch a whole experiment:

* the ten online-trainer hooks (fit, episode, make-experience, learn-epoch, learn-batch),
  fired by PPO-style trainers;
* the Ray detached-mode hooks (`olingo.ray`): the trainer fires update start/end around each
  weight sync; experience-maker actors fire loop, batch, make-experience and send hooks;
* the loop hooks of a training loop (train start/end, step end, checkpoint, eval), fired by
  every olingo trainer, supervised and online;
* the experiment hooks (experiment, group, run, benchmark eval), fired by `olingo.experiment`.

Every hook is a no-op by default, so a callback overrides only what it needs. Hooks are
synchronous. A hook that raises is logged by `dispatch` and training carries on; to end
training early call `state.request_stop()` from a loop hook.
See docs/callbacks.md for when each hook fires and in what order.
"""

from __future__ import annotations

from abc import ABC
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from olingo.trainer.callbacks.state import LogContext, LoopArtifacts, LoopState, ManifestRow


class Callback(ABC):  # noqa: B024 - abstract by convention: every hook has a default
    """Base class for olingo callbacks; override any hook, the rest stay no-ops."""

    # ---- online (RL) trainer hooks: ColossalChat's names and arguments ----------------------
    def on_fit_start(self) -> None:
        """Once, before the first episode."""

    def on_fit_end(self) -> None:
        """Once, after the last episode; fires from a `finally`, also when training raised."""

    def on_episode_start(self, episode: int) -> None:
        """Before experience collection of episode `episode` (0-based)."""

    def on_episode_end(self, episode: int) -> None:
        """After the learn phase of `episode`; fires from a `finally`."""

    def on_make_experience_start(self) -> None:
        """Before one batch of rollouts is generated and scored."""

    def on_make_experience_end(self, experience: Any) -> None:
        """After one batch of experience is made, with that `Experience`."""

    def on_learn_epoch_start(self, epoch: int) -> None:
        """Before PPO epoch `epoch` (0-based) over the experience buffer."""

    def on_learn_epoch_end(self, epoch: int) -> None:
        """After PPO epoch `epoch` over the experience buffer."""

    def on_learn_batch_start(self) -> None:
        """Before one training step on a minibatch of experience."""

    def on_learn_batch_end(self, experience: Any) -> None:
        """After one training step, with the minibatch `Experience` it used."""

    # ---- Ray detached mode (olingo.ray): trainer side ------------------------------------------
    def on_update_start(self) -> None:
        """Before the trainer pushes new weights to the experience makers."""

    def on_update_end(self) -> None:
        """After every maker has loaded the new weights."""

    # ---- Ray detached mode: experience-maker side (fired inside each maker actor) ------------
    def on_loop_start(self) -> None:
        """When a maker's working loop starts (again after a restart)."""

    def on_loop_end(self) -> None:
        """When a maker's working loop ends (stop signal, step budget, or an error)."""

    def on_batch_start(self) -> None:
        """Before a maker takes its next prompt batch."""

    def on_batch_end(self) -> None:
        """After that batch's experience was sent (or discarded because training ended)."""

    def on_send_start(self) -> None:
        """Before a maker sends a batch of experience to a trainer's buffer."""

    def on_send_end(self) -> None:
        """After the trainer accepted the batch (or refused it because training ended)."""

    # ---- loop hooks: fired by every trainer ------------------------------------------------
    def on_train_start(self, state: LoopState) -> None:
        """Once before the loop (also when resuming: `state.step` is then the resumed step)."""

    def on_train_end(self, state: LoopState, artifacts: LoopArtifacts) -> None:
        """Once after the loop and its final checkpoint; also after a crash (artifacts.error)."""

    def on_step_end(
        self, state: LoopState, step_idx: int, batch: Any, metrics: dict[str, float]
    ) -> None:
        """After optimizer step `step_idx` (1-based) and after its metrics row is written."""

    def on_checkpoint(self, state: LoopState, row: ManifestRow) -> None:
        """After a checkpoint is complete on disk and its manifest row is appended."""

    def on_eval(
        self, state: LoopState, step_idx: int, eval_name: str, metrics: dict[str, float]
    ) -> None:
        """After evaluator `eval_name` ran at step `step_idx`, with its metrics."""

    # ---- experiment hooks: fired by olingo.experiment ---------------------------------------
    def on_experiment_start(self, ctx: LogContext) -> None:
        """Once at the start of an experiment, before any arm."""

    def on_group_start(self, ctx: LogContext, group_name: str) -> None:
        """When a run group (repeats of one arm, or continual stages) is needed."""

    def on_run_start(self, ctx: LogContext) -> None:
        """Per arm, before training; `ctx.run_config` is set."""

    def on_benchmark_eval(
        self, ctx: LogContext, eval_result: Any, predictions: list[dict], *, step: int | None = None
    ) -> None:
        """Per benchmark scored: in-loop (`step` = train step) or after training (None)."""

    def on_run_end(self, ctx: LogContext, run_result: Any, arm: Any) -> None:
        """Per arm after its evals; always fires, also when the arm failed."""

    def on_experiment_end(self, ctx: LogContext, result: Any) -> None:
        """Once at the end of the experiment."""
