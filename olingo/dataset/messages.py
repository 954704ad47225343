"""Validate raw chat turns and normalise them to ``{"role", "content"}`` messages.

Two spellings of a message are accepted: the Hugging Face/TRL one, ``{"role", "content"}``
with role system/user/assistant, and ColossalChat's ``{"from", "content"}`` whose speaker
names (human, gpt, ...) are mapped to those roles. Every problem becomes a DataError that
names the exact field, e.g. ``prompt[2].content``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from olingo.dataset.errors import DataError, type_name

Message = dict[str, str]

ROLES = ("system", "user", "assistant")
SPEAKER_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
}


@dataclass(frozen=True)
class RowRef:
    """Where a row came from, so any check can build a DataError pointing at it."""

    source: str
    row: int | None

    def error(self, field: str | None, reason: str) -> DataError:
        """A DataError for ``field`` of this row."""
        return DataError(self.source, self.row, field, reason)


def missing_reason(raw: dict[str, Any]) -> str:
    """The reason text for a missing field, listing the keys the object does have."""
    present = sorted(key for key, value in raw.items() if value is not None)
    return f"missing (present keys: {', '.join(present) or 'none'})"


def parse_turns(
    value: Any, field: str, ref: RowRef, *, role_key: str, string_role: str
) -> list[Message]:
    """A string or a list of messages as normalised messages.

    A plain string becomes one message with role ``string_role``. ``role_key`` is "role"
    for TRL-style messages and "from" for ColossalChat-style ones.
    """
    if isinstance(value, str):
        return [{"role": string_role, "content": value}]
    if isinstance(value, list):
        return parse_messages(value, field, ref, role_key=role_key)
    raise ref.error(field, f"expected a string or a list of messages, got {type_name(value)}")


def parse_messages_field(raw: dict[str, Any], ref: RowRef) -> list[Message]:
    """A row's ``messages`` list in either spelling (the first message's keys decide which)."""
    value = raw["messages"]
    if not isinstance(value, list) or not value:
        raise ref.error("messages", "expected a non-empty list of messages")
    role_key = "from" if isinstance(value[0], dict) and "from" in value[0] else "role"
    return parse_messages(value, "messages", ref, role_key=role_key)


def parse_messages(value: list[Any], field: str, ref: RowRef, *, role_key: str) -> list[Message]:
    """Validate a non-empty list of message objects and normalise each one."""
    if not value:
        raise ref.error(field, "expected at least one message, got an empty list")
    return [_parse_message(item, f"{field}[{i}]", ref, role_key) for i, item in enumerate(value)]


def _parse_message(item: Any, field: str, ref: RowRef, role_key: str) -> Message:
    """One message object as ``{"role", "content"}``; extra keys are dropped."""
    if not isinstance(item, dict):
        raise ref.error(field, f"expected a message object, got {type_name(item)}")
    # None counts as absent: Arrow-backed sources fill keys that other rows have with None.
    speaker, content = item.get(role_key), item.get("content")
    for key, got in ((role_key, speaker), ("content", content)):
        if got is None:
            raise ref.error(f"{field}.{key}", missing_reason(item))
        if not isinstance(got, str):
            raise ref.error(f"{field}.{key}", f"expected a string, got {type_name(got)}")
    return {"role": _role(speaker, f"{field}.{role_key}", ref, role_key), "content": content}


def _role(speaker: str, field: str, ref: RowRef, role_key: str) -> str:
    """The normalised role for a "role" or "from" value, or a DataError if unknown."""
    known = SPEAKER_ROLES if role_key == "from" else {role: role for role in ROLES}
    if speaker not in known:
        expected = ", ".join(sorted(known))
        raise ref.error(field, f"unknown role '{speaker}' (expected one of: {expected})")
    return known[speaker]
