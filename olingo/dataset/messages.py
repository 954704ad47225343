"""Validate raw chat turns and normalise them to ``{"role", "content"}`` messages.

Two spellings of a message are accepted: the Hugging Face/TRL one, ``{"role", "content"}``
with role system/user/assistant/tool, and ColossalChat's ``{"from", "content"}`` whose speaker
names (human, gpt, ...) are mapped to those roles. Every problem becomes a DataError that
names the exact field, e.g. ``prompt[2].content``.

Tool use follows transformers' chat format (docs/data.md): an assistant message may carry
``tool_calls`` (a list of ``{"type": "function", "function": {"name", "arguments"}}``; its
``content`` may then be empty or absent), and a ``tool`` message holds a tool's result as
``content`` (with optional ``name`` and ``tool_call_id``). Those keys are kept for the chat
template to render; other extra keys are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from olingo.dataset.errors import DataError, type_name

# {"role", "content"}, plus "tool_calls" on an assistant turn and "name"/"tool_call_id" on a tool turn.
Message = dict[str, Any]

ROLES = ("system", "user", "assistant", "tool")
# The keys a tool turn may carry besides role and content, kept for the chat template.
TOOL_MESSAGE_KEYS = ("name", "tool_call_id")
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
    """One message object as ``{"role", "content"}`` (plus its tool keys); other keys are dropped."""
    if not isinstance(item, dict):
        raise ref.error(field, f"expected a message object, got {type_name(item)}")
    # None counts as absent: Arrow-backed sources fill keys that other rows have with None.
    speaker = _required_string(item, role_key, field, ref)
    role = _role(speaker, f"{field}.{role_key}", ref, role_key)
    tool_calls = item.get("tool_calls")
    if tool_calls is not None and role != "assistant":
        raise ref.error(f"{field}.tool_calls", f"only an assistant turn makes tool calls, this one is '{role}'")
    if tool_calls is not None:
        content = item.get("content")
        if content is not None and not isinstance(content, str):
            raise ref.error(f"{field}.content", f"expected a string, got {type_name(content)}")
        return {"role": role, "content": content or "", "tool_calls": _tool_calls(tool_calls, f"{field}.tool_calls", ref)}
    message: Message = {"role": role, "content": _required_string(item, "content", field, ref)}
    if role == "tool":
        for key in TOOL_MESSAGE_KEYS:
            if item.get(key) is not None:
                message[key] = _required_string(item, key, field, ref)
    return message


def _required_string(item: dict[str, Any], key: str, field: str, ref: RowRef) -> str:
    """``item[key]`` when it is a string; a DataError naming ``field.key`` otherwise."""
    value = item.get(key)
    if value is None:
        raise ref.error(f"{field}.{key}", missing_reason(item))
    if not isinstance(value, str):
        raise ref.error(f"{field}.{key}", f"expected a string, got {type_name(value)}")
    return value


def _tool_calls(value: Any, field: str, ref: RowRef) -> list[dict[str, Any]]:
    """An assistant turn's ``tool_calls``: a non-empty list of calls, each naming a function
    (``{"type": "function", "function": {"name", "arguments"}}``, as transformers' chat
    templates read them). Arguments may be an object or a JSON string (Arrow stores either)."""
    if not isinstance(value, list) or not value:
        got = "an empty list" if value == [] else type_name(value)
        raise ref.error(field, f"expected a non-empty list of tool calls, got {got}")
    for i, call in enumerate(value):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise ref.error(f"{field}[{i}]", 'expected {"type": "function", "function": {"name": ..., "arguments": ...}}')
        _required_string(function, "name", f"{field}[{i}].function", ref)
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, dict | str):
            raise ref.error(f"{field}[{i}].function.arguments", f"expected an object or a string, got {type_name(arguments)}")
    return value


def has_text_or_tool_calls(message: Message) -> bool:
    """Whether an assistant turn says something: non-blank content, or tool calls."""
    return bool(message["content"].strip()) or bool(message.get("tool_calls"))


def _role(speaker: str, field: str, ref: RowRef, role_key: str) -> str:
    """The normalised role for a "role" or "from" value, or a DataError if unknown."""
    known = SPEAKER_ROLES if role_key == "from" else {role: role for role in ROLES}
    if speaker not in known:
        expected = ", ".join(sorted(known))
        raise ref.error(field, f"unknown role '{speaker}' (expected one of: {expected})")
    return known[speaker]
