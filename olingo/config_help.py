"""`config_help(Model)`: every field of a config with its type, default, range and one-line doc,
under its section's heading, as `olingo <stage> --help` prints it.
"""

from __future__ import annotations

import textwrap
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import annotated_types
import pydantic_core
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from olingo.config_problems import field_section

__all__ = ["HelpRow", "config_help", "range_text", "yaml_text"]


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


def _help_sections(
    model: type[BaseModel], values: Mapping[str, Any] | None, notes: Mapping[str, str], prefix: str, doc: str
) -> Iterator[tuple[str, str, list[HelpRow]]]:
    """(heading, doc, rows) for `model`'s own values, then each of its sections, depth first."""
    rows, sections = [], []
    for name, field in model.model_fields.items():
        dotted = f"{prefix}{name}"
        section = field_section(field.annotation)
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
