"""`wandb_logger` (alias `wandb`): a Weights & Biases run per training run; offline by default."""

from __future__ import annotations

import logging
import os
import secrets
import string
from pathlib import Path
from typing import Any

from olingo.errors import check_installed, require
from olingo.trainer.callbacks.base import Callback
from olingo.trainer.callbacks.builtin.metric_output import as_number
from olingo.trainer.callbacks.registry import register_callback
from olingo.trainer.callbacks.state import LogContext, LoopArtifacts, LoopState

logger = logging.getLogger("olingo.callbacks")

RUN_ID_FILE = "wandb_id.txt"
PREDICTION_ROWS = 100  # rows of a benchmark's predictions logged as a W&B table


def resolve_wandb_mode(mode: str | None) -> str | None:
    """The `mode` to pass to `wandb.init`.

    An explicit mode wins. Otherwise "offline" (never a login prompt, nothing sent), unless the
    environment says otherwise: WANDB_MODE is then left to wandb, and WANDB_API_KEY means
    "online" (wandb's default).
    """
    if mode is not None:
        return mode
    if os.environ.get("WANDB_MODE") or os.environ.get("WANDB_API_KEY"):
        return None
    return "offline"


def new_run_id() -> str:
    """8 random lowercase letters and digits, the shape of W&B's own run ids."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def stable_run_id(run_dir: Path | None, resuming: bool) -> str:
    """The W&B run id of this run directory: reused from `wandb_id.txt` when resuming.

    A fresh run (step 0) gets a new id and records it, so that a later resume of the same
    directory continues the same W&B run.
    """
    id_file = run_dir / RUN_ID_FILE if run_dir is not None else None
    if resuming and id_file is not None and id_file.is_file():
        run_id = id_file.read_text(encoding="utf-8").strip()
        if run_id:
            return run_id
    run_id = new_run_id()
    if id_file is not None:
        id_file.parent.mkdir(parents=True, exist_ok=True)
        id_file.write_text(run_id + "\n", encoding="utf-8")
    return run_id


@register_callback("wandb_logger", "wandb")
class WandbLogger(Callback):
    """Log train and eval metrics to W&B with `step=` the optimizer step.

    `wandb` is imported only in `on_train_start`, so olingo imports without it. The run is
    created with `dir=<output_dir>` (files under `<output_dir>/wandb/`), `config=state.config`
    and the mode from `resolve_wandb_mode`: offline unless WANDB_MODE or WANDB_API_KEY is set,
    so it works without an account; sync an offline run later with `wandb sync`. Console
    messages from wandb are silenced unless WANDB_SILENT is set explicitly. The run id is kept
    in `<output_dir>/wandb_id.txt`; a resumed run (`state.step > 0`) reuses it with
    `resume="allow"` (online, W&B ignores re-logged steps it already has). `finish()` runs at
    train end with exit_code=1 after a crash. Only the master process logs. Rollout samples that
`rollout_samples` leaves in `state.extra["samples_table"]` are logged as a W&B table.

    In an experiment (when it gets `on_run_start`) there is one W&B run per experiment run,
    opened at run start and finished at run end: named after the run, grouped by the arm
    (`ctx.group_name`, else the run's own name; `group` overrides), tagged with the experiment
    name, with the stage config as its config and files under `<experiment_dir>/wandb/<run>/`.
    Benchmark results are logged with their predictions as a table; the run's final status
    and benchmark metrics go to its summary, and a failed run finishes with exit_code=1.
    """

    def __init__(
        self,
        project: str = "olingo",
        name: str | None = None,
        group: str | None = None,
        mode: str | None = None,
        tags: list[str] | None = None,
    ) -> None:
        check_installed("wandb", "W&B logging (logging.wandb=true or the wandb_logger callback)")
        self.project = project
        self.name = name
        self.group = group
        self.mode = mode
        self.tags = list(tags) if tags is not None else None
        self.run: Any = None
        self._run_scoped = False  # the experiment opened the run for the current run
        self._last_step = 0

    def on_train_start(self, state: LoopState) -> None:
        if self._run_scoped:
            return
        self._finish(exit_code=0)
        if not state.is_master:
            return
        run_dir = Path(state.output_dir) if state.output_dir is not None else None
        resuming = state.step > 0
        self._init(
            name=self.name, group=self.group, tags=self.tags, run_dir=run_dir, config=state.config,
            run_id=stable_run_id(run_dir, resuming), resume="allow" if resuming else None,
        )

    def on_run_start(self, ctx: LogContext) -> None:
        self._finish(exit_code=0)
        self._run_scoped, self._last_step = True, 0
        run_dir = Path(ctx.output_dir or ".") / "wandb" / str(ctx.run_name)
        self._init(
            name=ctx.run_name, group=self.group or ctx.group_name or ctx.run_name,
            tags=[*(self.tags or []), ctx.experiment_name], run_dir=run_dir, config=ctx.run_config,
            run_id=stable_run_id(run_dir, False), resume=None,
        )

    def _init(self, *, name: str | None, group: str | None, tags: list[str] | None, run_dir: Path | None,
              config: dict[str, Any] | None, run_id: str, resume: str | None) -> None:
        wandb = require("wandb", "W&B logging (logging.wandb=true or the wandb_logger callback)")

        settings = {} if "WANDB_SILENT" in os.environ else {"silent": True}
        self.run = wandb.init(
            project=self.project, name=name, group=group, tags=tags, mode=resolve_wandb_mode(self.mode),
            dir=str(run_dir) if run_dir is not None else None, config=dict(config) if config else None,
            id=run_id, resume=resume,
            # Our own run object, so another W&B run in this process is left alone.
            reinit="create_new",
            settings=wandb.Settings(**settings),
        )

    def on_step_end(
        self, state: LoopState, step_idx: int, batch: Any, metrics: dict[str, float]
    ) -> None:
        self._log(step_idx, metrics)
        table = state.extra.get("samples_table")
        if self.run is not None and table is not None and table["step"] == step_idx:
            import wandb

            self.run.log({"rollout/samples": wandb.Table(columns=table["columns"], data=table["rows"])}, step=int(step_idx))

    def on_eval(
        self, state: LoopState, step_idx: int, eval_name: str, metrics: dict[str, float]
    ) -> None:
        self._log(step_idx, metrics)

    def on_train_end(self, state: LoopState, artifacts: LoopArtifacts) -> None:
        if not self._run_scoped:
            self._finish(exit_code=1 if artifacts.error is not None else 0)

    def on_benchmark_eval(
        self, ctx: LogContext, eval_result: Any, predictions: list[dict], *, step: int | None = None
    ) -> None:
        if self.run is None:
            return
        import wandb

        metrics = {f"{eval_result.name}/{k}": v for k, v in eval_result.metrics.items()}
        if step is None:  # after training: at the last step, and in the summary
            self._log(self._last_step, metrics)
            self.run.summary.update(metrics)
        rows = predictions[:PREDICTION_ROWS]
        if rows:
            columns = list(rows[0])
            table = wandb.Table(columns=columns, data=[[row.get(c) for c in columns] for row in rows])
            self.run.log({f"{eval_result.name}/predictions": table}, step=self._last_step if step is None else int(step))

    def on_run_end(self, ctx: LogContext, run_result: Any, arm: Any) -> None:
        if self.run is not None:
            self.run.summary.update({"status": arm.status, "steps": arm.steps})
        self._finish(exit_code=0 if arm.status == "completed" else 1)
        self._run_scoped = False

    def _log(self, step: int, metrics: dict[str, Any]) -> None:
        self._last_step = max(self._last_step, int(step))
        if self.run is None:
            return
        numbers = {name: n for name, value in metrics.items() if (n := as_number(value)) is not None}
        if numbers:
            self.run.log(numbers, step=int(step))

    def _finish(self, exit_code: int) -> None:
        if self.run is not None:
            try:
                self.run.finish(exit_code=exit_code)
            finally:
                self.run = None
