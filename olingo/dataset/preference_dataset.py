"""Build a tokenised preference dataset, checking every row before training starts."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from torch.utils.data import Dataset

from olingo.dataset.chat_tokens import require_chat_template
from olingo.dataset.errors import DataError
from olingo.dataset.loading import iter_rows_or_errors
from olingo.dataset.preference import parse_preference_row, tokenize_preference

logger = logging.getLogger("olingo.dataset")

_REASONS_LOGGED = 3

PreferenceItem = dict[str, list[int]]


class PreferenceDataset(Dataset):
    """Tokenised preference pairs: items are ``{"chosen_input_ids", "chosen_loss_mask",
    "rejected_input_ids", "rejected_loss_mask"}``.

    Each value is a python list, unpadded (the masks are 1 on the response's assistant tokens);
    PreferenceCollator pads a batch.
    ``num_skipped`` counts the invalid rows left out by ``skip_invalid=True``.
    """

    def __init__(self, items: list[PreferenceItem], num_skipped: int = 0) -> None:
        self.items = items
        self.num_skipped = num_skipped

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> PreferenceItem:
        return self.items[index]


def build_preference_dataset(
    sources: str | list[str],
    tokenizer: Any,
    max_length: int,
    *,
    skip_invalid: bool = False,
    split: str | None = None,
) -> PreferenceDataset:
    """Load, validate and tokenise every row of ``sources`` (see ``load_raw_rows``).

    All rows are processed up front so bad data fails before training starts. With
    ``skip_invalid=False`` the first bad row raises its DataError; with ``True`` bad rows
    are left out, counted in ``num_skipped`` and reported in one warning per source.
    A source that cannot be read at all always raises, and so does ending with no rows.
    """

    def make_item(source: str, row: int, raw: dict[str, Any]) -> PreferenceItem:
        return tokenize_preference(parse_preference_row(raw, source, row), tokenizer, max_length)

    items, num_skipped = tokenize_sources(sources, tokenizer, max_length, make_item, skip_invalid=skip_invalid, split=split, kind="preference")
    return PreferenceDataset(items, num_skipped=num_skipped)


def tokenize_sources(
    sources: str | list[str],
    tokenizer: Any,
    max_length: int,
    make_item: Callable[[str, int, dict[str, Any]], dict[str, list[int]]],
    *,
    skip_invalid: bool,
    split: str | None,
    kind: str,
) -> tuple[list[dict[str, list[int]]], int]:
    """Run ``make_item(source, row, raw)`` on every row of every source; the shared
    validate-everything-first loop of the preference, SFT and prompt datasets. A tokenizer
    without a chat template is refused (`ChatTemplateError`) before any data is read."""
    source_list = [sources] if isinstance(sources, str) else list(sources)
    _check_arguments(source_list, tokenizer, max_length)
    items: list[dict[str, list[int]]] = []
    num_skipped = 0
    for source in source_list:
        kept, errors = _tokenize_source(source, make_item, skip_invalid, split)
        if errors:
            _warn_skipped(source, errors, len(kept))
        items.extend(kept)
        num_skipped += len(errors)
    if not items:
        detail = f"all {num_skipped} rows are invalid" if num_skipped else "the data is empty"
        raise DataError(", ".join(source_list), None, None, f"no usable {kind} rows: {detail}")
    logger.info("%s data: %d rows (%d invalid rows skipped)", kind, len(items), num_skipped)
    return items, num_skipped


def _check_arguments(sources: list[str], tokenizer: Any, max_length: int) -> None:
    """Fail on caller mistakes before reading any data."""
    if not sources:
        raise ValueError("build_preference_dataset needs at least one source")
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be a positive integer, got {max_length!r}")
    require_chat_template(tokenizer)


def _tokenize_source(
    source: str, make_item: Callable, skip_invalid: bool, split: str | None
) -> tuple[list[dict[str, list[int]]], list[DataError]]:
    """Items of one source, and the row errors skipped when ``skip_invalid``."""
    kept: list[dict[str, list[int]]] = []
    errors: list[DataError] = []
    for row, raw in iter_rows_or_errors(source, split):
        try:
            if isinstance(raw, DataError):  # the loader already rejected this row
                raise raw
            kept.append(make_item(source, row, raw))
        except DataError as err:
            if not skip_invalid:
                raise
            errors.append(err)
    return kept, errors


def _warn_skipped(source: str, errors: list[DataError], num_kept: int) -> None:
    """One warning per source: how many rows were skipped and the first few reasons."""
    shown = "; ".join(str(err) for err in errors[:_REASONS_LOGGED])
    more = f" (and {len(errors) - _REASONS_LOGGED} more)" if len(errors) > _REASONS_LOGGED else ""
    logger.warning(
        "%s: skipped %d invalid rows, kept %d. First: %s%s",
        source,
        len(errors),
        num_kept,
        shown,
        more,
    )
