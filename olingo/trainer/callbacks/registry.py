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

import inspect
import logging
from collections.abc import Callable, Mapping
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any

import pydantic

from olingo.config_errors import did_you_mean
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


def _params_model(cls: type[Callback]) -> type[pydantic.BaseModel]:
    """A strict pydantic model mirroring `cls.__init__`'s keyword parameters."""
    fields: dict[str, Any] = {}
    for pname, param in inspect.signature(cls.__init__, eval_str=True).parameters.items():
        if pname == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = Any if param.annotation is inspect.Parameter.empty else param.annotation
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (annotation, default)
    config = pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    return pydantic.create_model(f"{cls.__name__}Params", __config__=config, **fields)


def build_callback(spec: Mapping[str, Any]) -> Callback:
    """Build a callback from `{"kind": name, "params": {...}}`; errors name the bad key."""
    unknown = set(spec) - {"kind", "params"}
    if unknown:
        raise ValueError(f"callback spec has unknown keys {sorted(unknown)}; expected 'kind' and 'params'")
    kind = spec.get("kind")
    known = registered_callbacks()
    if kind not in known:
        raise ValueError(f"unknown callback kind '{kind}'{did_you_mean(str(kind), known)}; known: {sorted(known)}")
    cls = known[kind]
    model = _params_model(cls)
    params = dict(spec.get("params") or {})
    for key in params:
        if key not in model.model_fields:
            raise ValueError(f"callback '{kind}' has no parameter '{key}'{did_you_mean(key, model.model_fields)}; parameters: {sorted(model.model_fields)}")
    try:
        validated = model(**params)
    except pydantic.ValidationError as err:
        raise ValueError(f"callback '{kind}': invalid params: {err}") from None
    return cls(**{name: getattr(validated, name) for name in params})
