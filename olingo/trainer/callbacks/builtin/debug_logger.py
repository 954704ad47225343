"""`debug_logger`: every hook call, in order, with a short description of its arguments.

For seeing what fires when (writing a callback, checking an order, debugging a logger): each
call becomes one event `{"hook": "on_step_end", "args": [{"step": 3}, 3, null, ["train/loss", ...]]}`
kept in `events`, logged to the `olingo.debug` logger, and appended to a JSONL file: `path`
under the experiment directory (or the run directory when used outside an experiment).
Events of hooks that fire before the directory is known are written when it is.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import IO, Annotated, Any

from pydantic import AfterValidator

from olingo.trainer.callbacks.base import Callback
from olingo.trainer.callbacks.registry import checked_init, register_callback
from olingo.trainer.callbacks.state import LogContext, LoopArtifacts, LoopState, ManifestRow

logger = logging.getLogger("olingo.debug")
HOOKS = tuple(name for name in vars(Callback) if name.startswith("on_"))


def describe(value: Any) -> Any:
    """A small JSON-able picture of a hook argument (never the tensors themselves)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, LoopState):
        return {"step": value.step}
    if isinstance(value, LogContext):
        return {"run": value.run_name, "group": value.group_name}
    if isinstance(value, ManifestRow):
        return {"checkpoint": value.name, "step": value.step}
    if isinstance(value, LoopArtifacts):
        return {"completed_steps": value.completed_steps, "stopped_early": value.stopped_early, "error": None if value.error is None else repr(value.error)}
    if isinstance(value, dict):
        return sorted(str(k) for k in value)
    if isinstance(value, list | tuple):
        return {"items": len(value)}
    if hasattr(value, "status") and hasattr(value, "name"):  # ArmResult, ExperimentResult
        return {"name": value.name, "status": value.status}
    if hasattr(value, "metrics") and hasattr(value, "name"):  # EvalResult
        return {"name": value.name, "step": getattr(value, "step", None)}
    return type(value).__name__


def level_name(level: str) -> str:
    """`level` when it names a logging level (any case: "debug", "INFO"); else a ValueError."""
    if not isinstance(logging.getLevelName(level.upper()), int):
        raise ValueError(f"unknown logging level {level!r}; use DEBUG, INFO, WARNING, ERROR or CRITICAL")
    return level


@register_callback("debug_logger")
class DebugLogger(Callback):
    """Record every hook call (see the module doc); `path=None` keeps them in memory only."""

    @checked_init
    def __init__(self, path: str | None = "hooks.jsonl", level: Annotated[str, AfterValidator(level_name)] = "DEBUG") -> None:
        self.path = path
        self.level: int = logging.getLevelName(level.upper())
        self.events: list[dict[str, Any]] = []
        self._fh: IO[str] | None = None
        self._scope: str | None = None  # "experiment" or "run": which hook opened the file
        self._written = 0

    def _record(self, hook: str, args: tuple, kwargs: dict[str, Any]) -> None:
        event = {"hook": hook, "args": [describe(a) for a in args], **{k: describe(v) for k, v in kwargs.items()}}
        self.events.append(event)
        logger.log(self.level, "%s", json.dumps(event))
        self._open_for(hook, args)
        self._flush()
        if (hook, self._scope) in (("on_experiment_end", "experiment"), ("on_train_end", "run")):
            self.close()

    def _open_for(self, hook: str, args: tuple) -> None:
        """Open the file at the first hook that names a directory: the experiment's, else the run's."""
        if self._fh is not None or self.path is None:
            return
        directory = None
        if hook == "on_experiment_start":
            directory = args[0].output_dir
        elif hook == "on_train_start" and args[0].is_master:
            directory = args[0].output_dir
        if directory is not None:
            self._scope = "experiment" if hook == "on_experiment_start" else "run"
            target = Path(self.path) if Path(self.path).is_absolute() else Path(directory) / self.path
            target.parent.mkdir(parents=True, exist_ok=True)
            self._fh = target.open("w", encoding="utf-8")

    def _flush(self) -> None:
        if self._fh is None:
            return
        for event in self.events[self._written:]:
            self._fh.write(json.dumps(event) + "\n")
        self._written = len(self.events)
        self._fh.flush()

    def close(self) -> None:
        """Close the file; a later experiment or run opens a new one."""
        if self._fh is not None:
            self._fh.close()
            self._fh, self._scope = None, None


def _recorder(hook: str) -> Any:
    def record(self: DebugLogger, *args: Any, **kwargs: Any) -> None:
        self._record(hook, args, kwargs)

    record.__name__ = record.__qualname__ = hook
    record.__doc__ = f"Record `{hook}`."
    return record


# One recording method per hook of `Callback`, so a hook added there is recorded here too.
for _hook in HOOKS:
    setattr(DebugLogger, _hook, _recorder(_hook))
