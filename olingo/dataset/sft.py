"""SFT data: conversations -> token ids plus a loss mask that covers assistant tokens only.

Accepted rows:
    {"prompt": str | messages, "completion": str | messages}
    {"messages": [{"role", "content"}, ...]}            (Hugging Face / TRL)
    {"messages": [{"from", "content"}, ...]}            (ColossalChat: human/gpt/assistant/system)

The mask comes from the tokenizer's own chat template: for each assistant turn, the tokens
between "conversation so far + generation prompt" and "conversation through this turn" are that
turn's tokens, cut after its end-of-turn (eos) token: its content and that token, not the
template's text after it (ChatML's newline after `<|im_end|>`), so the model learns exactly what
a rollout generates. Any template that renders prefixes consistently works, with or without
`{% generation %}` markers. A default system prompt the template inserts (SmolLM2's) is part of
the unmasked prompt, as it is of the prompt a rollout starts from. Rows longer than max_length keep
their beginning; a row whose assistant tokens are all cut is an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Dataset

from olingo.dataset.chat_tokens import assistant_token_mask, encode_chat
from olingo.dataset.messages import (
    Message,
    RowRef,
    missing_reason,
    parse_messages_field,
    parse_turns,
)
from olingo.dataset.preference_dataset import tokenize_sources


@dataclass(frozen=True)
class SFTExample:
    messages: list[Message]
    source: str | None = field(default=None, compare=False)
    row: int | None = field(default=None, compare=False)


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
    else:
        raise ref.error("messages", f"{missing_reason(raw)}; expected 'messages' or 'prompt' + 'completion'")
    _check_turns(messages, ref)
    return SFTExample(messages, source=source, row=row)


def _check_turns(messages: list[Message], ref: RowRef) -> None:
    if messages[0]["role"] == "assistant":
        raise ref.error("messages[0].role", "a conversation must open with a user or system turn")
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not assistant:
        raise ref.error("messages", "no assistant turn to train on")
    for i in assistant:
        if not messages[i]["content"].strip():
            raise ref.error(f"messages[{i}].content", "empty response (blank or whitespace only)")


def tokenize_sft(example: SFTExample, tokenizer: Any, max_length: int) -> dict[str, list[int]]:
    """{"input_ids", "loss_mask"} with loss_mask[t] = 1 on assistant tokens."""
    messages = example.messages
    ids = encode_chat(tokenizer, messages)
    mask = assistant_token_mask(tokenizer, messages, ids)
    ids, mask = ids[:max_length], mask[:max_length]
    if not any(mask):
        ref = RowRef(example.source or "<data>", example.row)
        raise ref.error("messages", f"no assistant token fits in max_length={max_length}")
    return {"input_ids": ids, "loss_mask": mask}


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
    sources: str | list[str], tokenizer: Any, max_length: int, *, skip_invalid: bool = False, split: str | None = None
) -> SFTDataset:
    """Validate and tokenise every row up front (errors name file, row and field)."""

    def make_item(source: str, row: int, raw: dict[str, Any]) -> dict[str, list[int]]:
        return tokenize_sft(parse_sft_row(raw, source, row), tokenizer, max_length)

    items, skipped = tokenize_sources(sources, tokenizer, max_length, make_item, skip_invalid=skip_invalid, split=split, kind="sft")
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
