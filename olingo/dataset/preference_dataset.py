"""Build a tokenised preference dataset, checking every row before training starts."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from torch.utils.data import Dataset

from olingo.dataset.chat_tokens import require_chat_template
from olingo.dataset.errors import DataError
from olingo.dataset.limits import LengthLimit, Overlong, OverlongRowError, as_limit
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
    overlong: Overlong = "error",
    length_key: str = "max_length",
) -> PreferenceDataset:
    """Load, validate and tokenise every row of ``sources`` (see ``load_raw_rows``).

    All rows are processed up front so bad data fails before training starts. With
    ``skip_invalid=False`` the first bad row raises its DataError; with ``True`` bad rows
    are left out, counted in ``num_skipped`` and reported in one warning per source.
    A source that cannot be read at all always raises, and so does ending with no rows.
    A side (prompt + response) longer than ``max_length`` is an error naming ``length_key``
    unless ``overlong`` is "truncate" (the prompt loses its start) or "skip".
    """
    limit = LengthLimit(max_length, length_key, overlong)

    def make_item(source: str, row: int, raw: dict[str, Any]) -> PreferenceItem:
        return tokenize_preference(parse_preference_row(raw, source, row), tokenizer, limit)

    items, num_skipped = tokenize_sources(sources, tokenizer, limit, make_item, skip_invalid=skip_invalid, split=split, kind="preference")
    return PreferenceDataset(items, num_skipped=num_skipped)


def tokenize_sources(
    sources: str | list[str],
    tokenizer: Any,
    max_length: int | LengthLimit,
    make_item: Callable[[str, int, dict[str, Any]], dict[str, list[int]]],
    *,
    skip_invalid: bool,
    split: str | None,
    kind: str,
    needs_template: bool = True,
) -> tuple[list[dict[str, list[int]]], int]:
    """Run ``make_item(source, row, raw)`` on every row of every source; the shared
    validate-everything-first loop of the preference, SFT and prompt datasets. A tokenizer
    without a chat template is refused (`ChatTemplateError`) before any data is read, unless
    ``needs_template`` is False (SFT's ``text`` rows need none; a conversation then raises it).
    Rows ``make_item`` finds too long (OverlongRowError) are left out under ``overlong="skip"``
    and counted apart from invalid rows; the returned count is of both."""
    source_list = [sources] if isinstance(sources, str) else list(sources)
    limit = as_limit(max_length)
    _check_arguments(source_list, tokenizer, limit.max_length, needs_template)
    items: list[dict[str, list[int]]] = []
    num_skipped = num_overlong = 0
    for source in source_list:
        kept, errors, overlong = _tokenize_source(source, make_item, skip_invalid, split, limit.overlong == "skip")
        if errors:
            _warn_skipped(source, errors, len(kept))
        items.extend(kept)
        num_skipped += len(errors)
        num_overlong += overlong
    limit.log_summary(kind, num_overlong)
    if not items:
        detail = f"all {num_skipped} rows are invalid" if num_skipped else "the data is empty"
        if num_overlong:
            detail = f"all {num_overlong + num_skipped} rows are longer than {limit.key}={limit.max_length} or invalid"
        raise DataError(", ".join(source_list), None, None, f"no usable {kind} rows: {detail}")
    logger.info("%s data: %d rows (%d invalid rows skipped)", kind, len(items), num_skipped)
    return items, num_skipped + num_overlong


def _check_arguments(sources: list[str], tokenizer: Any, max_length: int, needs_template: bool = True) -> None:
    """Fail on caller mistakes before reading any data."""
    if not sources:
        raise ValueError("build_preference_dataset needs at least one source")
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be a positive integer, got {max_length!r}")
    if needs_template:
        require_chat_template(tokenizer)


def _tokenize_source(
    source: str, make_item: Callable, skip_invalid: bool, split: str | None, skip_overlong: bool = False
) -> tuple[list[dict[str, list[int]]], list[DataError], int]:
    """Items of one source, the row errors skipped when ``skip_invalid``, and how many rows were
    left out for their length when ``skip_overlong``."""
    kept: list[dict[str, list[int]]] = []
    errors: list[DataError] = []
    overlong = 0
    for row, raw in iter_rows_or_errors(source, split):
        try:
            if isinstance(raw, DataError):  # the loader already rejected this row
                raise raw
            kept.append(make_item(source, row, raw))
        except DataError as err:
            if skip_overlong and isinstance(err, OverlongRowError):
                overlong += 1
            elif skip_invalid:
                errors.append(err)
            else:
                raise
    return kept, errors, overlong


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
