"""`NaiveExperienceBuffer`: the on-policy replay buffer between rollouts and the learn phase.

Appended experience batches are kept whole. Minibatches are cut from all of them at once
(`PaddedRows`): each is only as wide as its own longest prompt and response, and equals what
splitting the batches into unpadded items and re-padding the minibatch's items would give.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Dataset

from olingo.experience_buffer.rows import PaddedRows, merge_batches
from olingo.experience_maker.experience import (
    BufferItem,
    Experience,
    make_experience_batch,
    split_experience_batch,
)

logger = logging.getLogger("olingo.buffer")

__all__ = ["BufferItem", "Minibatches", "NaiveExperienceBuffer", "loader_order"]


class NaiveExperienceBuffer(Dataset):
    """The rollouts of the appended experience batches, optionally capped and kept on CPU.

    Args:
        sample_batch_size: rollouts per minibatch (`sample()` and `dataloader()`).
        limit: keep at most this many rollouts, dropping the oldest (0 = no cap).
        cpu_offload: move batches to CPU on append (frees accelerator memory during learning).
        pad_token_id: id written into padding positions of minibatch sequences.
    """

    def __init__(self, sample_batch_size: int, limit: int = 0, cpu_offload: bool = True, pad_token_id: int = 0) -> None:
        if sample_batch_size < 1:
            raise ValueError("sample_batch_size must be >= 1")
        self.sample_batch_size = sample_batch_size
        self.limit = limit
        self.cpu_offload = cpu_offload
        self.pad_token_id = pad_token_id
        self.batches: list[Experience] = []
        self._rows: PaddedRows | None = None  # every kept rollout in one batch, made on first use
        self._items: list[BufferItem] | None = None

    @torch.no_grad()
    def append(self, experience: Experience) -> None:
        if self.cpu_offload:
            experience = experience.to_device("cpu")
        self.batches.append(experience)
        # Batches wholly older than the newest `limit` rollouts go now; the oldest kept one is
        # trimmed when the rows are merged.
        while self.limit > 0 and len(self.batches) > 1 and sum(b.batch_size for b in self.batches[1:]) >= self.limit:
            self.batches.pop(0)
        self._rows = self._items = None

    def clear(self) -> None:
        self.batches.clear()
        self._rows = self._items = None

    def __len__(self) -> int:
        total = sum(b.batch_size for b in self.batches)
        return min(total, self.limit) if self.limit > 0 else total

    @property
    def items(self) -> list[BufferItem]:
        """The kept rollouts as unpadded `BufferItem`s, oldest first (split on first use)."""
        if self._items is None:
            items = [item for batch in self.batches for item in split_experience_batch(batch)]
            self._items = items[len(items) - len(self) :]
        return self._items

    def __getitem__(self, index: int) -> BufferItem:
        return self.items[index]

    def collate_fn(self, items: list[BufferItem]) -> Experience:
        return make_experience_batch(items, self.pad_token_id)

    @torch.no_grad()
    def minibatch(self, indices: Sequence[int]) -> Experience:
        """Rollouts `indices` (positions in `items`), in that order, as one padded batch."""
        if self._rows is None:
            self._rows = merge_batches(self.batches, self.pad_token_id, self.limit)
        return self._rows.select(indices)

    def _check_size(self) -> None:
        # A buffer smaller than one minibatch would otherwise train on nothing (a drop_last
        # loader does exactly that, silently).
        if len(self) < self.sample_batch_size:
            raise ValueError(
                f"experience buffer holds {len(self)} rollouts, fewer than one training batch "
                f"({self.sample_batch_size}); collect more per episode (num_collect_steps x rollout batch size) "
                "or lower train_batch_size"
            )

    def sample(self) -> Experience:
        """A minibatch of `sample_batch_size` distinct rollouts drawn with python's global RNG."""
        self._check_size()
        # The same draws as random.sample over the items list: it only ever picks positions.
        return self.minibatch(random.sample(range(len(self)), self.sample_batch_size))

    def dataloader(self, shuffle: bool = True, pin_memory: bool = False) -> Minibatches:
        """One pass over every rollout in minibatches; the last one may be smaller (never dropped).

        The order is the one `DataLoader(self, shuffle=shuffle)` would give, drawn from the global
        torch RNG the same way, so a run restored from a checkpoint (which holds that RNG)
        shuffles exactly as the uninterrupted run did.
        """
        self._check_size()
        return self.minibatches(shuffle, pin_memory)

    def minibatches(self, shuffle: bool = True, pin_memory: bool = False) -> Minibatches:
        """As `dataloader()`, also when the buffer holds fewer rollouts than one minibatch."""
        return Minibatches(self, shuffle, pin_memory)


class Minibatches:
    """One pass over a buffer in minibatches of `sample_batch_size`, in `loader_order`."""

    def __init__(self, buffer: NaiveExperienceBuffer, shuffle: bool, pin_memory: bool) -> None:
        self.buffer, self.shuffle, self.pin_memory = buffer, shuffle, pin_memory

    def __len__(self) -> int:
        return math.ceil(len(self.buffer) / self.buffer.sample_batch_size)

    def __iter__(self) -> Iterator[Experience]:
        order = loader_order(len(self.buffer), self.shuffle).tolist()
        size = self.buffer.sample_batch_size
        for start in range(0, len(order), size):
            batch = self.buffer.minibatch(order[start : start + size])
            yield batch.pin_memory() if self.pin_memory else batch


def loader_order(n: int, shuffle: bool) -> torch.Tensor:
    """The order in which `DataLoader(dataset, shuffle=shuffle)` (no workers, no generator)
    visits n items, drawing from the global torch RNG exactly what it draws: its iterator's
    base seed, then the sampler's seed. The same draws keep every later random number (the next
    rollouts' sampling) as it was with a DataLoader, in fresh and resumed runs alike."""
    torch.empty((), dtype=torch.int64).random_()  # the iterator's base seed (unused without workers)
    if not shuffle:
        return torch.arange(n)
    generator = torch.Generator()
    generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
    return torch.randperm(n, generator=generator)
