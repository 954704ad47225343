"""`early_stopping`: stop training when a metric has stopped improving."""

# No `from __future__ import annotations` here: build_callback validates params from the
# constructor's annotations, and a string "Literal[...]" could not be resolved there.

import logging
import math
from typing import Annotated, Any, Literal

from pydantic import Field

from olingo.trainer.callbacks.base import Callback
from olingo.trainer.callbacks.registry import checked_init, register_callback
from olingo.trainer.callbacks.state import LoopState

logger = logging.getLogger("olingo.callbacks")


@register_callback("early_stopping")
class EarlyStopping(Callback):
    """Request a stop after `patience` observations of `metric` without improvement.

    What is watched:
    * `eval_name` given: the evaluations of that evaluator only (`on_eval`).
    * `eval_name` None: the first source that reports `metric` and only that one from then on,
      either an evaluator (any name) or, when `metric` is a key of the train step metrics
      (e.g. "train/loss"), the train steps (`on_step_end`), one observation per step whose row
      holds it (PPO and GRPO log `rollout/*` once per episode: one observation per rollout).
    `metric` is a metric key as logged ("eval/loss"); a name without a namespace ("loss") also
    matches "eval/<name>" in eval metrics. Train metrics match only the exact key.

    An observation improves when it beats the best so far by more than `min_delta` (lower for
    mode "min", higher for "max"); a NaN/inf never improves. After `patience` non-improving
    observations in a row, `state.request_stop()` is called and the reason logged.

    A fresh run (`state.step == 0` at `on_train_start`) starts with no best value, so one
    instance can watch every run of an experiment in turn.

    Checkpointed state (the contract trainers follow for every callback): a callback that has
    `state_dict() -> dict` (JSON-serialisable) and `load_state_dict(dict)` has its state saved in
    every checkpoint, and restored with `load_state_dict` before `on_train_start` when a run
    resumes from that checkpoint. Here that state is the best value, its step, the count of
    observations without improvement and the watched source.
    """

    @checked_init  # the annotations are the checks, with the config and in Python alike
    def __init__(
        self,
        metric: str,
        eval_name: str | None = None,
        patience: Annotated[int, Field(ge=1)] = 3,
        mode: Literal["min", "max"] = "min",
        min_delta: Annotated[float, Field(ge=0)] = 0.0,
    ) -> None:
        self.metric = metric
        self.eval_name = eval_name
        self.patience = patience
        self.mode = mode
        self.min_delta = min_delta
        self.best: float | None = None
        self.best_step: int | None = None
        self.bad_count = 0
        self.source: str | None = None  # "train" or "eval:<name>", fixed by the first observation

    # ---- hooks ----------------------------------------------------------------------------
    def on_train_start(self, state: LoopState) -> None:
        # A fresh run starts a fresh watch: one callback may serve every run of an experiment.
        # A resumed run (step > 0) keeps the state restored from its checkpoint.
        if state.step == 0:
            self.best, self.best_step, self.bad_count, self.source = None, None, 0, None

    def on_eval(
        self, state: LoopState, step_idx: int, eval_name: str, metrics: dict[str, float]
    ) -> None:
        if self.eval_name is not None and eval_name != self.eval_name:
            return
        value = self._lookup(metrics, namespace="eval")
        if value is not None:
            self._observe(state, f"eval:{eval_name}", step_idx, value)

    def on_step_end(
        self, state: LoopState, step_idx: int, batch: Any, metrics: dict[str, float]
    ) -> None:
        if self.eval_name is not None or self.metric not in metrics:
            return
        self._observe(state, "train", step_idx, float(metrics[self.metric]))

    # ---- checkpointed state ---------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What must survive a resume: best value and step, bad-observation count, source."""
        return {
            "metric": self.metric,
            "mode": self.mode,
            "best": self.best,
            "best_step": self.best_step,
            "bad_count": self.bad_count,
            "source": self.source,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (a dict saved by an older run is accepted too)."""
        if state_dict.get("metric", self.metric) != self.metric or state_dict.get("mode", self.mode) != self.mode:
            logger.warning(
                "early_stopping: checkpoint watched %s (%s), now %s (%s); starting afresh",
                state_dict.get("metric"), state_dict.get("mode"), self.metric, self.mode,
            )
            return
        best = state_dict.get("best")
        self.best = float(best) if best is not None else None
        self.best_step = state_dict.get("best_step")
        self.bad_count = int(state_dict.get("bad_count", 0))
        self.source = state_dict.get("source")

    # ---- internals ------------------------------------------------------------------------
    def _lookup(self, metrics: dict[str, Any], namespace: str) -> float | None:
        for key in (self.metric, f"{namespace}/{self.metric}"):
            if key in metrics:
                return float(metrics[key])
            if "/" in self.metric:
                break
        return None

    def _improves(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.best is None:
            return True
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def _observe(self, state: LoopState, source: str, step: int, value: float) -> None:
        if self.source is None:
            self.source = source
        elif source != self.source:
            return
        if self._improves(value):
            self.best, self.best_step, self.bad_count = value, int(step), 0
            return
        self.bad_count += 1
        if self.bad_count >= self.patience and not state.stop_requested:
            logger.info(
                "early_stopping: %s = %g at step %d; no improvement by more than %g (%s) for %d "
                "observations of %s (best %s at step %s); requesting stop",
                self.metric, value, step, self.min_delta, self.mode, self.bad_count, self.source,
                "none" if self.best is None else f"{self.best:g}", self.best_step,
            )
            state.request_stop()
