"""`progress` (a tqdm bar over optimizer steps) and `print_progress` (log lines, for non-ttys;
also registered under its older name `print_metrics`)."""

from __future__ import annotations

import logging
import sys
import time
from typing import Annotated, Any

from pydantic import Field
from tqdm.auto import tqdm

from olingo.trainer.callbacks.base import Callback
from olingo.trainer.callbacks.builtin.metric_output import as_number, format_number, short_name
from olingo.trainer.callbacks.registry import checked_init, register_callback
from olingo.trainer.callbacks.state import LogContext, LoopArtifacts, LoopState

DEFAULT_KEYS = ["loss", "acc", "reward", "lr"]
SUMMARY_KEYS = ["loss", "acc", "reward", "kl", "lr"]  # the per-step line of `print_progress`
# A bare key also stands for the names the RL trainers log the same quantity under: PPO and
# GRPO log no train/loss but train/policy_loss, their mean reward as rollout/reward_mean, the
# KL to the reference as rollout/kl (PPO, GRPO's reward placement) or train/kl_loss (GRPO's
# loss placement, the KL estimate itself), and one learning rate per model (train/actor_lr).
KEY_ALIASES = {
    "loss": ("loss", "policy_loss"),
    "reward": ("reward", "reward_mean"),
    "kl": ("kl", "kl_loss"),
    "lr": ("lr", "actor_lr"),
}
EVAL_KEYS = ("accuracy", "acc", "reward", "loss")  # the eval metric the bar keeps showing: the first present
metrics_logger = logging.getLogger("olingo.metrics")


def pick_metrics(metrics: dict[str, Any], keys: list[str]) -> dict[str, float | int]:
    """The metrics named by `keys`, short-named: a key matches 'x' itself or any 'ns/x'.

    'loss' picks "train/loss"; a full name such as "rollout/reward" picks only that metric.
    A bare key with `KEY_ALIASES` falls back to its other names in order ('reward' picks
    "rollout/reward_mean" in PPO and GRPO). Keys that match nothing are skipped, so one default
    list serves SFT, RM, PPO and GRPO.
    """
    picked: dict[str, float | int] = {}
    for key in keys:
        for candidate in KEY_ALIASES.get(key, (key,)):
            number = _find(metrics, candidate)
            if number is not None:
                picked[short_name(key)] = number
                break
    return picked


def with_last_rollout(metrics: dict[str, Any], last_rollout: dict[str, Any]) -> dict[str, Any]:
    """A step's metrics with the latest `rollout/*` values it lacks. PPO and GRPO log a rollout's
    metrics once, on the row of the first optimizer step that learns on it (docs/runs.md); the
    episode's later steps learn on the same rollout, so a display keeps showing its values.
    `last_rollout` is updated in place from `metrics`."""
    last_rollout.update({k: v for k, v in metrics.items() if k.startswith("rollout/")})
    return {**metrics, **{k: v for k, v in last_rollout.items() if k not in metrics}}


def _find(metrics: dict[str, Any], key: str) -> float | int | None:
    """The first metric named `key` or ending in '/key', as a number (None: none, or not a number)."""
    for name, value in metrics.items():
        if name == key or name.endswith("/" + key):
            return as_number(value)
    return None


def headline_eval(metrics: dict[str, Any]) -> tuple[str, float | int] | None:
    """The one eval metric worth keeping in view: accuracy if present, else reward, else loss."""
    for key in EVAL_KEYS:
        for name, value in metrics.items():
            if short_name(name) == key and (number := as_number(value)) is not None:
                return name, number
    return None


def format_metrics(metrics: dict[str, float | int]) -> str:
    """'loss=0.6931 lr=1.00e-04': compact `name=value` pairs."""
    return " ".join(f"{name}={format_number(value)}" for name, value in metrics.items())


@register_callback("progress")
class ProgressBar(Callback):
    """A tqdm bar over optimizer steps with ETA and a postfix of a few metrics.

    The bar starts at `state.step`, so a resumed run shows its true position and an honest ETA.
    `keys` picks the postfix metrics (see `pick_metrics`; default loss, acc, reward, lr: in PPO
    and GRPO the policy loss, the mean rollout reward and the actor's learning rate). Each
    evaluation is printed as one line above the bar, and its headline metric (accuracy if
    present, else reward, else loss; `headline_eval`) stays at the end of the postfix until the
    next one, e.g. `eval/accuracy=0.4`. `leave` keeps the finished bar on screen.
    Only the master process draws; in a non-tty (log file, CI) tqdm still works, printing
    at most every `mininterval` seconds.
    """

    @checked_init
    def __init__(
        self,
        keys: list[str] | None = None,
        leave: bool = True,
        desc: str = "train",
        mininterval: Annotated[float, Field(ge=0)] = 1.0,
    ) -> None:
        self.keys = list(keys) if keys is not None else list(DEFAULT_KEYS)
        self.leave = leave
        self.desc = desc
        self.mininterval = mininterval
        self._bar: tqdm | None = None
        self._train_postfix = ""
        self._eval_postfix = ""  # the last evaluation's headline metric
        self._last_rollout: dict[str, Any] = {}

    def on_train_start(self, state: LoopState) -> None:
        self._close()
        self._last_rollout = {}
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
        picked = pick_metrics(with_last_rollout(metrics, self._last_rollout), self.keys)
        if picked:
            self._train_postfix = format_metrics(picked)
        self._set_postfix()
        # Track the absolute step, so a skipped hook call cannot make the bar drift.
        self._bar.update(max(int(step_idx) - self._bar.n, 0))

    def on_eval(
        self, state: LoopState, step_idx: int, eval_name: str, metrics: dict[str, float]
    ) -> None:
        if self._bar is None:
            return
        numbers = {name: n for name, value in metrics.items() if (n := as_number(value)) is not None}
        tqdm.write(f"[{eval_name} @ step {step_idx}] {format_metrics(numbers)}", file=self._bar.fp)
        headline = headline_eval(numbers)
        if headline is not None:
            self._eval_postfix = format_metrics(dict([headline]))
            self._set_postfix()

    def _set_postfix(self) -> None:
        text = " ".join(part for part in (self._train_postfix, self._eval_postfix) if part)
        if text and self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)

    def on_train_end(self, state: LoopState, artifacts: LoopArtifacts) -> None:
        self._close()

    def _close(self) -> None:
        self._train_postfix = self._eval_postfix = ""
        if self._bar is not None:
            try:
                self._bar.close()
            finally:
                self._bar = None


@register_callback("print_progress", "print_metrics")
class PrintMetrics(Callback):
    """One short line every `every` optimizer steps (and the last step), plus one per evaluation;
    in an experiment also one line per run start and end, per benchmark, and the conclusion.

    A step line holds the key metrics only, in aligned columns, and the wall time per step
    since the last line (evaluations and checkpoints excluded):

        step  4/20 | loss   -0.0123  reward     0.375  kl  1.20e-03  lr  9.50e-07  0.82s/step

    `keys` picks them (see `pick_metrics`; default loss, acc, reward, kl, lr, whichever the
    trainer logs); every metric is in the run's metrics.jsonl. An evaluation line lists all of
    its metrics, accuracy and reward first, without their `eval/` prefix. For environments
    where a progress bar is noise (batch jobs, CI logs). Lines go to the `olingo.metrics`
    logger at INFO; if logging is not configured at all, a stdout handler is attached to that
    logger so the lines are not lost. Only the master process logs.
    """

    @checked_init
    def __init__(self, every: Annotated[int, Field(ge=1)] = 1, keys: list[str] | None = None) -> None:
        self.every = every
        self.keys = list(keys) if keys is not None else list(SUMMARY_KEYS)
        self._active = False
        self._mark = 0.0  # when the last step ended (or training, an evaluation or a checkpoint did)
        self._seconds, self._steps = 0.0, 0  # step time since the last line
        self._last_rollout: dict[str, Any] = {}

    def on_train_start(self, state: LoopState) -> None:
        self._active = state.is_master
        self._last_rollout = {}
        self._mark, self._seconds, self._steps = time.perf_counter(), 0.0, 0
        if self._active:
            _ensure_handler()
        if self._active and state.step > 0:
            metrics_logger.info("resuming at step %d/%d", state.step, state.num_steps)

    def on_step_end(
        self, state: LoopState, step_idx: int, batch: Any, metrics: dict[str, float]
    ) -> None:
        if not self._active:
            return
        now = time.perf_counter()
        self._seconds, self._steps, self._mark = self._seconds + now - self._mark, self._steps + 1, now
        metrics = with_last_rollout(metrics, self._last_rollout)  # every step: a line may fall on a later step of the episode
        if step_idx % self.every and step_idx != state.num_steps:
            return
        per_step = self._seconds / self._steps
        self._seconds, self._steps = 0.0, 0
        metrics_logger.info("%s", summary_line(step_idx, state.num_steps, pick_metrics(metrics, self.keys), per_step))

    def on_eval(
        self, state: LoopState, step_idx: int, eval_name: str, metrics: dict[str, float]
    ) -> None:
        self._mark = time.perf_counter()  # the evaluation's time is not a step's
        if self._active:
            label = "eval" if eval_name == "eval" else f"eval {eval_name}"
            metrics_logger.info("%s @ step %d | %s", label, step_idx, _format_eval(metrics, eval_name))

    def on_checkpoint(self, state: LoopState, row: Any) -> None:
        self._mark = time.perf_counter()  # nor is a checkpoint's

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


def summary_line(step: int, num_steps: int, picked: dict[str, float | int], seconds_per_step: float | None = None) -> str:
    """'step  4/20 | loss   -0.0123  reward     0.375  0.82s/step': the step right-aligned to the
    width of the total and each value to the widest `format_number` form, so lines stack."""
    head = f"step {step:>{len(str(num_steps))}}/{num_steps}" if num_steps else f"step {step}"
    columns = [f"{name} {format_number(value):>9}" for name, value in picked.items()]
    if seconds_per_step is not None:
        columns.append(f"{seconds_per_step:.2f}s/step")
    return f"{head} | {'  '.join(columns)}" if columns else head


def _format_eval(metrics: dict[str, Any], eval_name: str) -> str:
    """'accuracy=0.4 reward=0.35 kl=0.0012 ...': the headline metrics first, names without
    the evaluation's own prefix (`eval/`, or the benchmark's name)."""
    first = [name for key in EVAL_KEYS for name in metrics if short_name(name) == key]
    order = dict.fromkeys([*first, *metrics])
    return _format_all({name.removeprefix(f"{eval_name}/").removeprefix("eval/"): metrics[name] for name in order})


def _format_all(metrics: dict[str, Any]) -> str:
    return " ".join(
        f"{name}={format_number(n) if (n := as_number(value)) is not None else value}"
        for name, value in metrics.items()
    )
