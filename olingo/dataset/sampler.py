"""`ResumableSampler`: shuffled, rank-sharded, and able to start mid-epoch.

Each epoch's order is a permutation drawn from its own generator seeded with `seed + epoch`, so
the order never depends on (or disturbs) the global RNG, and a resumed run sees exactly the order
the original run saw. Rank r of W takes positions r, r+W, r+2W, ... of the permutation, so after
every rank has drawn b batches of size B the first b*B*W entries are consumed: the data position is
one global number, valid under any world size.

Given row lengths the sampler groups by length (the "mega-batches" of transformers'
`LengthGroupedSampler`, behind TRL's `group_by_length`): each epoch's shuffled order is cut into windows of `window_batches` global
batches, each window is sorted longest first and cut into global batches, and those batches are
shuffled inside the window. A micro-batch then holds rows of similar length, so padding it wastes
little, while the epoch still visits every row once. The grouped order depends on the global batch
(batch size x world size): a mid-epoch resume is exact under the same geometry.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset, Sampler

GROUP_WINDOW_BATCHES = 50  # global batches per sorting window: transformers' mega-batch of 50


class ResumableSampler(Sampler[int]):
    """Distributed-aware sampler with `set_epoch(epoch, start=consumed_samples)`."""

    def __init__(
        self,
        num_samples: int,
        *,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        even: bool = True,
        lengths: Sequence[int] | None = None,
        batch_size: int = 1,
        window_batches: int = GROUP_WINDOW_BATCHES,
    ) -> None:
        """even=True pads the permutation (repeating its head) so every rank gets the same number
        of samples, which collective ops in training need; evaluation passes even=False so no
        sample is counted twice. `lengths` (one per row, see `dataset_lengths`) turns on grouping
        by length, with `batch_size` rows per rank per micro-batch (the module docstring)."""
        if num_samples <= 0:
            raise ValueError("cannot sample from an empty dataset")
        if lengths is not None and len(lengths) != num_samples:
            raise ValueError(f"lengths holds {len(lengths)} values for {num_samples} rows")
        if batch_size < 1 or window_batches < 1:
            raise ValueError(f"batch_size ({batch_size}) and window_batches ({window_batches}) must be >= 1")
        self.num_samples = num_samples
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.even = even
        self.lengths = None if lengths is None else list(lengths)
        self.batch_size = batch_size
        self.window_batches = window_batches
        self.epoch = 0
        self.start = 0  # global samples of this epoch already consumed

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Select the epoch's order; `start` skips samples consumed before a resume (this epoch
        only: the next `set_epoch` call starts from 0 again unless told otherwise)."""
        self.epoch = epoch
        self.start = start

    def _padded_size(self) -> int:
        if self.even and self.num_samples % self.num_replicas:
            return self.num_samples + self.num_replicas - self.num_samples % self.num_replicas
        return self.num_samples

    def _order(self) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch) if self.shuffle else None
        if generator is not None:
            order = torch.randperm(self.num_samples, generator=generator).tolist()
        else:
            order = list(range(self.num_samples))
        if self.lengths is not None:
            order = self._grouped(order, self.lengths, generator)
        return order + order[: self._padded_size() - self.num_samples]

    def _grouped(self, order: list[int], lengths: list[int], generator: torch.Generator | None) -> list[int]:
        """`order` with each window sorted longest first (a stable sort: ties keep their place in
        `order`), cut into global batches whose order inside the window is shuffled by
        `generator` (None: kept longest first). The epoch's short last batch, if any, stays last:
        every other global batch then starts at a multiple of the global batch size, so rank r's
        i-th micro-batch lies in the i-th global batch and `start` (consumed samples) stays valid."""
        size = self.batch_size * self.num_replicas
        grouped: list[int] = []
        for begin in range(0, len(order), size * self.window_batches):
            window = sorted(order[begin : begin + size * self.window_batches], key=lambda i: -lengths[i])
            batches = [window[k : k + size] for k in range(0, len(window), size)]
            tail = [batches.pop()] if len(batches[-1]) < size else []
            if generator is not None:
                batches = [batches[k] for k in torch.randperm(len(batches), generator=generator).tolist()]
            grouped.extend(row for batch in batches + tail for row in batch)
        return grouped

    def __iter__(self) -> Iterator[int]:
        remaining = self._order()[self.start :]
        return iter(remaining[self.rank :: self.num_replicas])

    def __len__(self) -> int:
        total = self._padded_size() - self.start
        return max(0, (total - self.rank + self.num_replicas - 1) // self.num_replicas)


def row_length(item: Mapping[str, Any]) -> int:
    """The tokens a row's item makes its micro-batch pad to, as the collators pad.

    SFT: `input_ids`. A preference pair: the longer side, since `PreferenceCollator` pads chosen
    and rejected to one common width (the sum would rank pairs by compute, but the max is what
    sets the padding). An unpaired (KTO) row: the prompt plus the longer of its completion and
    its KL partner's, as `UnpairedCollator` pads both batches of rows."""
    if "input_ids" in item:
        return len(item["input_ids"])
    if "chosen_input_ids" in item:
        return max(len(item["chosen_input_ids"]), len(item["rejected_input_ids"]))
    if "prompt_ids" in item:
        return len(item["prompt_ids"]) + max(len(item["completion_ids"]), len(item.get("kl_completion_ids", ())))
    raise ValueError(f"cannot group by length: the row has none of input_ids, chosen_input_ids, prompt_ids (keys: {sorted(item)})")


def dataset_lengths(dataset: Dataset) -> list[int]:
    """`row_length` of every row of a map-style dataset, for `ResumableSampler(lengths=...)`."""
    lengths = []
    for index in range(len(dataset)):  # type: ignore[arg-type]
        try:
            lengths.append(row_length(dataset[index]))
        except ValueError as err:
            raise ValueError(f"row {index}: {err}") from None
    return lengths


class CyclicLoader:
    """Endless batches from a DataLoader built on a `ResumableSampler`, epoch after epoch.

    The position (epoch, global samples of that epoch already drawn by all ranks) is what a
    checkpoint stores; `load_state_dict` restarts exactly there, also under another world size
    or batch size (at the same global sample). Used for PPO's prompt and pretrain loaders,
    which are read a batch at a time across episodes rather than epoch by epoch.
    """

    def __init__(self, loader) -> None:  # loader: a torch DataLoader
        if not isinstance(loader.sampler, ResumableSampler):
            raise TypeError("build the dataloader with plugin.prepare_dataloader(...) so it shards and resumes")
        if len(loader) == 0:
            raise ValueError(f"the dataloader yields no batch: {loader.sampler.num_samples} rows are fewer than one batch of {loader.batch_size} per process")
        self.loader = loader
        self.epoch = 0
        self.samples = 0  # global samples of `epoch` already drawn (every rank's batches)
        self._iterator: Iterator | None = None

    def next(self):  # returns whatever the loader's collate_fn returns
        sampler: ResumableSampler = self.loader.sampler  # type: ignore[assignment]
        if self._iterator is None:
            sampler.set_epoch(self.epoch, start=self.samples)
            self._iterator = iter(self.loader)
        try:
            batch = next(self._iterator)
        except StopIteration:
            self.epoch, self.samples, self._iterator = self.epoch + 1, 0, None
            return self.next()
        self.samples += self.loader.batch_size * sampler.num_replicas
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "samples": self.samples}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.samples, self._iterator = state["epoch"], state["samples"], None
