"""Strict typed configs: YAML file + dotted overrides -> one pydantic model per entry point.

* An unknown key anywhere is an error with a did-you-mean (a typo never passes silently).
* `a.b.c=value` overrides parse `value` as YAML (`lr=1e-4` is a float, `eval=[x.jsonl]` a list).
* `config_help(Model)` lists every field with its type, default and one-line doc for `--help`.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import pydantic
import yaml
from pydantic import BaseModel, ConfigDict, model_validator

from olingo.config_errors import did_you_mean


class ConfigError(ValueError):
    """A config that cannot be used, with every problem on its own line."""


class StrictModel(BaseModel):
    """Base of every olingo config section: unknown keys are refused with a suggestion."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            known = set(cls.model_fields)
            for key in data:
                if key not in known:
                    raise ValueError(f"unknown key '{key}'{did_you_mean(str(key), known)}; valid keys: {', '.join(sorted(known))}")
        return data


M = TypeVar("M", bound=BaseModel)


def parse_override(text: str) -> tuple[list[str], Any]:
    """'train.lr=1e-4' -> (['train', 'lr'], 0.0001)."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like section.key=value")
    path, raw = text.split("=", 1)
    keys = [k for k in path.strip().split(".") if k]
    if not keys:
        raise ConfigError(f"override '{text}' has an empty key")
    value = yaml.safe_load(raw) if raw.strip() else None
    if isinstance(value, str):  # YAML 1.1 reads "1e-4" (no dot) as a string
        try:
            value = float(value)
        except ValueError:
            pass
    return keys, value


def apply_override(data: dict[str, Any], keys: list[str], value: Any) -> None:
    node = data
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set '{'.'.join(keys)}': '{key}' is not a section")
        node = child
    node[keys[-1]] = value


def _format_validation_error(err: pydantic.ValidationError, source: str) -> ConfigError:
    lines = []
    for problem in err.errors():
        where = ".".join(str(p) for p in problem["loc"]) or "(top level)"
        message = problem["msg"].removeprefix("Value error, ")
        lines.append(f"  {where}: {message}")
    return ConfigError(f"invalid config {source}:\n" + "\n".join(lines))


def load_config(model: type[M], path: str | Path | None = None, overrides: list[str] | None = None) -> M:
    """Read YAML (optional), apply dotted overrides, validate strictly."""
    data: dict[str, Any] = {}
    source = "(defaults)"
    if path is not None:
        source = str(path)
        try:
            loaded = yaml.safe_load(Path(path).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file not found: {path}") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {path} is not valid YAML: {err}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        data = loaded or {}
    for text in overrides or []:
        apply_override(data, *parse_override(text))
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as err:
        raise _format_validation_error(err, source) from None


def dump_config(config: BaseModel) -> str:
    """The fully resolved config as YAML, written into the run directory."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "|".join(str(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(annotation, "__name__", str(annotation))


def _section(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def config_help(model: type[BaseModel], prefix: str = "") -> str:
    """One line per field: `section.key  type  = default   doc`, sections recursively."""
    lines: list[str] = []
    for name, field in model.model_fields.items():
        dotted = f"{prefix}{name}"
        section = _section(field.annotation)
        if section is not None:
            doc = field.description or section.__doc__ or ""
            lines.append(f"\n{dotted}:  {doc.strip().splitlines()[0] if doc.strip() else ''}")
            lines.append(config_help(section, prefix=f"{dotted}."))
            continue
        default = field.get_default(call_default_factory=True)
        lines.append(f"  {dotted:<28} {_type_name(field.annotation):<18} = {default!r:<16} {field.description or ''}")
    return "\n".join(lines)
