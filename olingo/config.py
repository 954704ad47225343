"""Strict typed configs: YAML file + dotted overrides -> one pydantic model per entry point.

* An unknown key anywhere is an error with a did-you-mean (a typo never passes silently); the
  message says whether the key came from the config file or from a command-line override.
* Ranges are part of the types (`Field(gt=0)`): a bad value is named with its key and value.
* `a.b.c=value` overrides parse `value` as YAML (`lr=1e-4` is a float, `eval=[x.jsonl]` a list);
  a value the shell split at its spaces (`{a:` then `1.0}`) is an error that shows it quoted.
* `--config NAME` is a local file, else a config shipped in olingo/configs (`packaged:NAME` names
  a shipped one explicitly); `packaged_configs()` lists them.
* `HomePath` fields expand a leading `~`, as a shell would have done at the start of a word.
* `config_help(Model)` lists every field with its type, default and one-line doc for `--help`
  (olingo/config_help.py).

Finding every problem at once, and naming where each came from, is olingo/config_problems.py.
"""

from __future__ import annotations

import copy
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, model_validator

from olingo.config_errors import did_you_mean
from olingo.config_problems import M, Origins, config_problems, format_problems
from olingo.errors import OlingoError


class ConfigError(OlingoError, ValueError):
    """A config that cannot be used, with every problem on its own line."""


class StrictModel(BaseModel):
    """Base of every olingo config section: unknown keys are refused with a suggestion."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_keys(cls, data: Any) -> Any:
        # `load_config` reports unknown keys itself (whole path, origin); this catches the
        # rest, e.g. a model built in code or validated directly.
        if isinstance(data, dict):
            known = set(cls.model_fields)
            for key in data:
                if key not in known:
                    raise ValueError(f"unknown key '{key}'{did_you_mean(str(key), known)}; valid keys: {', '.join(sorted(known))}")
        return data

    @model_validator(mode="before")
    @classmethod
    def _keep_section_defaults(cls, data: Any) -> Any:
        """A section given as a mapping changes only the fields it names: the others keep the
        defaults this config sets for the section (e.g. DPO's `train.lr` 5e-7, GRPO's run name),
        not those of the section's class. Without this, `train: {batch_size: 8}` would silently
        bring back the class defaults of every other `train` field."""
        if not isinstance(data, dict):
            return data
        merged = dict(data)
        for name, value in data.items():
            field = cls.model_fields.get(name)
            if not isinstance(value, dict) or field is None or field.default_factory is None:
                continue
            default = field.default_factory()
            if isinstance(default, BaseModel) and default.model_fields_set:
                merged[name] = {**default.model_dump(include=default.model_fields_set), **value}
        return merged


PACKAGED_PREFIX = "packaged:"
STAGE_PREFIXES = ("experiment", "sft", "rm", "ppo", "grpo", "dpo", "orpo", "kto", "eval")  # a packaged file's stage is its name's first word


def expand_home(path: str) -> str:
    """`~/x` or `~user/x` -> the absolute path; anything else unchanged. A shell expands `~` only
    at the start of a word, so in `model.path=~/m` (or in a YAML file) it reaches olingo as is."""
    return os.path.expanduser(path) if path.startswith("~") else path


HomePath = Annotated[str, AfterValidator(expand_home)]  # a path field: a leading `~` is expanded once, at parsing


def packaged_config(name: str) -> Path:
    """Path of a config shipped inside the package (olingo/configs/<name>)."""
    from importlib import resources

    return Path(str(resources.files("olingo") / "configs" / name))


@dataclass(frozen=True)
class PackagedConfig:
    """A config shipped in olingo/configs: its file name, stage and the first sentence of its
    leading comment."""

    name: str
    stage: str
    description: str


def _first_sentence(text: str, width: int = 100) -> str:
    """The first sentence of a YAML file's leading `#` comment on one line, without its
    parenthesised asides; a longer one is cut at its last clause (`;`, `:`) that fits `width`."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    sentence = re.split(r"(?<=[.?!])\s", " ".join(part for part in lines if part), maxsplit=1)[0]
    while re.search(r"\([^()]*\)", sentence):
        sentence = re.sub(r"\s*\([^()]*\)", "", sentence)
    if len(sentence) <= width:
        return sentence
    clauses = [m.start() for m in re.finditer(r"[;:] ", sentence[:width]) if m.start() > width // 3]
    return sentence[: clauses[-1]] if clauses else sentence[: width - 3].rsplit(" ", 1)[0] + "..."


def packaged_configs() -> list[PackagedConfig]:
    """Every config shipped in olingo/configs, by name (`olingo configs` prints them)."""
    root = packaged_config("")
    found = []
    for path in sorted(root.glob("*.yaml")):
        stage = next((s for s in STAGE_PREFIXES if path.stem.split("_")[0] == s), "?")
        found.append(PackagedConfig(path.name, stage, _first_sentence(path.read_text())))
    return found


def find_config_file(path: str | Path) -> Path:
    """The config file `path` names: `packaged:<name>` is a config shipped in olingo/configs; a
    local file wins over a shipped one of the same name; a bare name that is no local file is
    looked up among the shipped ones. A `ConfigError` when neither exists."""
    text = os.fspath(path)
    if text.startswith(PACKAGED_PREFIX):
        name = text[len(PACKAGED_PREFIX):]
        if not packaged_config(name).is_file():
            raise ConfigError(f"no packaged config '{name}'{did_you_mean(name, _packaged_names())}; "
                              f"packaged configs: {', '.join(_packaged_names())} (olingo configs)")
        return packaged_config(name)
    local = Path(expand_home(text))
    if local.is_file():
        return local
    if local.name == text and packaged_config(text).is_file():
        return packaged_config(text)
    hint = did_you_mean(local.name, _packaged_names())
    raise ConfigError(f"config file not found: {text}{hint.replace('did you mean', 'did you mean the packaged')}; "
                      "packaged configs are named by file name alone or packaged:<name> (olingo configs lists them)")


def _packaged_names() -> list[str]:
    return [config.name for config in packaged_configs()]


# ---- overrides ----------------------------------------------------------------------------------
BRACKETS = {"{": "}", "[": "]"}


def _unclosed(text: str) -> bool:
    """Whether `text` opens more YAML flow brackets (`{`, `[`) or quotes than it closes: the
    first part of a value the shell split at a space."""
    depth, quote, previous = 0, None, ""
    for char in text:
        if quote is not None:
            quote = None if char == quote else quote
        elif char in "'\"" and previous in ("", "[", "{", ",", ":"):  # a quote opens only a scalar
            quote = char
        elif char in BRACKETS:
            depth += 1
        elif char in BRACKETS.values():
            depth -= 1
        previous = char if not char.isspace() else previous
    return depth > 0 or quote is not None


def _shell_split_error(parts: list[str]) -> ConfigError:
    """One line that shows the override the shell split at its spaces, quoted as it must be typed."""
    joined = " ".join(parts)
    if len(parts) == 1:
        return ConfigError(
            f"the override {shlex.quote(joined)} opens a bracket or quote that its value does not close; if the rest "
            f"of the value reached olingo as other arguments, the shell split it at a space: quote the whole override, e.g. {shlex.quote(joined)}"
        )
    return ConfigError(
        f"the override {shlex.quote(joined)} reached olingo as {len(parts)} arguments ({', '.join(repr(p) for p in parts)}): "
        f"the shell splits a value at its spaces; quote the whole override: {shlex.quote(joined)}"
    )


def check_overrides(texts: list[str]) -> None:
    """Refuse overrides the shell split: a value that opens a bracket or quote it does not close
    (`reward.functions={math_answer:` then `1.0}`), or a word without `=` after an override (the
    rest of its value). The message shows the override quoted."""
    for i, text in enumerate(texts):
        value = text.split("=", 1)[1] if "=" in text else None
        if value is not None and _unclosed(value):
            parts = [text]
            for rest in texts[i + 1:]:
                parts.append(rest)
                if not _unclosed(" ".join(parts).split("=", 1)[1]):
                    break
            raise _shell_split_error(parts)
        if value is None and i > 0 and "=" in texts[i - 1]:
            raise _shell_split_error([texts[i - 1], text])


def parse_override(text: str) -> tuple[list[str], Any]:
    """'train.lr=1e-4' -> (['train', 'lr'], 0.0001)."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like section.key=value")
    path, raw = text.split("=", 1)
    keys = [k for k in path.strip().split(".") if k]
    if not keys:
        raise ConfigError(f"override '{text}' has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as err:
        if _unclosed(raw):
            raise _shell_split_error([text]) from None
        problem = " ".join(str(getattr(err, "problem", None) or err).split())
        raise ConfigError(f"override '{text}': the value is not valid YAML ({problem}); "
                          f"quote the whole override if its value holds spaces: {shlex.quote(text)}") from None
    if isinstance(value, str):  # YAML 1.1 reads "1e-4" (no dot) as a string
        try:
            value = float(value)
        except ValueError:
            pass
    return keys, value


def apply_override(data: dict[str, Any], keys: list[str], value: Any) -> None:
    """Set `data[keys[0]][keys[1]]... = value`, creating missing sections."""
    node = data
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set '{'.'.join(keys)}': '{key}' is not a section")
        node = child
    node[keys[-1]] = value


# ---- loading ------------------------------------------------------------------------------------
def _read_yaml(path: str | Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(find_config_file(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {err}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return loaded or {}


def load_config(model: type[M], path: str | Path | None = None, overrides: list[str] | None = None) -> M:
    """Read YAML (optional), apply dotted overrides, validate strictly; a `ConfigError` lists
    every problem on its own line."""
    file_data = _read_yaml(path) if path is not None else {}
    data = copy.deepcopy(file_data)
    named: list[tuple[tuple[str, ...], str]] = []
    check_overrides(list(overrides or []))
    for text in overrides or []:
        keys, value = parse_override(text)
        apply_override(data, keys, value)
        named.append((tuple(keys), text))
    origins = Origins(str(path) if path is not None else None, file_data, tuple(named))
    config, problems = config_problems(model, data, origins)
    if config is None:
        raise ConfigError(f"invalid config {path if path is not None else '(defaults)'}:\n" + format_problems(problems))
    return config


def dump_config(config: BaseModel) -> str:
    """The fully resolved config as YAML, written into the run directory."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
