"""The loop driver every trainer shares: hook scope, due tests, optimizer-step grouping.

`SLTrainer`, `OLTrainer` and Ray's `DetachedTrainer` each run their own loop body (epochs of
micro-batches; episodes of collect-then-learn; batches from a remote buffer), inside the same
scope:

    with loop_scope(state, callbacks, save_dir, saved_rows, fit_hooks=...) as run:
        ...                                     # the loop body
    return run.artifacts

which fires `on_train_start` (and `on_fit_start` for online trainers), arms the Ctrl-C/SIGTERM
handling of `olingo.trainer.interrupt`, and always fires `on_fit_end` and `on_train_end` with
the loop's artifacts, also when the body raised; a body that a signal stopped raises
`TrainingInterrupted` once every hook has fired.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from olingo.trainer import interrupt
from olingo.trainer.callbacks import Callback, LoopArtifacts, LoopState, ManifestRow, dispatch
from olingo.trainer.loop_support import is_due, loop_artifacts, raise_if_interrupted

T = TypeVar("T")
__all__ = ["LoopRun", "is_due", "loop_scope", "optimizer_step_groups"]


@dataclass
class LoopRun:
    """What `loop_scope` hands back: the artifacts, set when the scope closes."""

    artifacts: LoopArtifacts | None = None


@contextmanager
def loop_scope(
    state: LoopState, callbacks: Sequence[Callback], save_dir: Path | None, saved_rows: Sequence[ManifestRow], *, fit_hooks: bool = False,
    stop_at: str = "optimizer step",
) -> Iterator[LoopRun]:
    """The hooks around a training loop, in a try/finally (see the module docstring).

    `callbacks` and `saved_rows` are read when the scope closes, so callbacks installed and
    checkpoints saved inside the loop are seen. `stop_at` names where the body honours a stop
    signal (`interrupt.arm`): "optimizer step", or "episode" for online RL.
    """
    run, t0, error = LoopRun(), time.time(), None
    dispatch(callbacks, "on_train_start", state)
    interrupt.arm(stop_at)
    try:
        if fit_hooks:
            dispatch(callbacks, "on_fit_start")
        try:
            yield run
        finally:
            if fit_hooks:
                dispatch(callbacks, "on_fit_end")
    except BaseException as err:
        error = err
        raise
    finally:
        interrupt.disarm()
        run.artifacts = loop_artifacts(state, save_dir, saved_rows, t0, error)
        dispatch(callbacks, "on_train_end", state, run.artifacts)
    raise_if_interrupted(state, save_dir, saved_rows)


def optimizer_step_groups(items: Iterable[T], accumulation_steps: int, total: int, start: int = 0) -> Iterator[tuple[int, list[T]]]:
    """The micro-batches of each optimizer step: `(index of the last one, the group)`.

    `items` are numbered from `start` (a resumed epoch starts after the batches it consumed)
    and `total` are in the whole pass. A group closes after every `accumulation_steps` items,
    counted from the start of the pass, and at the last item, so a pass whose length is not a
    multiple ends with one shorter group.
    """
    group: list[T] = []
    for index, item in enumerate(items, start=start):
        group.append(item)
        first = (index // accumulation_steps) * accumulation_steps
        if index - first + 1 < min(accumulation_steps, total - first):
            continue
        yield index, group
        group = []
