"""Reward functions by name: the registry, the built-in names, and import paths.

Naming a function (a *spec*, the keys of the config's `reward.functions: {spec: weight}`):
    "arithmetic_exact"        a registered name (`@register_reward("arithmetic_exact")`)
    "my_pkg.rewards:exact"    `exact` from module `my_pkg.rewards`, which must be importable
                              (its directory on PYTHONPATH, e.g. `PYTHONPATH=. olingo ppo ...`)
Names registered by a module of your own exist once that module is imported; naming one of its
functions by path imports it. The built-in names (`BUILTIN_REWARDS`) are import paths loaded
on first use, so this package imports none of the modules that define them: the arithmetic
task's rewards live with the task (`olingo.tasks.arithmetic`), the verifiers in
`olingo.rewards.verifiers`.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from olingo.config_errors import did_you_mean
from olingo.errors import OlingoError

F = TypeVar("F", bound=Callable[..., Any])

REWARD_FUNCTIONS: dict[str, Callable[..., Any]] = {}  # registered name -> function
# Built-in name -> the import path of its function, loaded into REWARD_FUNCTIONS on first use.
BUILTIN_REWARDS: dict[str, str] = {
    "arithmetic_exact": "olingo.tasks.arithmetic:arithmetic_exact",
    "arithmetic_format": "olingo.tasks.arithmetic:arithmetic_format",
    "math_answer": "olingo.rewards.verifiers:math_answer",
    "math_verify": "olingo.rewards.math_verify:math_verify",
    "exact_match": "olingo.rewards.verifiers:exact_match",
    "format_regex": "olingo.rewards.verifiers:format_regex",
    "length_penalty": "olingo.rewards.verifiers:length_penalty",
}
BATCHED_ATTR = "olingo_batched"
_PATH_EXAMPLE = "'package.module:function'"


class RewardError(OlingoError, ValueError):
    """A reward function that cannot be found, or that failed or returned a bad value; the
    message names the function (and the row). A ValueError, as unknown names always were."""


# ---- registry and resolution ----------------------------------------------------------------
def register_reward(name: str) -> Callable[[F], F]:
    """Decorator: register a reward function under `name` (no ':', which marks import paths)."""
    if not name or ":" in name or name != name.strip():
        raise RewardError(f"bad reward function name {name!r}: a registered name is non-empty, without ':' or surrounding spaces")

    def register(fn: F) -> F:
        taken = _builtin(name) if name in BUILTIN_REWARDS else REWARD_FUNCTIONS.get(name)
        # Re-importing (or reloading) the defining module registers the same function again.
        if taken is not None and _qualified(taken) != _qualified(fn):
            raise RewardError(f"reward function name '{name}' is taken by {_qualified(taken)}; register {_qualified(fn)} under another name")
        REWARD_FUNCTIONS[name] = fn
        return fn

    return register


def batched(fn: F) -> F:
    """Decorator: mark `fn` as the batched form whatever its parameters are called."""
    try:
        setattr(fn, BATCHED_ATTR, True)
    except (AttributeError, TypeError):  # e.g. a bound method: mark a thin wrapper instead
        return batched(_wrap(fn))  # type: ignore[return-value]
    return fn


def resolve_reward(spec: str) -> Callable[..., Any]:
    """The callable a spec names: a registered name, or 'package.module:function' (imported)."""
    if ":" in spec:
        return _import_path(spec)
    if spec in REWARD_FUNCTIONS:
        return REWARD_FUNCTIONS[spec]
    if spec in BUILTIN_REWARDS:
        return _builtin(spec)
    hint = did_you_mean(spec, registered_names())
    if not hint and "." in spec:  # 'my_pkg.rewards.exact' is a common way to mean a path
        module, _, attr = spec.rpartition(".")
        hint = f" (did you mean '{module}:{attr}'?)"
    raise RewardError(
        f"unknown reward function '{spec}'{hint}; registered: {', '.join(registered_names())}; "
        f"name a function of your own by its import path, {_PATH_EXAMPLE}"
    )


def registered_names() -> list[str]:
    """Every name a spec can use, sorted: the built-ins and those registered so far."""
    return sorted(REWARD_FUNCTIONS.keys() | BUILTIN_REWARDS.keys())


def _builtin(name: str) -> Callable[..., Any]:
    """A built-in's function, imported and registered on first use (its module never imports
    this one, so the task layer stays below the rewards)."""
    if name not in REWARD_FUNCTIONS:
        REWARD_FUNCTIONS[name] = _import_path(BUILTIN_REWARDS[name])
    return REWARD_FUNCTIONS[name]


def _import_path(spec: str) -> Callable[..., Any]:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise RewardError(f"reward function '{spec}': expected an import path {_PATH_EXAMPLE}")
    module = _import_module(spec, module_name)
    obj: Any = module
    for part in attr.split("."):  # 'module:Class.method' or 'module:instance.attr'
        if not hasattr(obj, part):
            choices = [n for n in dir(obj) if not n.startswith("_") and callable(getattr(obj, n, None))]
            raise RewardError(f"reward function '{spec}': '{module_name}' has no attribute '{attr}'{did_you_mean(part, choices)}")
        obj = getattr(obj, part)
    if inspect.isclass(obj):
        raise RewardError(f"reward function '{spec}' is a class; name a function, or an instance created at module level")
    if not callable(obj):
        raise RewardError(f"reward function '{spec}' is {type(obj).__name__}, not a function")
    return obj


def _import_module(spec: str, module_name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except Exception as err:  # not found, or its own code failed (syntax, a missing dependency)
        missing = err.name if isinstance(err, ModuleNotFoundError) else None
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise RewardError(
                f"reward function '{spec}': no module named '{missing}'; is the directory that "
                "holds it on PYTHONPATH? (e.g. `PYTHONPATH=. olingo <command> ...`)"
            ) from err
        raise RewardError(f"reward function '{spec}': importing '{module_name}' failed: {one_line(err)}") from err


def _wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return wrapper


def _qualified(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def one_line(err: BaseException) -> str:
    """An exception as 'Type: message' on one line, for error messages."""
    return f"{type(err).__name__}: {' '.join(str(err).split())}"
