"""Preference rows (a prompt, a chosen and a rejected response): parse, validate, tokenise.

Accepted row formats, told apart by their keys:

(a) ``{"prompt": str, "chosen": str, "rejected": str}``;
(b) TRL's conversational rows: ``prompt``, ``chosen`` and ``rejected`` as lists of
    ``{"role", "content"}`` messages (a string in any of them is one message); without
    ``prompt``, chosen and rejected are full conversations and their shared opening turns
    are the prompt (TRL's implicit prompt);
(b') TRL's implicit-prompt text rows, ``{"chosen": str, "rejected": str}``: the prompt is the
    longest common prefix of the two strings, less a space right before the point where they
    differ (that space starts both responses), exactly as TRL's ``extract_prompt`` cuts them;
    it is then one user turn and each rest one assistant turn, as in (a);
(c) ColossalChat's rows: ``context`` holds the prompt as ``{"from", "content"}`` messages
    (from: human/user, gpt/assistant, system), ``chosen``/``rejected`` the responses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jinja2.exceptions import TemplateError

from olingo.dataset.chat_tokens import (
    assistant_token_mask,
    left_truncate,
    split_prompt_response,
)
from olingo.dataset.limits import LengthLimit, OverlongRowError, as_limit
from olingo.dataset.messages import (
    Message,
    RowRef,
    has_text_or_tool_calls,
    missing_reason,
    parse_turns,
)
from olingo.dataset.tool_turns import check_tool_calls_rendered

_RESPONSE_SIDES = ("chosen", "rejected")


@dataclass(frozen=True)
class PreferenceExample:
    """One validated preference pair as role/content messages.

    ``source`` and ``row`` say where it came from, so a later error (at tokenisation)
    still names the row; they do not take part in equality.
    """

    prompt: list[Message]
    chosen: list[Message]
    rejected: list[Message]
    source: str | None = field(default=None, compare=False)
    row: int | None = field(default=None, compare=False)


def parse_preference_row(
    raw: dict[str, Any], source: str = "<data>", row: int | None = None
) -> PreferenceExample:
    """Validate one raw row in any accepted format and normalise it.

    Raises DataError naming ``source``, ``row`` and the field for a missing field, a
    wrong type, an unknown role, an empty response or a response that does not start
    with an assistant turn.
    """
    ref = RowRef(source, row)
    # None counts as absent: Arrow-backed sources fill a column that other rows lack with None.
    if raw.get("context") is not None:
        prompt, chosen, rejected = _parse_with_prompt(
            raw, ref, prompt_key="context", role_key="from"
        )
    elif raw.get("prompt") is not None:
        prompt, chosen, rejected = _parse_with_prompt(
            raw, ref, prompt_key="prompt", role_key="role"
        )
    else:
        prompt, chosen, rejected = _parse_implicit(raw, ref)
    return PreferenceExample(prompt, chosen, rejected, source=source, row=row)


def require_field(raw: dict[str, Any], key: str, ref: RowRef) -> Any:
    """``raw[key]``, or a DataError saying it is missing."""
    value = raw.get(key)
    if value is None:
        raise ref.error(key, missing_reason(raw))
    return value


def _parse_with_prompt(
    raw: dict[str, Any], ref: RowRef, *, prompt_key: str, role_key: str
) -> tuple[list[Message], ...]:
    """A row that carries its prompt: (a)/(b) under "prompt", (c) under "context"."""
    prompt = parse_turns(raw[prompt_key], prompt_key, ref, role_key=role_key, string_role="user")
    responses = []
    for side in _RESPONSE_SIDES:
        value = require_field(raw, side, ref)
        turns = parse_turns(value, side, ref, role_key=role_key, string_role="assistant")
        check_response(turns, side, ref, role_key=role_key, first_index=_index_of(value))
        responses.append(turns)
    return prompt, *responses


def _parse_implicit(raw: dict[str, Any], ref: RowRef) -> tuple[list[Message], ...]:
    """Format (b) without ``prompt``: the shared opening turns of two full conversations."""
    chosen_raw = require_field(raw, "chosen", ref)
    rejected_raw = require_field(raw, "rejected", ref)
    if isinstance(chosen_raw, str) and isinstance(rejected_raw, str):
        return _parse_implicit_text(chosen_raw, rejected_raw, ref)
    if isinstance(chosen_raw, str) or isinstance(rejected_raw, str):
        reason = f"{missing_reason(raw)}; without it chosen and rejected must be both strings or both full conversations"
        raise ref.error("prompt", reason)
    chosen = parse_turns(chosen_raw, "chosen", ref, role_key="role", string_role="assistant")
    rejected = parse_turns(rejected_raw, "rejected", ref, role_key="role", string_role="assistant")
    shared = implicit_prompt_length(chosen, rejected)
    if shared == 0:
        reason = "missing, and chosen and rejected do not open with a shared user or system turn"
        raise ref.error("prompt", reason)
    for side, turns in (("chosen", chosen), ("rejected", rejected)):
        check_response(turns[shared:], side, ref, role_key="role", first_index=shared)
    return chosen[:shared], chosen[shared:], rejected[shared:]


def _parse_implicit_text(chosen_raw: str, rejected_raw: str, ref: RowRef) -> tuple[list[Message], ...]:
    """Format (b'): two strings whose longest common prefix is the prompt (``extract_text_prompt``)."""
    if chosen_raw == rejected_raw:
        raise ref.error("rejected", "the same text as chosen: no pair to learn from")
    prompt, chosen, rejected = extract_text_prompt(chosen_raw, rejected_raw)
    if not prompt.strip():
        raise ref.error("prompt", "missing, and chosen and rejected share no opening text to take as the prompt")
    responses = []
    for side, text in (("chosen", chosen), ("rejected", rejected)):
        turns = [{"role": "assistant", "content": text}]
        check_response(turns, side, ref, role_key="role", first_index=None)
        responses.append(turns)
    return [{"role": "user", "content": prompt}], *responses


def extract_text_prompt(chosen: str, rejected: str) -> tuple[str, str, str]:
    """(prompt, chosen rest, rejected rest): the prompt is the longest common prefix, less a
    space just before the first difference, which goes to both rests. This is TRL's
    ``extract_prompt`` (trl/data_utils.py) for strings, so rows split as in TRL's trainers."""
    cut = 0
    while cut < min(len(chosen), len(rejected)) and chosen[cut] == rejected[cut]:
        cut += 1
    if 0 < cut < min(len(chosen), len(rejected)) and chosen[cut - 1] == " ":
        cut -= 1
    return chosen[:cut], chosen[cut:], rejected[cut:]


def implicit_prompt_length(chosen: list[Message], rejected: list[Message]) -> int:
    """How many opening messages two full conversations share as their prompt.

    The longest common run of messages, shortened until it ends on a non-assistant turn:
    a response must open with an assistant turn, so a shared assistant turn right before
    the point of difference belongs to both responses (as in TRL's ``extract_prompt``).
    """
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    while shared > 0 and chosen[shared - 1]["role"] == "assistant":
        shared -= 1
    return shared


def _index_of(value: Any) -> int | None:
    """0 for a raw message list, None for a plain string (its field has no index)."""
    return None if isinstance(value, str) else 0


def check_response(
    turns: list[Message], side: str, ref: RowRef, *, role_key: str, first_index: int | None
) -> None:
    """A response must exist, open with an assistant turn and say something in each turn.

    ``first_index`` is the raw list position of ``turns[0]`` (so field names match the
    file), or None when the raw response was a plain string.
    """
    if not turns:
        raise ref.error(side, "no response turns after the prompt")

    def where(i: int, key: str) -> str:
        return side if first_index is None else f"{side}[{first_index + i}].{key}"

    if turns[0]["role"] != "assistant":
        reason = f"a response must start with an assistant turn, got '{turns[0]['role']}'"
        raise ref.error(where(0, role_key), reason)
    for i, turn in enumerate(turns):
        if turn["role"] == "assistant" and not has_text_or_tool_calls(turn):
            raise ref.error(where(i, "content"), "empty response (blank or whitespace only)")


def tokenize_preference(
    example: PreferenceExample, tokenizer: Any, max_length: int | LengthLimit
) -> dict[str, list[int]]:
    """Token ids and loss masks of both sides of ``example``, each at most ``max_length`` long.

    Keys: ``chosen_input_ids``, ``chosen_loss_mask``, ``rejected_input_ids``,
    ``rejected_loss_mask``. Each side is the tokenizer's chat template applied to prompt +
    response, the response ending at its end-of-turn token (``split_prompt_response``), as
    a rollout does; its loss mask (same length, 0/1) is 1 exactly on the response's assistant
    turns (content and end-of-turn token) and 0 on the prompt and on any other turn. A side
    longer than the limit is an error when ``max_length`` is a LengthLimit whose ``overlong`` is
    "error" (or "skip"); with a plain int (or "truncate") it loses tokens from its start (the
    prompt's beginning), ids and mask alike. A response that alone exceeds the limit cannot fit
    and raises DataError naming the side.
    """
    limit, ref = as_limit(max_length), RowRef(example.source or "<data>", example.row)
    item: dict[str, list[int]] = {}
    for side in _RESPONSE_SIDES:
        prompt_ids, response_ids, response_mask = tokenize_prompt_response(
            example.prompt, getattr(example, side), side, tokenizer, limit, ref
        )
        limit.check(len(prompt_ids) + len(response_ids), ref, side, f"the prompt + {side} (chat template included)")
        ids, mask = left_truncate(
            prompt_ids + response_ids, [0] * len(prompt_ids) + response_mask, limit.max_length
        )
        item[f"{side}_input_ids"], item[f"{side}_loss_mask"] = ids, mask
    return item


def tokenize_prompt_response(
    prompt: list[Message],
    response: list[Message],
    field: str,
    tokenizer: Any,
    max_length: int | LengthLimit,
    ref: RowRef,
) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, response ids, response loss mask), untruncated.

    The mask is aligned with the response ids (see ``assistant_token_mask``). Raises
    DataError naming ``field`` when the chat template rejects the conversation (or ignores
    its tool calls) or the response alone is longer than ``max_length``.
    """
    limit = as_limit(max_length)
    try:
        check_tool_calls_rendered(tokenizer, prompt + response, ref, field, start=len(prompt))
        prompt_ids, response_ids = split_prompt_response(tokenizer, prompt, response)
        ids = prompt_ids + response_ids
        mask = assistant_token_mask(tokenizer, prompt + response, ids, first_turn=len(prompt))
    except TemplateError as exc:
        # Templates reject some conversations themselves (e.g. a system turn, or roles
        # that do not alternate) with raise_exception: that is a data problem too.
        raise ref.error(field, f"the chat template rejected this conversation: {exc}") from exc
    if len(response_ids) > limit.max_length:
        reason = (
            f"the response alone is {len(response_ids)} tokens, more than {limit.key}={limit.max_length} "
            f"(the prompt before it is {len(prompt_ids)} tokens); cutting the prompt cannot make it fit: raise {limit.key}"
        )
        raise OverlongRowError(ref.source, ref.row, field, reason)
    return prompt_ids, response_ids, mask[len(prompt_ids) :]
