"""Errors a user can fix, and optional dependencies imported where they are used.

Every error meant for the person at the keyboard derives from `OlingoError`: the CLI prints it
as one line (`olingo: <message>`), without a traceback, and exits with status 2 (docs/errors.md
lists them all). Anything else is a bug in olingo or a library and keeps its traceback.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType


class OlingoError(Exception):
    """A problem with the user's input or environment; `str(err)` says what and how to fix it."""


class ModelLoadError(OlingoError, OSError):
    """A model or tokenizer path that does not exist or does not load."""


class ResumeError(OlingoError, ValueError):
    """`run.resume` names nothing that can be resumed."""


class RunIOError(OlingoError, OSError):
    """Writing into the run directory failed (disk full, permissions); the last complete
    checkpoint is kept and the message says how to resume."""


class MissingExtraError(OlingoError, ImportError):
    """A feature whose optional package is not installed."""


def _missing(top: str, feature: str) -> MissingExtraError:
    # Each optional package is installed by the olingo extra of its own name (pyproject.toml).
    return MissingExtraError(
        f"{feature} needs the optional package '{top}', which is not installed: "
        f"pip install 'olingo[{top}]' (in a checkout: make extras)"
    )


def require(module: str, feature: str) -> ModuleType:
    """Import optional `module` for `feature`, or raise a one-line `MissingExtraError` naming
    the extra to install (`pip install 'olingo[ray]'`)."""
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as err:
        if err.name is not None and err.name.split(".")[0] != top:
            raise  # the package is there but broken: its own error is the useful one
        raise _missing(top, feature) from None


def check_installed(module: str, feature: str) -> None:
    """`require` without the import (some packages take seconds to import): call it when a
    run is configured, so a missing package stops the run before anything is loaded."""
    if module in sys.modules:  # imported already (or blocked: None)
        if sys.modules[module] is None:
            raise _missing(module, feature)
        return
    if importlib.util.find_spec(module) is None:
        raise _missing(module, feature)
