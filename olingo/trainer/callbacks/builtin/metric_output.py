"""Helpers shared by the built-in callbacks: output paths, atomic rewrites, number formatting."""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from olingo.trainer.callbacks.state import LoopState


def resolve_output_path(state: LoopState, path: str) -> Path | None:
    """`path` if absolute, else `state.output_dir / path`; None when there is nowhere to write."""
    candidate = Path(path).expanduser()
    if candidate.is_absolute():
        return candidate
    if state.output_dir is None:
        return None
    return Path(state.output_dir) / candidate


def atomic_rewrite(path: Path, write: Callable[[IO[str]], None]) -> None:
    """Replace `path` with what `write` puts in a temporary file next to it.

    The temporary file is fsynced and renamed over `path`, so a crash at any moment leaves
    either the old file or the new one, never a half-written mix.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as tmp:
            write(tmp)
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def as_number(value: Any) -> float | int | None:
    """A plain python number for `value` (float, int, 0-d tensor or numpy scalar), else None."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return value
    item = getattr(value, "item", None)
    if callable(item):
        try:
            result = item()
        except (TypeError, ValueError, RuntimeError):
            return None
        return result if isinstance(result, int | float) and not isinstance(result, bool) else None
    return None


def format_number(value: float | int) -> str:
    """Compact human form: 4 significant digits, scientific for very small/large magnitudes."""
    if isinstance(value, int):
        return str(value)
    if math.isnan(value) or math.isinf(value) or value == 0:
        return str(value)
    if abs(value) < 1e-3 or abs(value) >= 1e5:
        return f"{value:.2e}"
    return f"{value:.4g}"


def short_name(key: str) -> str:
    """'train/loss' -> 'loss': the last component of a namespaced metric name."""
    return key.rsplit("/", 1)[-1]
