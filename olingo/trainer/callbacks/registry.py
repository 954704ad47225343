"""Callbacks by name: `register_callback`, `build_callback({"kind": ..., "params": {...}})`.

Parameters are validated against the callback's constructor with pydantic, so a typo in a
YAML file is an error naming the key (with a did-you-mean), not a silently ignored option.
Third-party packages add callbacks through the entry-point group `olingo.callbacks`
(`name = "package.module:ClassName"`); they are loaded on first lookup. A name is owned by one
class: a second, different class under a taken name (built-in or not) is refused.

Built-ins that belong to a higher layer (`local_logger` writes the experiment layer's results)
are named here by module path in `_BUILTIN_MODULES` and imported on first lookup, like entry
points: the trainer layer never imports them at import time.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Mapping
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any

import pydantic

from olingo.config_errors import did_you_mean
from olingo.errors import OlingoError
from olingo.trainer.callbacks.base import Callback

logger = logging.getLogger("olingo.callbacks")
ENTRY_POINT_GROUP = "olingo.callbacks"
_REGISTRY: dict[str, type[Callback]] = {}
_entry_points_loaded = False
# Built-in callbacks defined above this layer: kind -> the module whose import registers it.
_BUILTIN_MODULES = {"local_logger": "olingo.experiment.local_logger"}


def register_callback(name: str, *aliases: str) -> Callable[[type[Callback]], type[Callback]]:
    """Class decorator: make a callback buildable as `{"kind": name}` (and as each alias).

    Aliases keep older names working (`tensorboard` for `tensorboard_logger`); they are plain
    entries for the same class. A second, different class under a taken name is refused;
    re-registering the same class (same module and name, e.g. on module reload) is allowed.
    """

    def decorator(cls: type[Callback]) -> type[Callback]:
        for key in (name, *aliases):
            taken = _REGISTRY.get(key)
            if taken is not None and not _same_class(taken, cls):
                raise ValueError(f"callback name '{key}' is already registered by {taken.__module__}.{taken.__qualname__}")
        for key in (name, *aliases):
            _REGISTRY[key] = cls
        return cls

    return decorator


def _same_class(a: type, b: type) -> bool:
    return (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


def _load_entry_points() -> None:
    """Register every `olingo.callbacks` entry point; a broken or clashing one is logged and
    skipped, so one bad package cannot make every callback unbuildable."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            register_callback(ep.name)(ep.load())
        except Exception as err:  # a third-party import can raise anything
            logger.error("callback entry point '%s = %s' skipped: %s", ep.name, ep.value, err)


def registered_callbacks() -> dict[str, type[Callback]]:
    """Name -> class for every known callback (built-ins and entry points)."""
    import olingo.trainer.callbacks.builtin  # noqa: F401 - registers the built-ins

    for module in _BUILTIN_MODULES.values():
        import_module(module)
    _load_entry_points()
    return dict(_REGISTRY)


class CallbackError(OlingoError, ValueError):
    """A callback that cannot be built as configured: an unknown kind, a misspelt or invalid
    parameter, a path that does not exist, or a constructor that refused its arguments."""


@functools.cache
def _params_model(init: Callable[..., None]) -> type[pydantic.BaseModel]:
    """A strict pydantic model mirroring the keyword parameters of a constructor `init`, their
    annotations included: `Annotated[int, Field(ge=1)]` and validators are checked too."""
    fields: dict[str, Any] = {}
    for pname, param in inspect.signature(init, eval_str=True).parameters.items():
        if pname == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = Any if param.annotation is inspect.Parameter.empty else param.annotation
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (annotation, default)
    config = pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    return pydantic.create_model(f"{init.__qualname__.split('.')[0]}Params", __config__=config, **fields)


def _one_line(err: pydantic.ValidationError) -> str:
    """"parameter 'x': <why> (got <value>)" per problem, joined by '; '."""
    parts = []
    for problem in err.errors():
        where = ".".join(str(p) for p in problem["loc"])
        message = problem["msg"].removeprefix("Value error, ")
        # A validator's own message says what is wrong with the value; a type or range error needs it shown.
        given = "" if problem["type"] in ("missing", "value_error") else f" (got {problem.get('input')!r})"
        parts.append(f"parameter '{where}': {message}{given}")
    return "; ".join(parts)


def check_params(init: Callable[..., None], params: Mapping[str, Any], label: str) -> dict[str, Any]:
    """`params` validated against the annotations of the constructor `init` (the values as pydantic
    read them); a `CallbackError` naming `label` and the first misspelt key (with a did-you-mean)
    or every bad value, on one line."""
    model = _params_model(init)
    for key in params:
        if key not in model.model_fields:
            raise CallbackError(f"{label} has no parameter '{key}'{did_you_mean(str(key), model.model_fields)}; parameters: {', '.join(model.model_fields)}")
    try:
        validated = model(**params)
    except pydantic.ValidationError as err:
        raise CallbackError(f"{label}: {_one_line(err)}") from None
    return {name: getattr(validated, name) for name in params}


def checked_init(init: Callable[..., None]) -> Callable[..., None]:
    """Decorator for a built-in callback's `__init__`: its arguments are checked against its
    annotations, as a config's `callbacks` entry is (`check_callback_spec`), so building the
    class in Python refuses the same values with the same one-line `CallbackError`."""

    @functools.wraps(init)
    def wrapper(self: Callback, *args: Any, **kwargs: Any) -> None:
        bound = inspect.signature(init).bind(self, *args, **kwargs)
        check_params(init, {k: v for k, v in bound.arguments.items() if k != "self"}, type(self).__name__)
        init(self, *args, **kwargs)

    return wrapper


def check_callback_spec(spec: Mapping[str, Any]) -> tuple[type[Callback], dict[str, Any]]:
    """The class and validated parameters of `{"kind": name, "params": {...}}`, built from
    nothing but the spec: run when a config is validated, before any model loads, so an unknown
    kind, a misspelt or out-of-range parameter or a missing path stops a run in one line
    (`CallbackError`). Nothing is constructed."""
    unknown = set(spec) - {"kind", "params"}
    if unknown:
        raise CallbackError(f"callback spec has unknown keys {sorted(unknown)}; expected 'kind' and 'params'")
    kind = spec.get("kind")
    known = registered_callbacks()
    if kind not in known:
        raise CallbackError(f"unknown callback kind '{kind}'{did_you_mean(str(kind), known)}; known: {', '.join(sorted(known))}")
    cls = known[kind]
    return cls, check_params(cls.__init__, dict(spec.get("params") or {}), f"callback '{kind}'")


def build_callback(spec: Mapping[str, Any]) -> Callback:
    """Build a callback from `{"kind": name, "params": {...}}` (checked by `check_callback_spec`).

    A constructor that raises `ValueError` or `TypeError` refused its arguments: that is the
    user's mistake, a `CallbackError` naming the callback and the constructor's message (the
    original traceback is kept as its cause, shown with --debug)."""
    cls, params = check_callback_spec(spec)
    try:
        return cls(**params)
    except OlingoError:
        raise
    except (ValueError, TypeError) as err:
        raise CallbackError(f"callback '{spec.get('kind')}' ({cls.__module__}.{cls.__qualname__}) refused its parameters: {err}") from err
