"""Callbacks: the `Callback` hooks, loop records, `dispatch`, and built-ins by name."""

from olingo.trainer.callbacks.base import Callback
from olingo.trainer.callbacks.dispatch import dispatch
from olingo.trainer.callbacks.registry import (
    CallbackError,
    build_callback,
    check_callback_spec,
    register_callback,
    registered_callbacks,
)
from olingo.trainer.callbacks.state import LogContext, LoopArtifacts, LoopState, ManifestRow

__all__ = [
    "Callback",
    "CallbackError",
    "LogContext",
    "LoopArtifacts",
    "LoopState",
    "ManifestRow",
    "build_callback",
    "check_callback_spec",
    "dispatch",
    "register_callback",
    "registered_callbacks",
]
