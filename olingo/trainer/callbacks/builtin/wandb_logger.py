"""`wandb`: a Weights & Biases run per training run; offline by default, no account needed."""

from __future__ import annotations

import logging
import os
import secrets
import string
from pathlib import Path
from typing import Any

from olingo.trainer.callbacks.base import Callback
from olingo.trainer.callbacks.builtin._common import as_number
from olingo.trainer.callbacks.registry import register_callback
from olingo.trainer.callbacks.state import LoopArtifacts, LoopState

logger = logging.getLogger("olingo.callbacks")

RUN_ID_FILE = "wandb_id.txt"


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


@register_callback("wandb")
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
    """

    def __init__(
        self,
        project: str = "olingo",
        name: str | None = None,
        group: str | None = None,
        mode: str | None = None,
        tags: list[str] | None = None,
    ) -> None:
        self.project = project
        self.name = name
        self.group = group
        self.mode = mode
        self.tags = list(tags) if tags is not None else None
        self.run: Any = None

    def on_train_start(self, state: LoopState) -> None:
        self._finish(exit_code=0)
        if not state.is_master:
            return
        import wandb

        run_dir = Path(state.output_dir) if state.output_dir is not None else None
        resuming = state.step > 0
        run_id = stable_run_id(run_dir, resuming)
        settings = {} if "WANDB_SILENT" in os.environ else {"silent": True}
        self.run = wandb.init(
            project=self.project,
            name=self.name,
            group=self.group,
            tags=self.tags,
            mode=resolve_wandb_mode(self.mode),
            dir=str(run_dir) if run_dir is not None else None,
            config=dict(state.config) if state.config else None,
            id=run_id,
            resume="allow" if resuming else None,
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
        self._finish(exit_code=1 if artifacts.error is not None else 0)

    def _log(self, step: int, metrics: dict[str, Any]) -> None:
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
