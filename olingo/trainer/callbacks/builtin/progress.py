"""`progress` (a tqdm bar over optimizer steps) and `print_progress` (log lines, for non-ttys;
also registered under its older name `print_metrics`)."""

from __future__ import annotations

import logging
import sys
from typing import Any

from tqdm.auto import tqdm

from olingo.trainer.callbacks.base import Callback
from olingo.trainer.callbacks.builtin._common import as_number, format_number, short_name
from olingo.trainer.callbacks.registry import register_callback
from olingo.trainer.callbacks.state import LogContext, LoopArtifacts, LoopState

DEFAULT_KEYS = ["loss", "acc", "reward", "lr"]
metrics_logger = logging.getLogger("olingo.metrics")


def pick_metrics(metrics: dict[str, Any], keys: list[str]) -> dict[str, float | int]:
    """The metrics named by `keys`, short-named: a key matches 'x' itself or any 'ns/x'.

    'loss' picks "train/loss"; a full name such as "rollout/reward" picks only that metric.
    Keys that match nothing are skipped, so one default list serves SFT, RM and PPO.
    """
    picked: dict[str, float | int] = {}
    for key in keys:
        for name, value in metrics.items():
            if name == key or name.endswith("/" + key):
                number = as_number(value)
                if number is not None:
                    picked[short_name(key)] = number
                break
    return picked


def format_metrics(metrics: dict[str, float | int]) -> str:
    """'loss=0.6931 lr=1.00e-04': compact `name=value` pairs."""
    return " ".join(f"{name}={format_number(value)}" for name, value in metrics.items())


@register_callback("progress")
class ProgressBar(Callback):
    """A tqdm bar over optimizer steps with ETA and a postfix of a few metrics.

    The bar starts at `state.step`, so a resumed run shows its true position and an honest ETA.
    `keys` picks the postfix metrics (see `pick_metrics`; default loss, acc, reward, lr). Each
    evaluation is printed as one line above the bar. `leave` keeps the finished bar on screen.
    Only the master process draws; in a non-tty (log file, CI) tqdm still works, printing
    at most every `mininterval` seconds.
    """

    def __init__(
        self,
        keys: list[str] | None = None,
        leave: bool = True,
        desc: str = "train",
        mininterval: float = 1.0,
    ) -> None:
        self.keys = list(keys) if keys is not None else list(DEFAULT_KEYS)
        self.leave = leave
        self.desc = desc
        self.mininterval = mininterval
        self._bar: tqdm | None = None

    def on_train_start(self, state: LoopState) -> None:
        self._close()
        if not state.is_master:
            return
        self._bar = tqdm(
            total=state.num_steps or None,
            initial=state.step,
            desc=self.desc,
            unit="step",
            leave=self.leave,
            dynamic_ncols=True,
            mininterval=self.mininterval,
        )

    def on_step_end(
        self, state: LoopState, step_idx: int, batch: Any, metrics: dict[str, float]
    ) -> None:
        if self._bar is None:
            return
        picked = pick_metrics(metrics, self.keys)
        if picked:
            self._bar.set_postfix_str(format_metrics(picked), refresh=False)
        # Track the absolute step, so a skipped hook call cannot make the bar drift.
        self._bar.update(max(int(step_idx) - self._bar.n, 0))

    def on_eval(
        self, state: LoopState, step_idx: int, eval_name: str, metrics: dict[str, float]
    ) -> None:
        if self._bar is None:
            return
        numbers = {name: n for name, value in metrics.items() if (n := as_number(value)) is not None}
        tqdm.write(f"[{eval_name} @ step {step_idx}] {format_metrics(numbers)}", file=self._bar.fp)

    def on_train_end(self, state: LoopState, artifacts: LoopArtifacts) -> None:
        self._close()

    def _close(self) -> None:
        if self._bar is not None:
            try:
                self._bar.close()
            finally:
                self._bar = None


@register_callback("print_progress", "print_metrics")
class PrintMetrics(Callback):
    """One log line every `every` optimizer steps (and the last step), plus one per evaluation;
    in an experiment also one line per run start and end, per benchmark, and the conclusion.

    For environments where a progress bar is noise (batch jobs, CI logs). Lines go to the
    `olingo.metrics` logger at INFO; if logging is not configured at all, a stdout handler is
    attached to that logger so the lines are not lost. Only the master process logs.
    """

    def __init__(self, every: int = 1) -> None:
        if every < 1:
            raise ValueError(f"print_progress: 'every' must be >= 1, got {every}")
        self.every = every
        self._active = False

    def on_train_start(self, state: LoopState) -> None:
        self._active = state.is_master
        if self._active:
            _ensure_handler()
        if self._active and state.step > 0:
            metrics_logger.info("resuming at step %d/%d", state.step, state.num_steps)

    def on_step_end(
        self, state: LoopState, step_idx: int, batch: Any, metrics: dict[str, float]
    ) -> None:
        if not self._active:
            return
        if step_idx % self.every and step_idx != state.num_steps:
            return
        total = f"/{state.num_steps}" if state.num_steps else ""
        metrics_logger.info("step %d%s | %s", step_idx, total, _format_all(metrics))

    def on_eval(
        self, state: LoopState, step_idx: int, eval_name: str, metrics: dict[str, float]
    ) -> None:
        if self._active:
            metrics_logger.info("eval %s @ step %d | %s", eval_name, step_idx, _format_all(metrics))

    # ---- experiment hooks -------------------------------------------------------------------
    def on_experiment_start(self, ctx: LogContext) -> None:
        _ensure_handler()
        metrics_logger.info("experiment %s: %d runs in %s", ctx.experiment_name, ctx.num_runs, ctx.output_dir)

    def on_run_start(self, ctx: LogContext) -> None:
        group = f" (group {ctx.group_name})" if ctx.group_name else ""
        metrics_logger.info("[%d/%d] run %s%s", ctx.run_index + 1, ctx.num_runs, ctx.run_name, group)

    def on_benchmark_eval(
        self, ctx: LogContext, eval_result: Any, predictions: list[dict], *, step: int | None = None
    ) -> None:
        if step is None:  # in-loop results were printed by on_eval already
            metrics_logger.info("benchmark %s | %s", eval_result.name, _format_all(eval_result.metrics))

    def on_run_end(self, ctx: LogContext, run_result: Any, arm: Any) -> None:
        detail = f"{arm.steps} steps in {arm.train_seconds:.1f}s"
        if arm.error:
            detail = arm.error.strip().splitlines()[-1]
        metrics_logger.info("[%d/%d] %s %s: %s", ctx.run_index + 1, ctx.num_runs, ctx.run_name, arm.status, detail)

    def on_experiment_end(self, ctx: LogContext, result: Any) -> None:
        metrics_logger.info("experiment %s %s: %s", ctx.experiment_name, result.status, result.conclusion)


def _ensure_handler() -> None:
    """A stdout handler on `olingo.metrics` when logging is not configured at all."""
    if not metrics_logger.hasHandlers():
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        metrics_logger.addHandler(handler)
        metrics_logger.setLevel(logging.INFO)


def _format_all(metrics: dict[str, Any]) -> str:
    return " ".join(
        f"{name}={format_number(n) if (n := as_number(value)) is not None else value}"
        for name, value in metrics.items()
    )
