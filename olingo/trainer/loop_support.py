"""What every trainer loop does the same way: default loggers, callback state in checkpoints,
and in-loop evaluators (experiment benchmarks with `run_every > 0`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from olingo.trainer import interrupt
from olingo.trainer.callbacks import Callback, LoopArtifacts, LoopState, ManifestRow, dispatch
from olingo.trainer.checkpoint import MANIFEST


@dataclass
class EvalOutput:
    """What an in-loop evaluator returns: logged metrics, the scored rows, the full record."""

    metrics: dict[str, float]  # namespaced keys as logged, e.g. "arithmetic/accuracy"
    predictions: list[dict[str, Any]] = field(default_factory=list)
    result: Any = None  # an olingo.experiment.EvalResult, handed to on_benchmark_eval


class Evaluator(Protocol):
    """Scores the live model every `every` optimizer steps (0 = never in the loop)."""

    name: str
    every: int

    def __call__(self, model: Any, tokenizer: Any, step: int) -> EvalOutput: ...


def run_evaluator(callbacks: Sequence[Callback], state: LoopState, evaluator: Evaluator) -> EvalOutput:
    """Score `state.policy` now; fire `on_eval` and, inside an experiment, `on_benchmark_eval`.

    The model is put in eval mode for the pass and given back in the mode it was in.
    """
    model = state.policy
    was_training = bool(getattr(model, "training", False))
    model.eval()
    try:
        out = evaluator(model, state.tokenizer, state.step)
    finally:
        model.train(was_training)
    dispatch(callbacks, "on_eval", state, state.step, evaluator.name, out.metrics)
    if state.ctx is not None:
        dispatch(callbacks, "on_benchmark_eval", state.ctx, out.result, out.predictions, step=state.step)
    return out


def loop_artifacts(state: LoopState, save_dir: Path | None, rows: Sequence[ManifestRow], t0: float, error: BaseException | None) -> LoopArtifacts:
    """What a finished (or crashed) loop that started at `t0` hands to `on_train_end`."""
    return LoopArtifacts(
        run_dir=state.output_dir,
        manifest_path=save_dir / MANIFEST if save_dir else None,
        checkpoints=list(rows),
        requested_steps=state.num_steps,
        completed_steps=state.step,
        train_seconds=time.time() - t0,
        stopped_early=state.stop_requested,
        error=error,
    )


def default_callbacks(run_dir: Path | None, use_wandb: bool, show_progress: bool) -> list[Callback]:
    """Metrics JSONL (first, so a row is written before other callbacks see the step),
    TensorBoard, W&B and a progress bar; the trainer installs them on rank 0 only."""
    from olingo.trainer.callbacks.builtin import (
        JsonlMetrics,
        ProgressBar,
        TensorBoardLogger,
        WandbLogger,
    )

    defaults: list[Callback] = []
    if run_dir is not None:
        defaults += [JsonlMetrics(), TensorBoardLogger()]
    if use_wandb:
        defaults.append(WandbLogger())
    if show_progress:
        defaults.append(ProgressBar())
    return defaults


def callback_states(callbacks: Sequence[Callback]) -> dict[str, Any]:
    """State of callbacks that define `state_dict()`, keyed by class and position."""
    return {
        f"{i}:{type(cb).__name__}": cb.state_dict()
        for i, cb in enumerate(callbacks)
        if callable(getattr(cb, "state_dict", None))
    }


def restore_callback_states(callbacks: Sequence[Callback], states: dict[str, Any]) -> None:
    """Give each callback the state `callback_states` saved for it (same class, same position)."""
    for i, cb in enumerate(callbacks):
        key = f"{i}:{type(cb).__name__}"
        if key in states and callable(getattr(cb, "load_state_dict", None)):
            cb.load_state_dict(states[key])


def is_due(interval: int, since: int, step: int) -> bool:
    """Whether a multiple of `interval` (0: never) lies in the optimizer steps (since, step]:
    the one test for checkpoints, evaluations and evaluators, whether a loop moves one step at
    a time or a whole episode at once."""
    return bool(interval) and step // interval > since // interval


def due_evaluators(evaluators: Sequence[Evaluator], since: int, step: int) -> list[Evaluator]:
    """Evaluators with a multiple of their `every` in the steps (since, step]."""
    return [e for e in evaluators if is_due(e.every, since, step)]


def check_stop_signal(state: LoopState, plugin: Any) -> bool:
    """After an optimizer step: when SIGINT/SIGTERM arrived (on any rank), request the stop and
    remember the signal, so the loop ends with a `step_<N>` checkpoint instead of `final`."""
    signum = interrupt.stop_requested(plugin)
    if signum is None:
        return False
    state.extra["stop_signal"] = signum
    state.request_stop()
    return True


def last_checkpoint_name(state: LoopState) -> str:
    """`final` at the end of training; `step_<N>` when a signal stopped it (it is not final)."""
    return f"step_{state.step}" if state.extra.get("stop_signal") else "final"


def raise_if_interrupted(state: LoopState, save_dir: Path | None, rows: Sequence[ManifestRow]) -> None:
    """After a loop that a signal stopped (hooks all fired): raise `TrainingInterrupted`."""
    signum = state.extra.get("stop_signal")
    if signum:
        checkpoint = save_dir / rows[-1].path if save_dir is not None and rows else None
        raise interrupt.TrainingInterrupted(signum, state.step, checkpoint)


def episode_rollout_metrics(infos: list[dict[str, float]], seconds: float, tokens: float, plugin: Any, device: Any) -> dict[str, float]:
    """An episode's experience statistics (`rollout/*`), averaged over its collect steps and over
    ranks (every rank rolls out the same number of prompts, so means of means are exact means;
    a `*_std` is the ranks' mean std), with the time spent making it and the tokens per second."""
    metrics = {f"rollout/{key}": sum(info[key] for info in infos) / len(infos) for key in infos[0]} if infos else {}
    if metrics:
        values = plugin.all_reduce_mean(torch.tensor(list(metrics.values()), dtype=torch.float64, device=device))
        metrics = dict(zip(metrics, values.tolist(), strict=True))
    metrics["time/make_experience"] = seconds
    metrics["perf/tokens_per_s"] = tokens / seconds if seconds > 0 else 0.0
    return metrics
