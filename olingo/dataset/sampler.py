"""`ResumableSampler`: shuffled, rank-sharded, and able to start mid-epoch.

Each epoch's order is a permutation drawn from its own generator seeded with `seed + epoch`, so
the order never depends on (or disturbs) the global RNG, and a resumed run sees exactly the order
the original run saw. Rank r of W takes positions r, r+W, r+2W, ... of the permutation, so after
every rank has drawn b batches of size B the first b*B*W entries are consumed: the data position is
one global number, valid under any world size.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler


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
    ) -> None:
        """even=True pads the permutation (repeating its head) so every rank gets the same number
        of samples, which collective ops in training need; evaluation passes even=False so no
        sample is counted twice."""
        if num_samples <= 0:
            raise ValueError("cannot sample from an empty dataset")
        self.num_samples = num_samples
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.even = even
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
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_samples, generator=generator).tolist()
        else:
            order = list(range(self.num_samples))
        return order + order[: self._padded_size() - self.num_samples]

    def __iter__(self) -> Iterator[int]:
        remaining = self._order()[self.start :]
        return iter(remaining[self.rank :: self.num_replicas])

    def __len__(self) -> int:
        total = self._padded_size() - self.start
        return max(0, (total - self.rank + self.num_replicas - 1) // self.num_replicas)


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
