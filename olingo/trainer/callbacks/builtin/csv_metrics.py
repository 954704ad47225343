"""`csv_metrics`: train and eval metrics as two CSV files, for spreadsheets and pandas."""

from __future__ import annotations

import csv
import logging
import time
from pathlib import Path
from typing import IO, Any

from olingo.trainer.callbacks.base import Callback
from olingo.trainer.callbacks.builtin.metric_output import (
    as_number,
    atomic_rewrite,
    resolve_output_path,
)
from olingo.trainer.callbacks.registry import register_callback
from olingo.trainer.callbacks.state import LogContext, LoopArtifacts, LoopState, kept_on_resume

logger = logging.getLogger("olingo.callbacks")
RESULTS_FILE = "results.csv"
RESULT_COLUMNS = ["run", "arm", "group", "seed", "stage", "status", "steps", "train_seconds"]


def eval_csv_path(path: Path) -> Path:
    """'metrics.csv' -> 'metrics_eval.csv': where eval rows go beside the train file."""
    return path.with_name(f"{path.stem}_eval{path.suffix or '.csv'}")


class _CsvTable:
    """One CSV file whose header is the union of the keys seen so far, in first-seen order."""

    def __init__(self, path: Path, fixed: list[str], split: str) -> None:
        self.path = path
        self.split = split
        self.fixed = fixed
        self.header: list[str] = []
        self._fh: IO[str] | None = None
        self._writer: csv.DictWriter | None = None

    def start(self, resume_step: int) -> None:
        """Fresh file at step 0 (the old one removed); on resume keep what `kept_on_resume` keeps."""
        self.close()
        if resume_step > 0 and self.path.exists():
            header, rows = self._read()
            if header:
                self.header = header
                self._rewrite([row for row in rows if kept_on_resume(_step_of(row), self.split, resume_step)])
                return
        self.path.unlink(missing_ok=True)
        self.header = []

    def append(self, row: dict[str, Any]) -> None:
        new_keys = [key for key in row if key not in self.header]
        if new_keys or self._fh is None:
            if new_keys:
                # A metric that appears mid-run widens the header: rewrite the whole file so
                # every row keeps lining up with its column.
                _, rows = self._read() if self.path.exists() else ([], [])
                self.header = self._ordered(self.header + new_keys)
                self._rewrite(rows)
            self._open_append()
        assert self._writer is not None and self._fh is not None
        self._writer.writerow(row)
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            try:
                self._fh.close()
            finally:
                self._fh = None
                self._writer = None

    def _ordered(self, keys: list[str]) -> list[str]:
        fixed = [key for key in self.fixed if key in keys]
        return fixed + [key for key in keys if key not in self.fixed]

    def _read(self) -> tuple[list[str], list[dict[str, str]]]:
        self.close()
        with self.path.open(encoding="utf-8", newline="") as fh:
            reader = csv.DictReader(fh)
            rows = list(reader)
            return list(reader.fieldnames or []), rows

    def _rewrite(self, rows: list[dict[str, Any]]) -> None:
        self.close()

        def write(out: IO[str]) -> None:
            writer = csv.DictWriter(out, fieldnames=self.header, restval="", extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)

        atomic_rewrite(self.path, write)

    def _open_append(self) -> None:
        self.close()
        exists = self.path.exists()
        self._fh = self.path.open("a", encoding="utf-8", newline="")
        self._writer = csv.DictWriter(self._fh, fieldnames=self.header, restval="", extrasaction="ignore")
        if not exists:
            self._writer.writeheader()


def _step_of(row: dict[str, str]) -> int:
    try:
        return int(row.get("step") or 0)
    except ValueError:
        return 0


@register_callback("csv_metrics")
class CsvMetrics(Callback):
    """Write train rows to `<output_dir>/<path>` and eval rows to `<stem>_eval.csv` beside it.

    Train file columns: `step, time, <metrics...>`; eval file columns: `step, time, eval_name,
    <metrics...>`. The columns of each file are the union of the metric keys seen so far, in
    first-seen order; a key that first appears mid-run rewrites that file with the wider header
    (earlier rows get empty cells). Rows are flushed as written. On a fresh run the files are
    started anew; on a resumed run rows of steps after `state.step` are dropped (atomically).
    Only the master process writes.

    In an experiment it also writes `<experiment_dir>/results.csv`: one row per run as it ends
    (`run, arm, group, seed, stage, status, steps, train_seconds`, then its final metrics and
    benchmark metrics), for comparing arms in a spreadsheet.
    """

    def __init__(self, path: str = "metrics.csv") -> None:
        self.path = path
        self._tables: dict[str, _CsvTable] = {}
        self._results: _CsvTable | None = None

    def on_train_start(self, state: LoopState) -> None:
        self._close()
        if not state.is_master:
            return
        train_path = resolve_output_path(state, self.path)
        if train_path is None:
            logger.warning("csv_metrics: no output_dir and a relative path; nothing will be written")
            return
        train_path.parent.mkdir(parents=True, exist_ok=True)
        self._tables = {
            "train": _CsvTable(train_path, ["step", "time"], "train"),
            "eval": _CsvTable(eval_csv_path(train_path), ["step", "time", "eval_name"], "eval"),
        }
        for table in self._tables.values():
            table.start(state.step)

    def on_step_end(
        self, state: LoopState, step_idx: int, batch: Any, metrics: dict[str, float]
    ) -> None:
        self._append("train", {"step": int(step_idx), "time": time.time()}, metrics)

    def on_eval(
        self, state: LoopState, step_idx: int, eval_name: str, metrics: dict[str, float]
    ) -> None:
        self._append("eval", {"step": int(step_idx), "time": time.time(), "eval_name": eval_name}, metrics)

    def on_train_end(self, state: LoopState, artifacts: LoopArtifacts) -> None:
        self._close()

    def on_experiment_start(self, ctx: LogContext) -> None:
        if ctx.output_dir is not None:
            self._results = _CsvTable(Path(ctx.output_dir) / RESULTS_FILE, RESULT_COLUMNS, "run")
            self._results.start(0)

    def on_run_end(self, ctx: LogContext, run_result: Any, arm: Any) -> None:
        if self._results is not None:
            head = {key: getattr(arm, {"run": "name", "stage": "stage_label"}.get(key, key)) for key in RESULT_COLUMNS}
            self._results.append({**head, **arm.metrics, **arm.eval_metrics})

    def on_experiment_end(self, ctx: LogContext, result: Any) -> None:
        if self._results is not None:
            self._results.close()
            self._results = None

    def _append(self, split: str, head: dict[str, Any], metrics: dict[str, Any]) -> None:
        table = self._tables.get(split)
        if table is None:
            return
        row = dict(head)
        for key, value in metrics.items():
            if key not in row:
                number = as_number(value)
                row[key] = number if number is not None else value
        table.append(row)

    def _close(self) -> None:
        for table in self._tables.values():
            table.close()
        self._tables = {}
