"""Pad a batch of preference pairs to one common length for a single (2B, L) forward."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

_SIDES = ("chosen", "rejected")


@dataclass(frozen=True)
class PreferenceCollator:
    """Collate PreferenceDataset items into padded ``(B, L)`` long tensors.

    Returns ``chosen_input_ids``, ``chosen_attention_mask``, ``rejected_input_ids`` and
    ``rejected_attention_mask``. L is the longest chosen-or-rejected row of this batch, the
    same for both sides, so a trainer can ``torch.cat`` them into one (2B, L) forward.
    ``padding_side`` is "right" (real tokens first) or "left" (padding first).
    """

    pad_token_id: int
    padding_side: str = "right"

    def __post_init__(self) -> None:
        if isinstance(self.pad_token_id, bool) or not isinstance(self.pad_token_id, int):
            raise ValueError(
                f"pad_token_id must be an int, got {self.pad_token_id!r}; a tokenizer without a "
                "pad token can use its eos token id"
            )
        if self.padding_side not in ("left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {self.padding_side!r}")

    def __call__(self, items: Sequence[Mapping[str, Sequence[int]]]) -> dict[str, torch.Tensor]:
        if not items:
            raise ValueError("cannot collate an empty batch")
        length = max(len(item[f"{side}_input_ids"]) for item in items for side in _SIDES)
        batch: dict[str, torch.Tensor] = {}
        for side in _SIDES:
            rows = [item[f"{side}_input_ids"] for item in items]
            batch[f"{side}_input_ids"], batch[f"{side}_attention_mask"] = self._pad(rows, length)
        return batch

    def _pad(self, rows: list[Sequence[int]], length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(ids, attention mask), both (len(rows), length), padded on ``padding_side``."""
        ids = torch.full((len(rows), length), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for i, row in enumerate(rows):
            n = len(row)
            start = 0 if self.padding_side == "right" else length - n
            ids[i, start : start + n] = torch.as_tensor(row, dtype=torch.long)
            mask[i, start : start + n] = 1
        return ids, mask
