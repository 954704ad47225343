"""SFT data: conversations -> token ids plus a loss mask that covers assistant tokens only.

Accepted rows (docs/data.md):
    {"prompt": str | messages, "completion": str | messages}
    {"messages": [{"role", "content"}, ...]}            (Hugging Face / TRL; tool turns and tool_calls too)
    {"messages": [{"from", "content"}, ...]}            (ColossalChat: human/gpt/assistant/system)
    {"text": str}                                       (TRL's language modelling rows: no chat template,
                                                         the loss covers every token)

The mask comes from the tokenizer's own chat template: for each assistant turn, the tokens
between "conversation so far + generation prompt" and "conversation through this turn" are that
turn's tokens, cut after its end-of-turn (eos) token: its content and that token, not the
template's text after it (ChatML's newline after `<|im_end|>`), so the model learns exactly what
a rollout generates. Any template that renders prefixes consistently works, with or without
`{% generation %}` markers. A default system prompt the template inserts (SmolLM2's) is part of
the unmasked prompt, as it is of the prompt a rollout starts from. An assistant turn made of
``tool_calls`` is trained on like any other; ``tool`` turns (tool results) are not.

A ``text`` row is tokenised as plain text (the tokenizer's own special tokens, e.g. bos, then the
text), with eos appended when the text does not end with it, as TRL's SFTTrainer does; every token
is a target. A row longer than max_length is an error unless ``overlong`` says to cut it (keeping
its beginning) or skip it (olingo.dataset.limits); a row whose assistant tokens are all cut is an
error either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from jinja2.exceptions import TemplateError
from torch.utils.data import Dataset

from olingo.dataset.chat_tokens import assistant_token_mask, encode_chat
from olingo.dataset.errors import type_name
from olingo.dataset.limits import LengthLimit, Overlong, OverlongRowError, as_limit
from olingo.dataset.messages import (
    Message,
    RowRef,
    has_text_or_tool_calls,
    missing_reason,
    parse_messages_field,
    parse_turns,
)
from olingo.dataset.preference_dataset import tokenize_sources
from olingo.dataset.tool_turns import check_tool_calls_rendered


@dataclass(frozen=True)
class SFTExample:
    """One validated row: a conversation (``messages``), or plain ``text`` (then messages is [])."""

    messages: list[Message]
    source: str | None = field(default=None, compare=False)
    row: int | None = field(default=None, compare=False)
    text: str | None = None


def parse_sft_row(raw: dict[str, Any], source: str = "<data>", row: int | None = None) -> SFTExample:
    """Validate one row in any accepted format; DataError names source, row and field."""
    ref = RowRef(source, row)
    if raw.get("messages") is not None:
        messages = parse_messages_field(raw, ref)
    elif raw.get("prompt") is not None:
        if raw.get("completion") is None:
            raise ref.error("completion", missing_reason(raw))
        prompt = parse_turns(raw["prompt"], "prompt", ref, role_key="role", string_role="user")
        completion = parse_turns(raw["completion"], "completion", ref, role_key="role", string_role="assistant")
        messages = prompt + completion
    elif raw.get("text") is not None:
        return SFTExample([], source=source, row=row, text=_plain_text(raw["text"], ref))
    else:
        raise ref.error("messages", f"{missing_reason(raw)}; expected 'messages', 'prompt' + 'completion' or 'text'")
    _check_turns(messages, ref)
    return SFTExample(messages, source=source, row=row)


def _plain_text(value: object, ref: RowRef) -> str:
    """A ``text`` row's text: a string with something in it."""
    if not isinstance(value, str):
        raise ref.error("text", f"expected a string, got {type_name(value)}")
    if not value.strip():
        raise ref.error("text", "empty text (blank or whitespace only)")
    return value


def _check_turns(messages: list[Message], ref: RowRef) -> None:
    """Opens with a user or system turn, and has an assistant turn that says something."""
    if messages[0]["role"] in ("assistant", "tool"):
        raise ref.error("messages[0].role", "a conversation must open with a user or system turn")
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not assistant:
        raise ref.error("messages", "no assistant turn to train on")
    for i in assistant:
        if not has_text_or_tool_calls(messages[i]):
            raise ref.error(f"messages[{i}].content", "empty response (blank or whitespace only)")


def tokenize_sft(example: SFTExample, tokenizer: Any, max_length: int | LengthLimit) -> dict[str, list[int]]:
    """{"input_ids", "loss_mask"} with loss_mask[t] = 1 on assistant tokens (on every token of a
    ``text`` row). ``max_length``: a LengthLimit applies its ``overlong`` rule to a longer row; a
    plain int cuts the row's end off (olingo.dataset.limits)."""
    limit, ref = as_limit(max_length), RowRef(example.source or "<data>", example.row)
    if example.text is not None:
        ids, field_name = _text_ids(tokenizer, example.text), "text"
        mask = [1] * len(ids)
    else:
        ids, mask, field_name = (*_conversation_ids(tokenizer, example.messages, ref), "messages")
    if len(ids) > limit.max_length and not any(mask[: limit.max_length]):
        reason = f"no assistant token fits in {limit.key}={limit.max_length} (the conversation is {len(ids)} tokens): raise {limit.key}"
        raise OverlongRowError(ref.source, ref.row, field_name, reason)
    what = "the text" if example.text is not None else "the conversation (chat template included)"
    if limit.check(len(ids), ref, field_name, what):
        ids, mask = ids[: limit.max_length], mask[: limit.max_length]
    return {"input_ids": ids, "loss_mask": mask}


def _text_ids(tokenizer: Any, text: str) -> list[int]:
    """A ``text`` row's ids: the tokenizer's own special tokens (bos where it adds one), the text,
    then eos unless the text already ends with it (TRL's SFTTrainer adds it the same way)."""
    ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None and (not ids or ids[-1] != eos):
        ids.append(eos)
    return ids


def _conversation_ids(tokenizer: Any, messages: list[Message], ref: RowRef) -> tuple[list[int], list[int]]:
    """Ids and assistant mask of a conversation; a template that refuses it is a DataError."""
    try:
        check_tool_calls_rendered(tokenizer, messages, ref, "messages")
        ids = encode_chat(tokenizer, messages)
        return ids, assistant_token_mask(tokenizer, messages, ids)
    except TemplateError as exc:
        raise ref.error("messages", f"the chat template rejected this conversation: {exc}") from exc


class SFTDataset(Dataset):
    """Tokenised conversations: items are {"input_ids", "loss_mask"} lists, unpadded."""

    def __init__(self, items: list[dict[str, list[int]]], num_skipped: int = 0) -> None:
        self.items = items
        self.num_skipped = num_skipped

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return self.items[index]


def build_sft_dataset(
    sources: str | list[str], tokenizer: Any, max_length: int, *, skip_invalid: bool = False, split: str | None = None,
    overlong: Overlong = "error", length_key: str = "max_length",
) -> SFTDataset:
    """Validate and tokenise every row up front (errors name file, row and field). A row longer
    than ``max_length`` is an error naming ``length_key``, unless ``overlong`` is "truncate"
    (keep its beginning) or "skip"; either logs how many rows it touched."""
    limit = LengthLimit(max_length, length_key, overlong)

    def make_item(source: str, row: int, raw: dict[str, Any]) -> dict[str, list[int]]:
        return tokenize_sft(parse_sft_row(raw, source, row), tokenizer, limit)

    items, skipped = tokenize_sources(sources, tokenizer, limit, make_item, skip_invalid=skip_invalid, split=split, kind="sft", needs_template=False)
    return SFTDataset(items, num_skipped=skipped)


@dataclass(frozen=True)
class SFTCollator:
    """Right-pads a batch to its longest row: input_ids, attention_mask, loss_mask, all (B, L)."""

    pad_token_id: int

    def __call__(self, items: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        width = max(len(item["input_ids"]) for item in items)
        ids = torch.full((len(items), width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(items), width), dtype=torch.long)
        loss_mask = torch.zeros((len(items), width), dtype=torch.long)
        for row, item in enumerate(items):
            n = len(item["input_ids"])
            ids[row, :n] = torch.tensor(item["input_ids"])
            attention[row, :n] = 1
            loss_mask[row, :n] = torch.tensor(item["loss_mask"])
        return {"input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask}
