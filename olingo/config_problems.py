"""Every problem of a config's data at once: unknown keys with a did-you-mean, then bad values,
each named with its key path and where it came from (the config file or a command-line override).

`config_problems(Model, data, origins)` is what `olingo.config.load_config` and the experiment
layer validate with; `format_problems` writes one indented line per problem. The walk over a
model's sections (`field_section`, `item_section`, `key_tree`) is shared with the `--help` text
(olingo/config_help.py).
"""

from __future__ import annotations

import copy
import functools
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import pydantic
from pydantic import BaseModel

from olingo.config_errors import KeyTree, quote_paths, sibling_hint, unknown_key_hint

__all__ = [
    "KeyPath",
    "Origins",
    "UnknownKey",
    "config_problems",
    "describe_unknown",
    "field_section",
    "format_problems",
    "item_section",
    "key_tree",
    "pop_unknown_keys",
    "value_problems",
]

M = TypeVar("M", bound=BaseModel)
KeyPath = tuple[str | int, ...]  # a key path into config data: list items have int indices


@dataclass(frozen=True)
class Origins:
    """Where the keys of a config came from, to name it in error messages: the config file
    (`file`, its data `file_data`) or a command-line override (its text, by key path)."""

    file: str | None
    file_data: Mapping[str, Any]
    overrides: tuple[tuple[tuple[str, ...], str], ...] = ()

    def _override_for(self, path: KeyPath, covering_only: bool) -> str | None:
        """The text of the last override that set `path` (or a section holding it); with
        `covering_only=False` also one that set a key below `path`."""
        keys = tuple(str(k) for k in path)
        for override_keys, text in reversed(self.overrides):
            n = len(override_keys)
            if keys[:n] == override_keys or (not covering_only and override_keys[: len(keys)] == keys):
                return text
        return None

    def _file_value(self, path: KeyPath) -> Any:
        node: Any = self.file_data
        for key in path:
            if isinstance(node, dict) and key in node:
                node = node[key]
            elif isinstance(node, list) and isinstance(key, int) and key < len(node):
                node = node[key]
            else:
                return None
        return node

    def of_key(self, path: KeyPath) -> str:
        """' from the command line 'x=1'' or ' in the config file f.yaml' for the key at `path`."""
        text = self._override_for(path, covering_only=False)
        if text is not None:
            return f" from the command line '{text}'"
        return f" in the config file {self.file}" if self.file else ""

    def of_value(self, path: KeyPath) -> str:
        """Where the value at `path` came from; '' for a default or a whole section."""
        text = self._override_for(path, covering_only=True)
        if text is not None:
            return f" from the command line '{text}'"
        value = self._file_value(path)
        return f" in the config file {self.file}" if self.file and value is not None and not isinstance(value, dict) else ""


# ---- the model tree -----------------------------------------------------------------------------
def _unwrap_optional(annotation: Any) -> Any:
    """`X | None` -> X; anything else unchanged."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def field_section(annotation: Any) -> type[BaseModel] | None:
    """The config section a field holds (`X` or `X | None` with X a model), else None."""
    annotation = _unwrap_optional(annotation)
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def item_section(annotation: Any) -> type[BaseModel] | None:
    """The model of each item of a `list[X]` field (callbacks, benchmarks), else None."""
    annotation = _unwrap_optional(annotation)
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation) or (None,)
        return field_section(item)
    return None


@functools.cache
def key_tree(model: type[BaseModel]) -> KeyTree:
    """The sections and keys of `model`, for did-you-mean."""
    return {name: (key_tree(sub) if (sub := field_section(f.annotation)) else None) for name, f in model.model_fields.items()}


@dataclass(frozen=True)
class UnknownKey:
    """A key of the data that `model` does not have: `rest` (one key, or the leaves below an
    unknown section) found in section `at`."""

    at: KeyPath
    rest: tuple[str, ...]


def _leaves(value: Any, prefix: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    if isinstance(value, dict) and value:
        for key, sub in value.items():
            yield from _leaves(sub, (*prefix, str(key)))
    else:
        yield prefix


def _unknown_in(section: type[BaseModel], key: str, value: Any, at: KeyPath) -> list[UnknownKey]:
    """One unknown key; an unknown section that is no sibling's typo, or holds one value, is
    split into its leaves, so each gets its own hint (PPO's `train: {lr, kl_coef}` ->
    `actor_optim.lr`, `experience.kl_coef`; `trian.lr` -> `train.lr`)."""
    leaves = list(_leaves(value, (key,)))
    if len(leaves) > 1 and sibling_hint((key,), key_tree(section)) is not None:
        return [UnknownKey(at, (key,))]
    return [UnknownKey(at, rest) for rest in leaves]


def pop_unknown_keys(model: type[BaseModel], data: dict[str, Any], at: KeyPath = ()) -> list[UnknownKey]:
    """Every key of `data` that `model` lacks, removed from `data` (so that validating the
    rest reports every other problem too), sections and list items included."""
    found: list[UnknownKey] = []
    for key in list(data):
        field = model.model_fields.get(key)
        if field is None:
            found += _unknown_in(model, str(key), data.pop(key), at)
            continue
        value, section, item = data[key], field_section(field.annotation), item_section(field.annotation)
        if section is not None and isinstance(value, dict):
            found += pop_unknown_keys(section, value, (*at, key))
        elif item is not None and isinstance(value, list):
            for i, entry in enumerate(value):
                if isinstance(entry, dict):
                    found += pop_unknown_keys(item, entry, (*at, key, i))
    return found


def _section_at(model: type[BaseModel], at: KeyPath) -> type[BaseModel]:
    """The model of the section at `at`, a path `pop_unknown_keys` went down (list indices skipped)."""
    for key in at:
        if not isinstance(key, int):
            annotation = model.model_fields[key].annotation
            model = field_section(annotation) or item_section(annotation) or model
    return model


def describe_unknown(model: type[BaseModel], unknown: UnknownKey, origins: Origins | None) -> tuple[KeyPath, str]:
    """(section, message) for an unknown key: its best guess (see `unknown_key_hint`) and
    where it came from. A key that belongs in another section is reported from the top, with
    both paths written in full: `(top level): unknown key 'ppo.lr' (did you mean 'actor_optim.lr'
    or 'critic_optim.lr'?)`."""
    section = _section_at(model, unknown.at)
    in_list = any(isinstance(k, int) for k in unknown.at)
    # In a list item (callbacks.0) the item's own keys are all there is to suggest.
    root, at_names = (key_tree(section), ()) if in_list else (key_tree(model), tuple(str(k) for k in unknown.at))
    hint = unknown_key_hint(at_names, unknown.rest, root)
    origin = origins.of_key((*unknown.at, *unknown.rest)) if origins else ""
    at, rest = unknown.at, unknown.rest
    if hint is not None and hint.from_root and not in_list:
        at, rest = (), (*at_names, *rest)
    if hint is None:
        return at, f"unknown key '{'.'.join(rest)}'{origin}; valid keys: {', '.join(sorted(section.model_fields))}"
    return at, f"unknown key '{'.'.join(rest)}' (did you mean {quote_paths(hint.paths)}?){origin}"


# ---- validation ---------------------------------------------------------------------------------
def _shown(value: Any) -> str:
    """A short repr of a bad input, for ' (got ...)'."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def value_problems(err: pydantic.ValidationError, origins: Origins | None) -> list[tuple[KeyPath, str]]:
    """(path, message) per pydantic error, with the value given and where it came from."""
    problems = []
    for problem in err.errors():
        path = tuple(problem["loc"])
        message = problem["msg"].removeprefix("Value error, ")
        given = problem.get("input")
        if problem["type"] != "missing" and not isinstance(given, dict):
            message += f" (got {_shown(given)})"
        problems.append((path, message + (origins.of_value(path) if origins else "")))
    return problems


def names_its_key(path: KeyPath, message: str) -> bool:
    """Whether `message` starts with the key path of `path` or one below it
    (`environment.name: unknown environment ...` for the section `environment`): a section's own
    validator that names the exact key, which `format_problems` then writes once."""
    dotted = ".".join(str(p) for p in path)
    return bool(dotted) and message.startswith((f"{dotted}.", f"{dotted}:"))


def format_problems(problems: list[tuple[KeyPath, str]], prefix: str = "") -> str:
    """One indented line per problem: `  section.key: message`; a message that starts with its
    own key path (`names_its_key`) is written as is, after `prefix`, so no key is named twice."""
    lines = []
    for path, message in problems:
        if names_its_key(path, message):
            lines.append(f"  {prefix + '.' if prefix else ''}{message}")
            continue
        where = ".".join([prefix, *(str(p) for p in path)] if prefix else [str(p) for p in path])
        lines.append(f"  {where or '(top level)'}: {message}")
    return "\n".join(lines)


def config_problems(model: type[M], data: dict[str, Any], origins: Origins | None = None) -> tuple[M | None, list[tuple[KeyPath, str]]]:
    """Validate `data` (left unchanged): (the config, or None, and every problem): unknown keys
    with their hints first, then bad values, all at once."""
    data = copy.deepcopy(data)
    problems = [describe_unknown(model, unknown, origins) for unknown in pop_unknown_keys(model, data)]
    try:
        config = model.model_validate(data)
    except pydantic.ValidationError as err:
        return None, problems + value_problems(err, origins)
    return (None if problems else config), problems
