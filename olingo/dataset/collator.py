"""Pad a batch of preference pairs to one common length for a single (2B, L) forward.

The padding and ``ref_*`` stacking helpers are shared with the unpaired (KTO) collator.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

_SIDES = ("chosen", "rejected")
REF_PREFIX = "ref_"


@dataclass(frozen=True)
class PreferenceCollator:
    """Collate PreferenceDataset items into padded ``(B, L)`` long tensors.

    Returns ``chosen_input_ids``, ``chosen_attention_mask``, ``rejected_input_ids`` and
    ``rejected_attention_mask``; ``chosen_loss_mask`` and ``rejected_loss_mask`` (0 on
    padding) when the items carry them; and every ``ref_*`` float field of the items (e.g.
    ``ref_chosen_logps``, reference log-probs a trainer precomputed) as a ``(B,)`` float32
    tensor. L is the longest chosen-or-rejected row of this batch, the same for both sides,
    so a trainer can ``torch.cat`` them into one (2B, L) forward. ``padding_side`` is
    "right" (real tokens first) or "left" (padding first).
    """

    pad_token_id: int
    padding_side: str = "right"

    def __post_init__(self) -> None:
        check_pad_token_id(self.pad_token_id)
        if self.padding_side not in ("left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {self.padding_side!r}")

    def __call__(self, items: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        if not items:
            raise ValueError("cannot collate an empty batch")
        length = max(len(item[f"{side}_input_ids"]) for item in items for side in _SIDES)
        batch: dict[str, torch.Tensor] = {}
        pad_side = self.padding_side
        for side in _SIDES:
            rows = [item[f"{side}_input_ids"] for item in items]
            batch[f"{side}_input_ids"] = pad_rows(rows, length, self.pad_token_id, pad_side)
            batch[f"{side}_attention_mask"] = length_mask([len(row) for row in rows], length, pad_side)
            if f"{side}_loss_mask" in items[0]:
                masks = [item[f"{side}_loss_mask"] for item in items]
                batch[f"{side}_loss_mask"] = pad_rows(masks, length, 0, pad_side)
        batch.update(stack_ref_fields(items))
        return batch


def check_pad_token_id(pad_token_id: Any) -> None:
    """Refuse a pad token id that is not an int (a tokenizer's None, most often)."""
    if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int):
        raise ValueError(
            f"pad_token_id must be an int, got {pad_token_id!r}; a tokenizer without a "
            "pad token can use its eos token id"
        )


def pad_rows(
    rows: Sequence[Sequence[int]], length: int, value: int, padding_side: str = "right"
) -> torch.Tensor:
    """A ``(len(rows), length)`` long tensor of ``rows``, filled out with ``value``.

    "right" puts each row at the start (padding after it), "left" at the end.
    """
    out = torch.full((len(rows), length), value, dtype=torch.long)
    for i, row in enumerate(rows):
        start = 0 if padding_side == "right" else length - len(row)
        out[i, start : start + len(row)] = torch.as_tensor(row, dtype=torch.long)
    return out


def length_mask(lengths: Sequence[int], length: int, padding_side: str = "right") -> torch.Tensor:
    """The ``(len(lengths), length)`` long attention mask of rows of these lengths, padded on
    ``padding_side`` (what ``pad_rows`` of all-ones rows gives, without a copy per row)."""
    positions = torch.arange(length)
    n = torch.as_tensor(list(lengths), dtype=torch.long)[:, None]
    keep = positions < n if padding_side == "right" else positions >= length - n
    return keep.long()


def stack_ref_fields(items: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
    """Each ``ref_*`` field holding a python float, stacked over the batch into ``(B,)`` float32.

    Trainers that precompute reference-model log-probs store them on the items under
    ``ref_`` names; they travel with their rows through shuffling and collation.
    """
    names = [k for k, v in items[0].items() if k.startswith(REF_PREFIX) and isinstance(v, float)]
    return {k: torch.tensor([item[k] for item in items], dtype=torch.float32) for k in names}
