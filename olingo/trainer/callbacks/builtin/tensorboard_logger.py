"""`tensorboard_logger` (alias `tensorboard`): every metric as a TensorBoard scalar at its step."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from olingo.trainer.callbacks.base import Callback
from olingo.trainer.callbacks.builtin.metric_output import as_number, resolve_output_path
from olingo.trainer.callbacks.registry import register_callback
from olingo.trainer.callbacks.state import LogContext, LoopArtifacts, LoopState, ManifestRow

logger = logging.getLogger("olingo.callbacks")


def config_as_markdown(config: dict[str, Any]) -> str:
    """The config as an indented (code-block) JSON text, which TensorBoard's text tab renders."""
    text = json.dumps(config, indent=2, sort_keys=True, default=str)
    return "\n".join("    " + line for line in text.splitlines())


@register_callback("tensorboard_logger", "tensorboard")
class TensorBoardLogger(Callback):
    """Write each train and eval metric with `add_scalar(name, value, step)` to `<output_dir>/<log_dir>`.

    In an experiment (when it gets `on_run_start`) each run writes to its own directory
    `<experiment_dir>/<log_dir>/<run_name>`, opened at run start and closed at run end, so
    `tensorboard --logdir <experiment_dir>/tb` shows every run side by side; benchmark results
    after training are logged as `<benchmark>/<metric>` at the run's last step.

    Metric names are used as tags as they come (`train/loss`, `eval/acc`), so TensorBoard groups
    them by namespace. On a resumed run the writer is opened with `purge_step=state.step + 1`:
    TensorBoard then hides what the killed process logged for later steps. The resolved config
    is logged once as text (tag "config") on a fresh run when `log_config`. Events are flushed
    at every checkpoint and the writer is closed at train end. Only the master process writes.
    """

    def __init__(self, log_dir: str = "tb", log_config: bool = True) -> None:
        self.log_dir = log_dir
        self.log_config = log_config
        self._writer: Any = None
        self._run_scoped = False  # the experiment opened the writer for the current run
        self._last_step = 0

    def on_train_start(self, state: LoopState) -> None:
        if self._run_scoped:
            return
        self._close()
        if not state.is_master:
            return
        target = resolve_output_path(state, self.log_dir)
        if target is None:
            logger.warning("tensorboard: no output_dir and a relative log_dir; nothing will be written")
            return
        purge_step = state.step + 1 if state.step > 0 else None
        self._open(target, purge_step, state.config if state.step == 0 else None)

    def on_run_start(self, ctx: LogContext) -> None:
        self._close()
        root = Path(self.log_dir).expanduser()
        root = root if root.is_absolute() else Path(ctx.output_dir or ".") / root
        self._run_scoped, self._last_step = True, 0
        self._open(root / str(ctx.run_name), None, ctx.run_config)

    def _open(self, target: Path, purge_step: int | None, config: dict[str, Any] | None) -> None:
        # Imported here: tensorboard is slow to import and only this logger needs it.
        from torch.utils.tensorboard import SummaryWriter

        # A deep queue: with the default of 10 events, adding a step's ~25 scalars blocks the
        # training thread until tensorboard's writer thread catches up (measured: 5% of a tiny
        # PPO update). Events are still flushed every `flush_secs`, at checkpoints and at close.
        self._writer = SummaryWriter(log_dir=str(target), purge_step=purge_step, max_queue=10_000)
        if self.log_config and config:
            self._writer.add_text("config", config_as_markdown(config), global_step=0)

    def on_step_end(
        self, state: LoopState, step_idx: int, batch: Any, metrics: dict[str, float]
    ) -> None:
        self._add_scalars(step_idx, metrics)

    def on_eval(
        self, state: LoopState, step_idx: int, eval_name: str, metrics: dict[str, float]
    ) -> None:
        self._add_scalars(step_idx, metrics)

    def on_checkpoint(self, state: LoopState, row: ManifestRow) -> None:
        if self._writer is not None:
            self._writer.flush()

    def on_train_end(self, state: LoopState, artifacts: LoopArtifacts) -> None:
        if not self._run_scoped:
            self._close()

    def on_benchmark_eval(
        self, ctx: LogContext, eval_result: Any, predictions: list[dict], *, step: int | None = None
    ) -> None:
        if step is None:  # in-loop results came through on_eval already
            metrics = {f"{eval_result.name}/{k}": v for k, v in eval_result.metrics.items()}
            self._add_scalars(self._last_step, metrics)

    def on_run_end(self, ctx: LogContext, run_result: Any, arm: Any) -> None:
        self._close()
        self._run_scoped = False

    def _add_scalars(self, step: int, metrics: dict[str, Any]) -> None:
        self._last_step = max(self._last_step, int(step))
        if self._writer is None:
            return
        for name, value in metrics.items():
            number = as_number(value)
            if number is not None:
                self._writer.add_scalar(name, number, global_step=int(step))

    def _close(self) -> None:
        if self._writer is not None:
            try:
                self._writer.close()
            finally:
                self._writer = None
