"""Reference log-probs computed once before training (`precompute_ref_log_probs`), cached beside
the run, and added to every batch as columns; the reference model can then be freed.

A reference log-prob is a pure function of the tokens of a row and of the reference weights, so
the cache is a table from a row's content (`item_key`: a hash of its token lists) to its values,
in a file named after the reference weights (`model_fingerprint`). Changing the data, the
tokenizer or `max_length` changes rows, so new rows are computed; changing the reference changes
the file. Rows are computed a slice per rank and summed across ranks, so every rank ends with the
whole table; rank 0 writes the file.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

logger = logging.getLogger("olingo.trainer")

Columns = Callable[[dict[str, Any]], torch.Tensor]  # a collated batch on device -> (B, len(names))


def item_key(item: Mapping[str, Any]) -> str:
    """A hash of a dataset row's content (its token lists, labels), ignoring `ref_*` columns."""
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(item):
        if name.startswith("ref_"):
            continue
        value = item[name]
        if isinstance(value, torch.Tensor):
            value = value.tolist()
        array = np.asarray(value)
        digest.update(f"{name}:{array.dtype.str}:{array.shape}:".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def model_fingerprint(model: torch.nn.Module, all_reduce_sum: Callable[[torch.Tensor], torch.Tensor], skip: Callable[[str], bool] = lambda name: False) -> str:
    """A short hash of a model's weights: names, shapes and float64 sum and sum of squares of
    each parameter (a sharded parameter's shard sums are added across ranks first). Any real
    change of the weights changes it; hashing every byte of a large model would cost seconds."""
    names, sharded, whole = [], [], []
    for name, param in model.named_parameters():
        if skip(name):
            continue
        local = param.detach()
        is_sharded = hasattr(local, "to_local")
        x = local.to_local() if is_sharded else local
        # float64 accumulation without a float64 copy of the tensor
        moments = torch.stack([x.sum(dtype=torch.float64), torch.linalg.vector_norm(x, dtype=torch.float64) ** 2])
        (sharded if is_sharded else whole).append(moments)
        names.append(f"{name}:{tuple(param.shape)}:{param.dtype}")
    digest = hashlib.sha256("|".join(names).encode())
    if sharded:
        whole.append(all_reduce_sum(torch.stack(sharded)).flatten())
    values = torch.cat([t.flatten().cpu() for t in whole]) if whole else torch.zeros(0)
    digest.update(",".join(f"{v:.9e}" for v in values.tolist()).encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class WithReferenceColumns:
    """A collate function that adds the precomputed `names` columns, (B,) float32 each, to the
    batches of `collate`; `table` maps `item_key(row)` to the row's values. A dataset returns the
    same row objects every epoch, so each row is hashed once (`seen` holds the row, so its id
    cannot be reused by another object)."""

    collate: Callable[[list[Any]], dict[str, Any]]
    table: Mapping[str, tuple[float, ...]]
    names: tuple[str, ...]
    seen: dict[int, tuple[Any, tuple[float, ...]]] = field(default_factory=dict)

    def values(self, item: Any) -> tuple[float, ...]:
        known = self.seen.get(id(item))
        if known is None or known[0] is not item:
            known = self.seen[id(item)] = (item, self.table[item_key(item)])
        return known[1]

    def __call__(self, items: list[Any]) -> dict[str, Any]:
        batch = self.collate(items)
        rows = torch.tensor([self.values(item) for item in items], dtype=torch.float64)
        for j, name in enumerate(self.names):
            batch[name] = rows[:, j].to(torch.float32)
        return batch


@dataclass
class ReferencePrecompute:
    """One pass of the reference over datasets, sharded over ranks, with a file cache.

    `columns` computes the values of a collated batch (no gradient); `cache_file` is None for
    no file. The forward runs under `torch.no_grad()` in eval mode of whatever `columns` calls,
    packed when the trainer packs; packed and padded values agree to float rounding, so a run
    with either setting reads the same cache file.
    """

    columns: Columns
    names: tuple[str, ...]
    batch_size: int
    device: torch.device
    rank: int
    world_size: int
    all_reduce_sum: Callable[[torch.Tensor], torch.Tensor]
    barrier: Callable[[], None]
    cache_file: Path | None = None
    progress: bool = True

    def table(self, dataset: Sequence[Any], collate: Callable[[list[Any]], dict[str, Any]]) -> dict[str, tuple[float, ...]]:
        """Values of every row of `dataset`: read from the cache, computed where missing."""
        keys = [item_key(dataset[i]) for i in range(len(dataset))]
        table = self._read()
        cached = sum(key in table for key in keys)
        missing = sorted({k: i for i, k in reversed(list(enumerate(keys))) if k not in table}.values())  # first row of each new key
        if missing:
            values = self._compute(dataset, collate, missing)
            table.update({keys[i]: tuple(row) for i, row in zip(missing, values.tolist(), strict=True)})
            self._write(table)
        logger.info(
            "reference log-probs of %d rows: %d read from %s, %d computed (%d distinct)",
            len(keys), cached, self.cache_file or "-", len(keys) - cached, len(missing),
        )
        return table

    def _compute(self, dataset: Sequence[Any], collate: Callable, rows: list[int]) -> torch.Tensor:
        """(len(rows), len(names)) float64 values, rows split over ranks and summed back.
        Every rank runs the same number of batches (a sharded model's forward is collective)."""
        out = torch.zeros(len(rows), len(self.names), dtype=torch.float64, device=self.device)
        mine = list(range(self.rank, len(rows), self.world_size))
        batches = math.ceil(math.ceil(len(rows) / self.world_size) / self.batch_size)
        bar = tqdm(total=len(rows), desc="reference log-probs", unit="row", disable=not self.progress or self.rank != 0)
        with torch.no_grad():
            for b in range(batches):
                positions = mine[b * self.batch_size : (b + 1) * self.batch_size]
                batch = collate([dataset[rows[p]] for p in (positions or [0])])
                batch = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
                values = self.columns(batch).double()
                if positions:  # a rank out of rows ran a stand-in batch only to keep step with the others
                    out[positions] = values
                bar.update(len(positions) * self.world_size)
        bar.close()
        return self.all_reduce_sum(out).cpu()

    def _read(self) -> dict[str, tuple[float, ...]]:
        self.barrier()  # every rank reads the file as rank 0 last left it
        if self.cache_file is None or not self.cache_file.is_file():
            return {}
        saved = torch.load(self.cache_file, weights_only=True)
        if tuple(saved["names"]) != self.names:
            return {}
        return {k: tuple(row) for k, row in zip(saved["keys"], saved["values"].tolist(), strict=True)}

    def _write(self, table: dict[str, tuple[float, ...]]) -> None:
        if self.cache_file is not None and self.rank == 0:
            self.cache_file.parent.mkdir(parents=True, exist_ok=True)
            keys = list(table)
            values = torch.tensor([table[k] for k in keys], dtype=torch.float64).reshape(len(keys), len(self.names))
            partial = self.cache_file.with_name(self.cache_file.name + f".tmp{os.getpid()}")
            torch.save({"names": list(self.names), "keys": keys, "values": values}, partial)
            partial.replace(self.cache_file)
        self.barrier()
