"""The one error type for bad input data: it names the source, the row and the field."""

from __future__ import annotations

from typing import Any

from olingo.errors import OlingoError


class DataError(OlingoError, ValueError):
    """A data problem found while loading or preparing a dataset.

    Attributes:
        source: the file path or dataset name the row came from.
        row: 1-based row number (the line number for JSONL, element index + 1 for JSON
            arrays, Parquet and Hugging Face datasets), or None for a whole-source problem.
        field: the offending field, e.g. "chosen" or "chosen[1].content", or None.
        reason: what is wrong, in words.

    ``str(err)`` reads ``data/pref.jsonl, row 7, field 'chosen': expected ..., got int``.
    """

    def __init__(self, source: str, row: int | None, field: str | None, reason: str) -> None:
        self.source = source
        self.row = row
        self.field = field
        self.reason = reason
        super().__init__(self._message())

    def _message(self) -> str:
        """Join the location parts that are known, then the reason."""
        where = [str(self.source)]
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.field is not None:
            where.append(f"field '{self.field}'")
        return f"{', '.join(where)}: {self.reason}"

    def __str__(self) -> str:
        return self._message()

    def __reduce__(self) -> tuple[Any, ...]:
        # The default pickling re-calls __init__ with the message only; DataLoader workers
        # pickle exceptions to send them to the main process, so keep all four attributes.
        return (type(self), (self.source, self.row, self.field, self.reason))


def type_name(value: object) -> str:
    """A JSON-flavoured name for a value's type, for 'expected X, got Y' messages."""
    names = {type(None): "null", dict: "object", list: "list", str: "string"}
    return names.get(type(value), type(value).__name__)
