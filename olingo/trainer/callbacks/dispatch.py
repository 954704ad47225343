"""`dispatch`: call one hook on every callback; a raising callback is logged, never fatal."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from olingo.errors import RunIOError
from olingo.trainer.callbacks.base import Callback

logger = logging.getLogger("olingo.callbacks")


def dispatch(callbacks: Iterable[Callback], hook: str, *args: Any, **kwargs: Any) -> None:
    """Call `hook(*args, **kwargs)` on each callback that defines it, in list order.

    An exception in one callback is logged with its traceback and the next callback still
    runs: a logger that fails must never stop a training run (docs/callbacks.md). The one
    exception is `RunIOError` (metrics.jsonl cannot be written: disk full, permissions): going
    on would lose the run's record, so it stops the run with the last complete checkpoint.
    """
    for callback in callbacks:
        method = getattr(callback, hook, None)
        if method is None:
            continue
        try:
            method(*args, **kwargs)
        except RunIOError:
            raise  # the run's own records can no longer be written: stop, keep the last checkpoint
        except Exception:
            logger.exception("callback %s raised in %s; training continues", type(callback).__name__, hook)
