"""Callbacks by name: `register_callback`, `build_callback({"kind": ..., "params": {...}})`.

Parameters are validated against the callback's constructor with pydantic, so a typo in a
YAML file is an error naming the key (with a did-you-mean), not a silently ignored option.
Third-party packages add callbacks through the entry-point group `olingo.callbacks`
(`name = "package.module:ClassName"`); they are loaded on first lookup.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from typing import Any

import pydantic

from olingo.config_errors import did_you_mean
from olingo.trainer.callbacks.base import Callback

ENTRY_POINT_GROUP = "olingo.callbacks"
_REGISTRY: dict[str, type[Callback]] = {}
_entry_points_loaded = False


def register_callback(name: str) -> Callable[[type[Callback]], type[Callback]]:
    """Class decorator: make a callback buildable as `{"kind": name}`.

    A second, different class under a taken name is refused (re-registering the same class,
    e.g. on module reload, is allowed).
    """

    def decorator(cls: type[Callback]) -> type[Callback]:
        taken = _REGISTRY.get(name)
        if taken is not None and taken.__qualname__ != cls.__qualname__:
            raise ValueError(f"callback name '{name}' is already registered by {taken.__module__}.{taken.__qualname__}")
        _REGISTRY[name] = cls
        return cls

    return decorator


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in _REGISTRY:
            register_callback(ep.name)(ep.load())


def registered_callbacks() -> dict[str, type[Callback]]:
    """Name -> class for every known callback (built-ins and entry points)."""
    import olingo.trainer.callbacks.builtin  # noqa: F401 - registers the built-ins

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
