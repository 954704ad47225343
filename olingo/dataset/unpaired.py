"""Unpaired preference data for KTO: a prompt, one completion, and whether it is desirable.

Accepted rows:
    {"prompt": str | messages, "completion": str | messages, "label": true | false}   (TRL)
    any preference pair accepted by ``parse_preference_row`` (told apart by ``chosen`` or
    ``rejected``), which gives two examples: (prompt, chosen, true), (prompt, rejected, false).

KTO's reference point is a KL estimate on mismatched prompt/completion pairs, so every item
also carries the completion of another item with a different prompt (its KL partner). The
partner depends only on the item's index in the dataset, never on batching or shuffling.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import Dataset

from olingo.dataset.chat_tokens import left_truncate
from olingo.dataset.collator import check_pad_token_id, length_mask, pad_rows, stack_ref_fields
from olingo.dataset.errors import DataError, type_name
from olingo.dataset.limits import LengthLimit, Overlong, as_limit
from olingo.dataset.messages import Message, RowRef, missing_reason, parse_turns
from olingo.dataset.preference import (
    check_response,
    parse_preference_row,
    require_field,
    tokenize_prompt_response,
)
from olingo.dataset.preference_dataset import tokenize_sources

logger = logging.getLogger("olingo.dataset")

UnpairedItem = dict[str, Any]


@dataclass(frozen=True)
class UnpairedExample:
    """One validated completion with its label (True: desirable).

    ``completion_field`` is the row field the completion came from ("completion", or
    "chosen"/"rejected" for a pair), so a tokenisation error names it. ``source``, ``row``
    and ``completion_field`` do not take part in equality.
    """

    prompt: list[Message]
    completion: list[Message]
    label: bool
    source: str | None = field(default=None, compare=False)
    row: int | None = field(default=None, compare=False)
    completion_field: str = field(default="completion", compare=False)


def parse_unpaired_row(
    raw: dict[str, Any], source: str = "<data>", row: int | None = None
) -> list[UnpairedExample]:
    """Validate one raw row: an unpaired row gives one example, a preference pair two.

    Raises DataError naming ``source``, ``row`` and the field for a missing field, a label
    that is not a JSON boolean, an empty completion or one that does not open with an
    assistant turn (and for every problem ``parse_preference_row`` finds in a pair).
    """
    if raw.get("chosen") is not None or raw.get("rejected") is not None:
        pair = parse_preference_row(raw, source, row)
        return [
            UnpairedExample(pair.prompt, pair.chosen, True, source, row, "chosen"),
            UnpairedExample(pair.prompt, pair.rejected, False, source, row, "rejected"),
        ]
    ref = RowRef(source, row)
    if raw.get("prompt") is None:
        expected = "expected 'prompt', 'completion' and 'label', or a preference pair"
        raise ref.error("prompt", f"{missing_reason(raw)}; {expected}")
    prompt = parse_turns(raw["prompt"], "prompt", ref, role_key="role", string_role="user")
    value = require_field(raw, "completion", ref)
    completion = parse_turns(value, "completion", ref, role_key="role", string_role="assistant")
    first_index = None if isinstance(value, str) else 0
    check_response(completion, "completion", ref, role_key="role", first_index=first_index)
    label = _parse_label(raw, ref)
    return [UnpairedExample(prompt, completion, label, source=source, row=row)]


def _parse_label(raw: dict[str, Any], ref: RowRef) -> bool:
    """``raw["label"]`` if it is a boolean; 1/0 or "true" are refused, not guessed at."""
    label = require_field(raw, "label", ref)
    if not isinstance(label, bool):
        reason = f"expected true or false (a JSON boolean), got {type_name(label)} {label!r}"
        raise ref.error("label", reason)
    return label


def tokenize_unpaired(example: UnpairedExample, tokenizer: Any, max_length: int | LengthLimit) -> UnpairedItem:
    """``{"prompt_ids", "completion_ids", "completion_mask", "label"}`` for ``example``.

    ``completion_mask`` is aligned with ``completion_ids`` (1 on assistant-turn tokens).
    When prompt + completion exceed the limit, a LengthLimit applies its ``overlong`` rule; a
    plain int (or "truncate") cuts tokens from the prompt's start. A completion that alone
    exceeds it raises DataError naming the completion's field.
    """
    limit, ref = as_limit(max_length), RowRef(example.source or "<data>", example.row)
    prompt_ids, completion_ids, completion_mask = tokenize_prompt_response(
        example.prompt, example.completion, example.completion_field, tokenizer, limit, ref
    )
    length = len(prompt_ids) + len(completion_ids)
    limit.check(length, ref, example.completion_field, f"the prompt + {example.completion_field} (chat template included)")
    cut = max(0, length - limit.max_length)
    return {
        "prompt_ids": prompt_ids[cut:],
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "label": example.label,
    }


class UnpairedDataset(Dataset):
    """Tokenised unpaired examples; each item is a dict of unpadded python lists:

    ``prompt_ids``, ``completion_ids``, ``completion_mask`` (aligned with the completion),
    ``label`` (bool, True: desirable), and ``kl_completion_ids``/``kl_completion_mask``,
    the KL partner's completion (see ``kl_partners``). UnpairedCollator pads a batch.
    ``num_skipped`` counts invalid rows left out by ``skip_invalid=True``.
    """

    def __init__(self, items: list[UnpairedItem], num_skipped: int = 0) -> None:
        self.items = items
        self.num_skipped = num_skipped
        self.num_desirable = sum(1 for item in items if item["label"])
        self.num_undesirable = len(items) - self.num_desirable

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> UnpairedItem:
        return self.items[index]


def build_unpaired_dataset(
    sources: str | list[str],
    tokenizer: Any,
    max_length: int,
    *,
    skip_invalid: bool = False,
    split: str | None = None,
    overlong: Overlong = "error",
    length_key: str = "max_length",
) -> UnpairedDataset:
    """Load, validate and tokenise every row of ``sources``, then pair items for the KL term.

    Bad rows fail (or, with ``skip_invalid``, are skipped) as in ``build_preference_dataset``,
    and so do rows longer than ``max_length`` (``overlong``, ``length_key``).
    A dataset whose items all share one prompt raises DataError: it has no mismatched pairs.
    Having no desirable or no undesirable items is allowed (logged): the trainer decides.
    """

    limit = LengthLimit(max_length, length_key, overlong)

    def make_item(source: str, row: int, raw: dict[str, Any]) -> list[UnpairedItem]:
        examples = parse_unpaired_row(raw, source, row)
        return [tokenize_unpaired(example, tokenizer, limit) for example in examples]

    per_row, num_skipped = tokenize_sources(
        sources, tokenizer, limit, make_item, skip_invalid=skip_invalid, split=split,
        kind="unpaired",
    )
    items: list[UnpairedItem] = [item for row_items in per_row for item in row_items]
    source_names = sources if isinstance(sources, str) else ", ".join(sources)
    partners = kl_partners([item["prompt_ids"] for item in items], source_names)
    for item, j in zip(items, partners, strict=True):
        item["kl_completion_ids"] = items[j]["completion_ids"]
        item["kl_completion_mask"] = items[j]["completion_mask"]
    dataset = UnpairedDataset(items, num_skipped=num_skipped)
    if not dataset.num_desirable or not dataset.num_undesirable:
        logger.info(
            "unpaired data has %d desirable and %d undesirable items",
            dataset.num_desirable,
            dataset.num_undesirable,
        )
    return dataset


def kl_partners(prompts: Sequence[Sequence[int]], source: str) -> list[int]:
    """For each item i, the index j of the item whose completion it is paired with for KL.

    j starts at (i + N//2) % N and moves on (cyclically) while item j's prompt equals item
    i's. ``next_other[k]``, the first index after k whose prompt differs from k's, makes
    that walk one step, so this is O(N) however many items share a prompt. Raises DataError
    naming ``source`` when every prompt is the same (there is no mismatched pair).
    """
    n = len(prompts)
    differs = [prompts[k] != prompts[(k + 1) % n] for k in range(n)]
    if not any(differs):
        reason = "KTO needs at least two different prompts to estimate its reference point"
        raise DataError(source, None, None, f"{reason}; every item has the same prompt")
    next_other = [0] * n
    last = differs.index(True)
    for step in range(n):  # backwards round the cycle from an index whose successor differs
        k = (last - step) % n
        after = (k + 1) % n
        next_other[k] = after if differs[k] else next_other[after]
    partners = []
    for i in range(n):
        j = (i + n // 2) % n
        partners.append(next_other[j] if prompts[j] == prompts[i] else j)
    return partners


@dataclass(frozen=True)
class UnpairedCollator:
    """Collate UnpairedDataset items into right-padded tensors for KTO.

    Returns:
        input_ids, attention_mask, loss_mask: (B, L) long, prompt + completion; loss_mask is
            the completion mask at the completion's positions, 0 on the prompt and padding.
        label: (B,) bool, True for a desirable completion.
        kl_input_ids, kl_attention_mask, kl_loss_mask: (B, L') long, the same for prompt +
            the KL partner's completion.
        ref_*: (B,) float32, each ``ref_`` float field of the items (precomputed by a trainer).
    L and L' are the longest rows of this batch. With ``max_length`` set, a row longer than
    it loses tokens from its start (the prompt's); the KL rows are the ones that need it.
    """

    pad_token_id: int
    max_length: int | None = None

    def __post_init__(self) -> None:
        check_pad_token_id(self.pad_token_id)
        size = self.max_length
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(f"max_length must be a positive integer or None, got {size!r}")

    def __call__(self, items: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        if not items:
            raise ValueError("cannot collate an empty batch")
        batch = {**self._pad(items, ""), **self._pad(items, "kl_")}
        batch["label"] = torch.tensor([bool(it["label"]) for it in items], dtype=torch.bool)
        batch.update(stack_ref_fields(items))
        return batch

    def _join(
        self, prompt: Sequence[int], completion: Sequence[int], completion_mask: Sequence[int]
    ) -> tuple[list[int], list[int]]:
        """(ids, loss mask) of prompt + completion, left-truncated to ``max_length``."""
        ids, mask = [*prompt, *completion], [0] * len(prompt) + list(completion_mask)
        return (ids, mask) if self.max_length is None else left_truncate(ids, mask, self.max_length)

    def _pad(self, items: Sequence[Mapping[str, Any]], prefix: str) -> dict[str, torch.Tensor]:
        """``{prefix}input_ids``, ``{prefix}attention_mask``, ``{prefix}loss_mask``, all (B, L).

        Each row is the item's prompt + its ``{prefix}completion``.
        """
        ids_key, mask_key = f"{prefix}completion_ids", f"{prefix}completion_mask"
        rows = [self._join(it["prompt_ids"], it[ids_key], it[mask_key]) for it in items]
        length = max(len(ids) for ids, _ in rows)
        return {
            f"{prefix}input_ids": pad_rows([ids for ids, _ in rows], length, self.pad_token_id),
            f"{prefix}attention_mask": length_mask([len(ids) for ids, _ in rows], length),
            f"{prefix}loss_mask": pad_rows([mask for _, mask in rows], length, 0),
        }
