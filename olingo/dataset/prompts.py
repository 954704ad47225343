"""Prompt data for rollouts: conversations -> prompt token ids (ending with the generation
prompt) plus an optional ground-truth answer for verifiable rewards.

Accepted rows (docs/data.md):
    {"prompt": str | messages, "gt_answer": str?}
    {"messages": [{"role", "content"}, ...], "gt_answer": str?}     (a trailing assistant turn is dropped)
    {"messages": [{"from", "content"}, ...]}                           (ColossalChat)
Messages may hold tool turns and assistant tool_calls (an agent's history); a prompt ends with a
user, system or tool turn, after which the policy answers.
`gt_answer` may also be spelled `answer`; numbers are accepted and turned into strings.
Every prompt ends with the chat template's generation prompt (ChatML: `<|im_start|>assistant` and a newline)
and holds what the template adds in front (a default system prompt), exactly the tokens an SFT
or preference row's response is conditioned on for the same messages.
A prompt longer than max_length is an error naming the file, the row, its length and the key to
raise, unless ``overlong`` is "truncate" (it keeps its end: the question and the generation prompt)
or "skip"; both log how many rows they touched (olingo.dataset.limits).
Every other field of a row (e.g. `{"prompt": ..., "tests": [...], "difficulty": 3}`) travels
with the item, untouched, and comes out of `PromptCollator` as `batch["row_fields"]`, one list
of B values per field, for reward functions (olingo.rewards).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from jinja2.exceptions import TemplateError
from torch.utils.data import Dataset

from olingo.dataset.chat_tokens import encode_chat
from olingo.dataset.errors import type_name
from olingo.dataset.limits import LengthLimit, Overlong
from olingo.dataset.messages import RowRef, missing_reason, parse_messages_field, parse_turns
from olingo.dataset.preference_dataset import tokenize_sources
from olingo.dataset.tool_turns import check_tool_calls_rendered

ANSWER_KEYS = ("gt_answer", "answer")
PROMPT_KEYS = ("prompt", "messages", *ANSWER_KEYS)  # read by parse_prompt_row: not row fields


def parse_prompt_row(raw: dict[str, Any], source: str = "<data>", row: int | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """(messages ending with a user/system/tool turn, gt_answer or None); DataError on bad rows."""
    ref = RowRef(source, row)
    if raw.get("messages") is not None:
        messages = parse_messages_field(raw, ref)
        if messages[-1]["role"] == "assistant":  # a full conversation: the policy answers anew
            messages = messages[:-1]
        field = "messages"
    elif raw.get("prompt") is not None:
        messages = parse_turns(raw["prompt"], "prompt", ref, role_key="role", string_role="user")
        field = "prompt"
    else:
        raise ref.error("prompt", f"{missing_reason(raw)}; expected 'prompt' or 'messages'")
    if not messages or messages[-1]["role"] == "assistant":
        raise ref.error(field, "a prompt must end with a user, system or tool turn")
    return messages, _answer(raw, ref)


def _answer(raw: dict[str, Any], ref: RowRef) -> str | None:
    for key in ANSWER_KEYS:
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            raise ref.error(key, f"expected a string or a number, got {type_name(value)}")
        return str(value)
    return None


def extra_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """The fields of a prompt row besides prompt, messages and the answer, values as loaded."""
    return {key: value for key, value in raw.items() if key not in PROMPT_KEYS}


class PromptDataset(Dataset):
    """Items: {"input_ids": list[int], "gt_answer": str | None, "row_fields": dict, "messages": list}, unpadded."""

    def __init__(self, items: list[dict[str, Any]], num_skipped: int = 0) -> None:
        self.items = items
        self.num_skipped = num_skipped

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.items[index]


def build_prompt_dataset(
    sources: str | list[str], tokenizer: Any, max_length: int, *, skip_invalid: bool = False, split: str | None = None,
    overlong: Overlong = "error", length_key: str = "max_length",
) -> PromptDataset:
    """Validate and tokenise every prompt up front (errors name file, row and field). A prompt
    longer than ``max_length`` tokens (chat template and generation prompt included) is an error
    naming ``length_key`` unless ``overlong`` is "truncate" (keep its end) or "skip"."""
    limit = LengthLimit(max_length, length_key, overlong)

    def make_item(source: str, row: int, raw: dict[str, Any]) -> dict[str, Any]:
        messages, answer = parse_prompt_row(raw, source, row)
        ref, field = RowRef(source, row), "messages" if raw.get("messages") is not None else "prompt"
        try:
            check_tool_calls_rendered(tokenizer, messages, ref, field)
            ids = encode_chat(tokenizer, messages, add_generation_prompt=True)
        except TemplateError as exc:
            raise ref.error(field, f"the chat template rejected this conversation: {exc}") from exc
        if limit.check(len(ids), ref, field, "the prompt (chat template and generation prompt included)"):
            ids = ids[-max_length:]
        return {"input_ids": ids, "gt_answer": answer, "row_fields": extra_fields(raw), "messages": messages}

    items, skipped = tokenize_sources(sources, tokenizer, limit, make_item, skip_invalid=skip_invalid, split=split, kind="prompt")
    return PromptDataset(items, num_skipped=skipped)


@dataclass(frozen=True)
class PromptCollator:
    """Left-pads prompts (generation appends on the right): input_ids, attention_mask (B, P),
    gt_answer, a list of B strings or Nones, row_fields, {field: list of B values} over
    every field any item has (None where an item lacks it; {} when there are none), and messages,
    the B prompts' messages (None for an item built without them)."""

    pad_token_id: int

    def __call__(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        width = max(len(item["input_ids"]) for item in items)
        ids = torch.full((len(items), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(items), width), dtype=torch.long)
        for row, item in enumerate(items):
            n = len(item["input_ids"])
            ids[row, width - n :] = torch.tensor(item["input_ids"])
            mask[row, width - n :] = 1
        return {
            "input_ids": ids,
            "attention_mask": mask,
            "gt_answer": [item["gt_answer"] for item in items],
            "row_fields": collate_row_fields(items),
            "messages": [item.get("messages") for item in items],
        }


def collate_row_fields(items: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """{field: [value of item 1, ..., item B]}, fields in first-seen order; items built without
    row fields (by hand, before they existed) have none."""
    rows = [item.get("row_fields") or {} for item in items]
    names = dict.fromkeys(name for row in rows for name in row)
    return {name: [row.get(name) for row in rows] for name in names}
