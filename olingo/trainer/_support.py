"""What every trainer loop does the same way: default loggers and callback state in checkpoints."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from olingo.trainer.callbacks import Callback


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
