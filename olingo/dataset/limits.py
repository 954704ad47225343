"""Token limits on data rows: what happens to a row longer than its limit (docs/data.md).

By default such a row is an error naming the file, the row, its length and the config key to
raise: cutting it would silently train on (or roll out from) something else than the data says.
``overlong="truncate"`` cuts it the way its dataset documents (SFT rows keep their beginning,
prompts and preference rows their end), ``overlong="skip"`` leaves it out; both log how many rows
they touched, once per dataset.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

from olingo.dataset.errors import DataError
from olingo.dataset.messages import RowRef

logger = logging.getLogger("olingo.dataset")

Overlong = Literal["error", "truncate", "skip"]
OVERLONG_CHOICES: tuple[str, ...] = ("error", "truncate", "skip")
# The one config key, in every stage's data section, that chooses among OVERLONG_CHOICES.
OVERLONG_KEY = "data.overlong"


class OverlongRowError(DataError):
    """A row longer than its token limit (``overlong`` "error"), or one to leave out ("skip")."""


@dataclass
class LengthLimit:
    """A token limit, the config key that sets it, and what a longer row gets.

    ``check`` is called with a row's full length before any cut; it raises OverlongRowError for
    "error" and "skip" (the dataset builder drops the row for "skip") and records the row for
    "truncate", so the builder can log how many rows it cut.
    """

    max_length: int
    key: str = "max_length"
    overlong: Overlong = "error"
    truncated_rows: set[tuple[str, int | None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.overlong not in OVERLONG_CHOICES:
            raise ValueError(f"overlong must be one of {', '.join(OVERLONG_CHOICES)}, got {self.overlong!r}")

    def check(self, length: int, ref: RowRef, field_name: str | None, what: str) -> bool:
        """Whether a row of ``length`` tokens must be cut (only ever with "truncate").

        ``what`` names the measured sequence in the error ("the prompt", "the conversation").
        """
        if length <= self.max_length:
            return False
        if self.overlong == "truncate":
            self.truncated_rows.add((ref.source, ref.row))
            return True
        raise OverlongRowError(ref.source, ref.row, field_name, self.too_long(what, length))

    def too_long(self, what: str, length: int) -> str:
        """'<what> is N tokens, more than <key>=M: raise <key>, or set data.overlong=...'."""
        return (
            f"{what} is {length} tokens, more than {self.key}={self.max_length}: raise {self.key}, "
            f"or set {OVERLONG_KEY}=truncate (cut such rows) or {OVERLONG_KEY}=skip (leave them out)"
        )

    def log_summary(self, kind: str, num_skipped: int) -> None:
        """One log line for the rows this limit truncated or skipped, when there were any."""
        if self.truncated_rows:
            logger.warning("%s data: truncated %d rows longer than %s=%d (%s=truncate)",
                           kind, len(self.truncated_rows), self.key, self.max_length, OVERLONG_KEY)
        if num_skipped:
            logger.warning("%s data: skipped %d rows longer than %s=%d (%s=skip)", kind, num_skipped, self.key, self.max_length, OVERLONG_KEY)


def as_limit(max_length: int | LengthLimit) -> LengthLimit:
    """A LengthLimit from a tokenize function's argument: a plain int keeps the old contract of
    those low-level functions (cut to fit); dataset builders pass a LengthLimit."""
    if isinstance(max_length, LengthLimit):
        return max_length
    return LengthLimit(max_length, overlong="truncate")


# The `data.overlong` field's --help line, shared by every stage's data section.
OVERLONG_DESCRIPTION = (
    "a row longer than its max length: error (stop, naming file, row, length and the key to raise), "
    "truncate (cut it: prompts and preference rows lose their start, SFT rows their end; logs how many) "
    "or skip (leave it out; logs how many); docs/data.md"
)
