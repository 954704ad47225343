"""Strict typed configs: YAML file + dotted overrides -> one pydantic model per entry point.

* An unknown key anywhere is an error with a did-you-mean (a typo never passes silently); the
  message says whether the key came from the config file or from a command-line override.
* Ranges are part of the types (`Field(gt=0)`): a bad value is named with its key and value.
* `a.b.c=value` overrides parse `value` as YAML (`lr=1e-4` is a float, `eval=[x.jsonl]` a list);
  a value the shell split at its spaces (`{a:` then `1.0}`) is an error that shows it quoted.
* `--config NAME` is a local file, else a config shipped in olingo/configs (`packaged:NAME` names
  a shipped one explicitly); `packaged_configs()` lists them.
* `HomePath` fields expand a leading `~`, as a shell would have done at the start of a word.
* `config_help(Model)` lists every field with its type, default and one-line doc for `--help`.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import shlex
import textwrap
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import annotated_types
import pydantic
import pydantic_core
import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, model_validator
from pydantic.fields import FieldInfo

from olingo.config_errors import KeyTree, did_you_mean, quote_paths, sibling_hint, unknown_key_hint
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


M = TypeVar("M", bound=BaseModel)
KeyPath = tuple[str | int, ...]  # a key path into config data: list items have int indices


PACKAGED_PREFIX = "packaged:"
STAGE_PREFIXES = ("experiment", "sft", "rm", "ppo", "grpo", "dpo", "orpo", "kto")  # a packaged file's stage is its name's first word


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
            raise ConfigError(f"no packaged config '{name}'{did_you_mean(name, _packaged_names())}; packaged configs: {', '.join(_packaged_names())} (olingo configs)")
        return packaged_config(name)
    local = Path(expand_home(text))
    if local.is_file():
        return local
    if local.name == text and packaged_config(text).is_file():
        return packaged_config(text)
    hint = did_you_mean(local.name, _packaged_names())
    raise ConfigError(f"config file not found: {text}{hint.replace('did you mean', 'did you mean the packaged')}; packaged configs are named by file name alone or packaged:<name> (olingo configs lists them)")


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
        raise ConfigError(f"override '{text}': the value is not valid YAML ({problem}); quote the whole override if its value holds spaces: {shlex.quote(text)}") from None
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


def _section(annotation: Any) -> type[BaseModel] | None:
    """The config section a field holds (`X` or `X | None` with X a model), else None."""
    annotation = _unwrap_optional(annotation)
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _item_section(annotation: Any) -> type[BaseModel] | None:
    """The model of each item of a `list[X]` field (callbacks, benchmarks), else None."""
    annotation = _unwrap_optional(annotation)
    if typing.get_origin(annotation) is list:
        (item,) = typing.get_args(annotation) or (None,)
        return _section(item)
    return None


@functools.cache
def key_tree(model: type[BaseModel]) -> KeyTree:
    """The sections and keys of `model`, for did-you-mean."""
    return {name: (key_tree(sub) if (sub := _section(f.annotation)) else None) for name, f in model.model_fields.items()}


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
        value, section, item = data[key], _section(field.annotation), _item_section(field.annotation)
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
            model = _section(annotation) or _item_section(annotation) or model
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


def format_problems(problems: list[tuple[KeyPath, str]], prefix: str = "") -> str:
    """One indented line per problem: `  section.key: message`."""
    lines = []
    for path, message in problems:
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


# ---- --help -------------------------------------------------------------------------------------
def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if annotation is type(None):
        return "null"
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return "|".join(str(a) for a in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(annotation, "__name__", str(annotation))


RANGE_SYMBOLS = ((annotated_types.Gt, "gt", ">"), (annotated_types.Ge, "ge", ">="), (annotated_types.Lt, "lt", "<"), (annotated_types.Le, "le", "<="))


def range_text(field: FieldInfo) -> str:
    """The field's bounds as help text: ' (> 0)', ' (>= 0, < 1)', or ''."""
    bounds = [f"{symbol} {getattr(m, attr)}" for m in field.metadata for kind, attr, symbol in RANGE_SYMBOLS if isinstance(m, kind)]
    return f" ({', '.join(bounds)})" if bounds else ""


@dataclass
class HelpRow:
    """One field of `--help`: dotted key, type, default, doc, and notes printed below it."""

    key: str
    type: str
    default: str
    doc: str
    notes: list[str]


def yaml_text(value: Any) -> str:
    """`value` as it would be written in YAML or an override: null, false, [0.9, 0.95]."""
    return yaml.safe_dump(value, default_flow_style=True, width=10**6).strip().removesuffix("...").strip()


def _default_text(field: FieldInfo, name: str, values: Mapping[str, Any] | None) -> str:
    """The value a run gets: from `values` (a resolved config), else the class default."""
    if values is not None and name in values:
        return yaml_text(values[name])
    if field.is_required():
        return "(required)"
    return yaml_text(pydantic_core.to_jsonable_python(field.get_default(call_default_factory=True)))


def _help_sections(model: type[BaseModel], values: Mapping[str, Any] | None, notes: Mapping[str, str], prefix: str, doc: str) -> Iterator[tuple[str, str, list[HelpRow]]]:
    """(heading, doc, rows) for `model`'s own values, then each of its sections, depth first."""
    rows, sections = [], []
    for name, field in model.model_fields.items():
        dotted = f"{prefix}{name}"
        section = _section(field.annotation)
        if section is not None:
            sub_values = values.get(name) if values is not None else None
            sub_doc = field.description or section.__doc__ or ""
            sections.append((section, sub_values if isinstance(sub_values, Mapping) else None, dotted, sub_doc))
            continue
        shown, own = _default_text(field, name, values), _default_text(field, name, None)
        # The values shown come from a packaged file; a key the user's --config leaves out takes
        # the field's own default, so say it where the two differ.
        elsewhere = f" [without it in --config: {own}]" if shown != own else ""
        rows.append(HelpRow(dotted, _type_name(field.annotation), shown,
                            (field.description or "") + range_text(field) + elsewhere, [notes[dotted]] if dotted in notes else []))
    if rows:
        yield prefix.rstrip(".") or "top level", doc, rows
    for section, sub_values, dotted, sub_doc in sections:
        yield from _help_sections(section, sub_values, notes, f"{dotted}.", sub_doc)


def config_help(model: type[BaseModel], values: BaseModel | None = None, notes: Mapping[str, str] | None = None) -> str:
    """Every field under its section's heading: `section.key  type  = default  doc (range)`.

    `values`: a resolved config whose values are shown as the defaults (e.g. the packaged
    file a bare command uses), instead of the class defaults. `notes`: extra lines by dotted
    key (e.g. the registered callback kinds under `callbacks`).
    """
    plain = values.model_dump(mode="json") if values is not None else None
    sections = list(_help_sections(model, plain, notes or {}, "", ""))
    rows = [row for _, _, section_rows in sections for row in section_rows]
    key_w = min(max(len(r.key) for r in rows), 36)
    type_w = min(max(len(r.type) for r in rows), 20)
    default_w = min(max(len(r.default) for r in rows), 18)
    lines: list[str] = []
    for heading, doc, section_rows in sections:
        first_line = doc.strip().splitlines()[0] if doc.strip() else ""
        lines.append(f"\n{heading}:  {first_line}".rstrip())
        for r in section_rows:
            lines.append(f"  {r.key:<{key_w}} {r.type:<{type_w}} = {r.default:<{default_w}} {r.doc}".rstrip())
            lines += [textwrap.fill(note, width=100, initial_indent=" " * 6, subsequent_indent=" " * 8) for note in r.notes]
    return "\n".join(lines)
