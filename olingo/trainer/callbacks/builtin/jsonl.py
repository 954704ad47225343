"""`jsonl_metrics`: the run's `metrics.jsonl`, one JSON object per train step or evaluation."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import IO, Any

from olingo.errors import RunIOError
from olingo.trainer.callbacks.base import Callback
from olingo.trainer.callbacks.builtin.metric_output import (
    as_number,
    atomic_rewrite,
    resolve_output_path,
)
from olingo.trainer.callbacks.registry import register_callback
from olingo.trainer.callbacks.state import LoopArtifacts, LoopState, ManifestRow, kept_on_resume

logger = logging.getLogger("olingo.callbacks")

RESERVED_KEYS = ("step", "split", "time", "eval_name")


def read_metrics(path: str | os.PathLike[str], *, strict: bool = True) -> list[dict[str, Any]]:
    """Rows of a metrics JSONL file, in file order.

    A torn last line (the process was killed in the middle of writing it) is skipped with a
    warning. A malformed line anywhere else is an error naming the file and the line, or, with
    `strict=False`, skipped with a warning.
    """
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    rows: list[dict[str, Any]] = []
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError(f"expected a JSON object, got {type(row).__name__}")
        except ValueError as err:
            if strict and lineno != len(lines):
                raise ValueError(f"{path}:{lineno}: malformed metrics row: {err}") from None
            logger.warning("%s:%d: skipping malformed metrics row (%s)", path, lineno, err)
            continue
        rows.append(row)
    return rows


def _jsonable(value: Any) -> Any:
    """Metric values as JSON: numbers (tensors/numpy scalars unwrapped), else their str()."""
    number = as_number(value)
    if number is not None:
        return number
    if value is None or isinstance(value, str):
        return value
    return str(value)


def _row_step(row: dict[str, Any]) -> int | None:
    step = row.get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


@register_callback("jsonl_metrics")
class JsonlMetrics(Callback):
    """Append every train step and evaluation to `<output_dir>/<path>` as one JSON line.

    Rows: `{"step": int, "split": "train", "time": unix_seconds, **metrics}` after each optimizer
    step, and `{"step", "split": "eval", "time", "eval_name", **metrics}` after each evaluation
    (metric keys stay namespaced, e.g. "train/loss", "eval/acc"). Each row is flushed as it is
    written, so a crash loses nothing already logged. On a fresh run (`state.step == 0`) the
    file is started empty; on a resumed run the rows of steps after `state.step` (written by
    the killed process, about to be recomputed) are dropped by an atomic rewrite. Only the
    master process writes. `path` is relative to the run directory unless absolute.
    """

    def __init__(self, path: str = "metrics.jsonl") -> None:
        self.path = path
        self.file_path: Path | None = None
        self._fh: IO[str] | None = None

    def on_train_start(self, state: LoopState) -> None:
        self._close()
        self.file_path = None
        if not state.is_master:
            return
        target = resolve_output_path(state, self.path)
        if target is None:
            logger.warning("jsonl_metrics: no output_dir and a relative path; nothing will be written")
            return
        self.file_path = target
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            if state.step > 0 and target.exists():
                self._truncate_after(target, state.step)
                self._fh = target.open("a", encoding="utf-8")
            else:
                self._fh = target.open("w", encoding="utf-8")
        except OSError as err:
            raise RunIOError(f"could not open {target} for metrics: {err.strerror or err} (errno {err.errno})") from None

    def on_step_end(
        self, state: LoopState, step_idx: int, batch: Any, metrics: dict[str, float]
    ) -> None:
        self._write({"step": int(step_idx), "split": "train", "time": time.time()}, metrics)

    def on_eval(
        self, state: LoopState, step_idx: int, eval_name: str, metrics: dict[str, float]
    ) -> None:
        head = {"step": int(step_idx), "split": "eval", "time": time.time(), "eval_name": eval_name}
        self._write(head, metrics)

    def on_checkpoint(self, state: LoopState, row: ManifestRow) -> None:
        # A checkpoint is a promise that the run can continue from here: make the rows up to
        # it durable too, not only flushed to the OS.
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def on_train_end(self, state: LoopState, artifacts: LoopArtifacts) -> None:
        self._close()

    def _write(self, head: dict[str, Any], metrics: dict[str, Any]) -> None:
        if self._fh is None:
            return
        row = dict(head)
        for key, value in metrics.items():
            if key in RESERVED_KEYS:
                logger.warning("jsonl_metrics: metric key '%s' is reserved; dropped", key)
                continue
            row[key] = _jsonable(value)
        # One write call per complete line: a crash can tear at most the last line.
        try:
            self._fh.write(json.dumps(row) + "\n")
            self._fh.flush()
        except OSError as err:
            raise self._write_error(err) from None

    def _write_error(self, err: OSError) -> RunIOError:
        """metrics.jsonl cannot be written: let go of the file and stop the run (see dispatch)."""
        try:
            self._fh.close()
        except OSError:
            pass  # the buffered line is what failed; it is lost either way
        self._fh = None
        return RunIOError(
            f"could not write metrics to {self.file_path}: {err.strerror or err} (errno {err.errno}); "
            "the last complete checkpoint is kept: free space or fix permissions, then resume with run.resume=last"
        )

    @staticmethod
    def _truncate_after(target: Path, step: int) -> None:
        try:
            rows = read_metrics(target)
        except ValueError as err:
            # Resuming must not fail on a damaged log, nor destroy it: keep a copy, go on
            # with the rows that parse.
            backup = target.with_name(target.name + ".corrupt")
            shutil.copy2(target, backup)
            logger.error("jsonl_metrics: %s; kept a copy in %s and continuing with the readable rows", err, backup)
            rows = read_metrics(target, strict=False)
        kept = [row for row in rows if kept_on_resume(_row_step(row) or 0, str(row.get("split", "train")), step)]
        dropped = len(rows) - len(kept)
        if dropped:
            logger.info("jsonl_metrics: resuming at step %d, dropped %d rows of later steps from %s", step, dropped, target)

        def write(out: IO[str]) -> None:
            for row in kept:
                out.write(json.dumps(row) + "\n")

        atomic_rewrite(target, write)

    def _close(self) -> None:
        if self._fh is not None:
            try:
                self._fh.close()
            finally:
                self._fh = None
