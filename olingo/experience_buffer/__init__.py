"""`NaiveExperienceBuffer`: the on-policy replay buffer between rollouts and the learn phase.

Experience batches are split into unpadded items on append, and re-padded per minibatch when
sampled or iterated, so a minibatch is only as wide as its own longest prompt and response.
"""

from __future__ import annotations

import logging
import random

import torch
from torch.utils.data import DataLoader, Dataset

from olingo.experience_maker.experience import (
    BufferItem,
    Experience,
    make_experience_batch,
    split_experience_batch,
)

logger = logging.getLogger("olingo.buffer")

__all__ = ["BufferItem", "NaiveExperienceBuffer"]


class NaiveExperienceBuffer(Dataset):
    """A list of `BufferItem`s, optionally capped and kept on CPU.

    Args:
        sample_batch_size: rollouts per minibatch (`sample()` and `dataloader()`).
        limit: keep at most this many items, dropping the oldest (0 = no cap).
        cpu_offload: move items to CPU on append (frees accelerator memory during learning).
        pad_token_id: id written into padding positions of minibatch sequences.
    """

    def __init__(self, sample_batch_size: int, limit: int = 0, cpu_offload: bool = True, pad_token_id: int = 0) -> None:
        if sample_batch_size < 1:
            raise ValueError("sample_batch_size must be >= 1")
        self.sample_batch_size = sample_batch_size
        self.limit = limit
        self.cpu_offload = cpu_offload
        self.pad_token_id = pad_token_id
        self.items: list[BufferItem] = []

    @torch.no_grad()
    def append(self, experience: Experience) -> None:
        if self.cpu_offload:
            experience = experience.to_device("cpu")
        self.items.extend(split_experience_batch(experience))
        if self.limit > 0 and len(self.items) > self.limit:
            self.items = self.items[len(self.items) - self.limit :]

    def clear(self) -> None:
        self.items.clear()

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> BufferItem:
        return self.items[index]

    def collate_fn(self, items: list[BufferItem]) -> Experience:
        return make_experience_batch(items, self.pad_token_id)

    def _check_size(self) -> None:
        # A buffer smaller than one minibatch would otherwise train on nothing (coati's
        # drop_last loader did exactly that, silently).
        if len(self.items) < self.sample_batch_size:
            raise ValueError(
                f"experience buffer holds {len(self.items)} rollouts, fewer than one training batch "
                f"({self.sample_batch_size}); collect more per episode (num_collect_steps x rollout batch size) "
                "or lower train_batch_size"
            )

    @torch.no_grad()
    def sample(self) -> Experience:
        """A minibatch of `sample_batch_size` distinct items drawn with python's global RNG."""
        self._check_size()
        return self.collate_fn(random.sample(self.items, self.sample_batch_size))

    def dataloader(self, shuffle: bool = True, pin_memory: bool = False) -> DataLoader:
        """One pass over every item in minibatches; the last one may be smaller (never dropped).

        The shuffle draws its seed from the global torch RNG, so a run restored from a
        checkpoint (which holds that RNG) shuffles exactly as the uninterrupted run did.
        """
        self._check_size()
        return DataLoader(self, batch_size=self.sample_batch_size, shuffle=shuffle, collate_fn=self.collate_fn, pin_memory=pin_memory, drop_last=False)
