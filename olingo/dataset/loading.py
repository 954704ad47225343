"""Read raw rows (plain dicts) from local files, saved datasets or the Hugging Face Hub.

Every row comes with its 1-based row number so later errors can point at it: the line
number for JSONL (blank lines count, as in an editor), the element index + 1 otherwise.

Source kinds, chosen by what ``source`` names:

- ``*.jsonl``: one JSON object per line, parsed here line by line; blank lines are skipped.
- ``*.json``: a list of objects, or an object holding that list under the key ``split``
  (when given) or else under ``"data"`` or ``"train"``.
- ``*.parquet``: read with ``datasets``.
- a directory written by ``datasets.Dataset.save_to_disk`` (or ``DatasetDict``, then
  ``split`` picks the split).
- anything else: ``datasets.load_dataset(source, split=split)``, which covers Hub dataset ids
  and local directories of data files.

A split is named by ``split`` or by a suffix, ``source@split`` (``data/saved@test``,
``org/name@validation``; docs/data.md): ``@`` appears in no Hub id and no split name, and unlike
``:`` it is no Windows drive or ``builtin:`` prefix. A source that exists as written is taken
whole. A source with several splits and none named is an error listing them (a single split is
used); a single file (JSONL, Parquet) or a saved ``Dataset`` has no splits to name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from olingo.dataset.errors import DataError, type_name

RawRow = tuple[int, dict[str, Any]]
# A row, or the error that row produced: lets callers skip bad rows and keep reading.
RowOrError = tuple[int, dict[str, Any] | DataError]

_JSON_LIST_KEYS = ("data", "train")
SPLIT_SEPARATOR = "@"
# The names `datasets` allows for splits (datasets.splits), so every real split can be written.
_SPLIT_NAME = re.compile(r"\w+(\.\w+)*")

# `datasets` is imported inside the functions that use it: importing it takes about a
# second, and JSON/JSONL users never need it.


def load_raw_rows(source: str, split: str | None = None) -> Iterator[RawRow]:
    """Yield ``(row_number, row_dict)`` for every row of ``source``.

    Raises DataError at once for a source that cannot be read and, when iteration
    reaches it, for the first row that is not a JSON object (or not valid JSON).
    """
    return _raise_row_errors(iter_rows_or_errors(source, split))


def _raise_row_errors(rows: Iterator[RowOrError]) -> Iterator[RawRow]:
    """Pass rows through, raising the first row-level error instead of yielding it."""
    for row, value in rows:
        if isinstance(value, DataError):
            raise value
        yield row, value


def iter_rows_or_errors(source: str, split: str | None = None) -> Iterator[RowOrError]:
    """Like load_raw_rows, but a row-level error is yielded in place of its row.

    Whole-source problems (missing file, unreadable JSON document, unknown split) still
    raise, and they do so at once rather than on the first ``next``.
    """
    location, split = _source_and_split(source, split)
    path = Path(location).expanduser()
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".parquet") and not path.is_file():
        raise DataError(source, None, None, "no such file")
    if split is not None and suffix in (".jsonl", ".parquet"):
        reason = f"a {suffix} file has no splits (drop '{SPLIT_SEPARATOR}{split}'); splits belong to saved DatasetDicts, .json objects and hub datasets"
        raise DataError(source, None, None, reason)
    if suffix == ".jsonl":
        return _jsonl_rows(source, path)
    if suffix == ".json":
        return _check_objects(source, _json_document_rows(source, path, split))
    if suffix == ".parquet":
        return _check_objects(source, enumerate(_load_parquet(source, path), start=1))
    if path.is_dir() and _is_saved_dataset(path):
        return _check_objects(source, enumerate(_load_saved(source, path, split), start=1))
    return _check_objects(source, enumerate(_load_with_datasets(source, location, split), start=1))


def split_source(source: str) -> tuple[str, str | None]:
    """``(location, split)`` of ``location@split``; ``(source, None)`` when there is no such
    suffix, or when ``source`` exists as written (a file or directory whose name holds an @)."""
    location, separator, split = source.rpartition(SPLIT_SEPARATOR)
    if not separator or not location or not _SPLIT_NAME.fullmatch(split) or Path(source).expanduser().exists():
        return source, None
    return location, split


def _source_and_split(source: str, split: str | None) -> tuple[str, str | None]:
    """The location to read and the split to pick: the ``@split`` suffix or ``split``; both,
    naming different splits, is an error."""
    location, named = split_source(source)
    if named is not None and split is not None and named != split:
        raise DataError(source, None, None, f"the name picks split '{named}' but split='{split}' was also given")
    return location, named or split


def pick_split(source: str, splits: list[str], split: str | None) -> str:
    """The split to read: ``split`` when it exists, the only one when there is one, else an error
    listing them (reading 'train' silently would evaluate on the training rows)."""
    names = sorted(splits)
    if split is not None:
        if split not in splits:
            raise DataError(source, None, None, f"no split '{split}'; the splits are {names}")
        return split
    if len(names) == 1:
        return names[0]
    examples = " or ".join(f"'{source}{SPLIT_SEPARATOR}{name}'" for name in names[:2])
    raise DataError(source, None, None, f"has several splits, {names}: pick one, e.g. {examples} (docs/data.md)")


def _utf8_error(source: str, row: int | None, err: UnicodeDecodeError, line_start: int) -> DataError:
    """A byte that is not UTF-8: where it is (row, file byte offset) and what it is."""
    offset = line_start + err.start
    bad = err.object[err.start : err.start + 1].hex()
    return DataError(source, row, None, f"not valid UTF-8: byte 0x{bad} at byte offset {offset} of the file (save it as UTF-8)")


def _jsonl_rows(source: str, path: Path) -> Iterator[RowOrError]:
    """Parse a JSONL file one line at a time so a bad line reports its own line number.

    Lines are read as bytes and decoded one by one, so a line that is not UTF-8 is a row error
    with its byte offset (skippable with skip_invalid), not a crash of the whole read."""
    offset = 0
    with path.open("rb") as raw_lines:
        for line_number, raw in enumerate(raw_lines, start=1):
            line_start, offset = offset, offset + len(raw)
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                yield line_number, _utf8_error(source, line_number, err, line_start)
                continue
            if not line.strip():
                continue
            try:
                value = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as exc:
                reason = f"invalid JSON: {exc.msg} at column {exc.pos + 1}"
                yield line_number, DataError(source, line_number, None, reason)
                continue
            yield line_number, _as_object(source, line_number, value)


def _json_document_rows(source: str, path: Path, split: str | None) -> Iterator[tuple[int, Any]]:
    """Read a whole ``.json`` document and enumerate the list of rows it holds."""
    data = path.read_bytes()
    try:
        document = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise DataError(source, None, None, f"line {line}: " + _utf8_error(source, None, err, 0).reason) from None
    except json.JSONDecodeError as exc:
        # Rows are list elements here, so a syntax error has no row yet: name the line.
        reason = f"invalid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        raise DataError(source, None, None, reason) from exc
    return enumerate(_row_list(source, document, split), start=1)


def _row_list(source: str, document: Any, split: str | None) -> list[Any]:
    """The list of rows in a JSON document: the document itself or one of its keys."""
    if isinstance(document, list):
        return document
    keys = (split,) if split else _JSON_LIST_KEYS
    if isinstance(document, dict) and not split:
        lists = [key for key, value in document.items() if isinstance(value, list)]
        if len(lists) > 1:
            pick_split(source, lists, None)  # several lists of rows: which is meant is unsaid
    if isinstance(document, dict):
        for key in keys:
            if isinstance(document.get(key), list):
                return document[key]
    wanted = " or ".join(f"'{key}'" for key in keys)
    reason = f"expected a list of rows or an object with a list under {wanted}, got {type_name(document)}"
    if isinstance(document, dict):
        reason += f" with keys {sorted(document)}"
    raise DataError(source, None, None, reason)


def _check_objects(source: str, rows: Iterable[tuple[int, Any]]) -> Iterator[RowOrError]:
    """Pass dict rows through and turn any other value into a row-level DataError."""
    for row, value in rows:
        yield row, _as_object(source, row, value)


def _as_object(source: str, row: int, value: Any) -> dict[str, Any] | DataError:
    """The row itself when it is a JSON object, else the error describing it."""
    if isinstance(value, dict):
        return value
    return DataError(source, row, None, f"expected a JSON object, got {type_name(value)}")


def _is_saved_dataset(path: Path) -> bool:
    """Whether ``path`` was written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``."""
    return (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()


def _load_parquet(source: str, path: Path) -> Any:
    """A ``datasets.Dataset`` over one Parquet file."""
    import datasets

    try:
        return datasets.load_dataset("parquet", data_files=str(path), split="train")
    except (OSError, ValueError) as exc:
        raise DataError(source, None, None, f"cannot read Parquet file: {exc}") from exc


def _load_saved(source: str, path: Path, split: str | None) -> Any:
    """A dataset saved with ``save_to_disk``; for a DatasetDict, the split ``pick_split`` picks."""
    import datasets

    loaded = datasets.load_from_disk(str(path))
    if not isinstance(loaded, datasets.DatasetDict):
        if split is not None:
            raise DataError(source, None, None, f"a saved Dataset has no splits (drop '{SPLIT_SEPARATOR}{split}'); only a saved DatasetDict has")
        return loaded
    return loaded[pick_split(source, list(loaded), split)]


def _load_with_datasets(source: str, location: str, split: str | None) -> Any:
    """``datasets.load_dataset(location)``: a Hub id, or a local directory of data files; with
    no split named, every split is loaded and ``pick_split`` chooses (or lists them)."""
    import datasets

    try:
        loaded = datasets.load_dataset(location, split=split)
    except (OSError, ValueError) as exc:
        # DatasetNotFoundError and the offline/connection errors are OSErrors; a wrong
        # split is a ValueError. Say plainly that the name was not a local file either.
        reason = (
            "not a .jsonl/.json/.parquet file or a saved dataset directory, and "
            f"datasets.load_dataset could not load it: {exc}"
        )
        raise DataError(source, None, None, reason) from exc
    if isinstance(loaded, datasets.DatasetDict):
        return loaded[pick_split(source, list(loaded), None)]
    return loaded
