"""`DetachedReplayBuffer`: the trainer-side queue that remote experience makers fill.

Makers push experience (`append` / `extend`); items are grouped into training batches of
`sample_batch_size` as they arrive, and the trainer pops whole batches (`sample`). The buffer is
shared by the trainer's compute thread and the threads Ray runs the buffer methods on, so every
access holds one lock.

Nothing here blocks forever:
  * backpressure: a push into a buffer holding `limit` batches is refused with FULL and the
    maker retries later (it never blocks a Ray thread);
  * stop signal: after `close()` every push is refused with CLOSED, and what was left is counted;
  * staleness: `sample(min_version=v)` drops batches made by weights older than v and counts them.

Rows are re-batched, so a pushed batch's `info` (what its maker measured: episode metrics,
reward terms, dynamic sampling) cannot stay with its rows; the infos of the accepted pushes are
kept apart and `take_info` gives their mean, as a local run averages its collect steps' infos.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

import torch

from olingo.experience_maker import (
    BufferItem,
    Experience,
    make_experience_batch,
    split_experience_batch,
)

ACCEPTED, FULL, CLOSED = "accepted", "full", "closed"


@dataclass
class BufferCounts:
    """Rollouts that went through the buffer, for the end-of-run accounting."""

    received: int = 0  # rollouts accepted from makers
    sampled: int = 0  # rollouts handed to the trainer
    dropped_stale: int = 0  # rollouts dropped for being more than max_staleness syncs old
    refused_full: int = 0  # push attempts refused by backpressure (retried by the maker)
    refused_closed: int = 0  # rollouts pushed after training ended (never trained on)


class DetachedReplayBuffer:
    """A FIFO of experience batches of `sample_batch_size` rollouts, at most `limit` of them.

    Args:
        sample_batch_size: rollouts per training batch.
        limit: batches held at most before pushes are refused (0: no limit). A push is accepted
            whenever fewer than `limit` batches are waiting, so the bound is exceeded by at most
            one push.
        pad_token_id: written into padding when items are batched.
    """

    def __init__(self, sample_batch_size: int, limit: int = 0, pad_token_id: int = 0) -> None:
        if sample_batch_size < 1 or limit < 0:
            raise ValueError(f"sample_batch_size must be >= 1 and limit >= 0, got {sample_batch_size} and {limit}")
        self.sample_batch_size = sample_batch_size
        self.limit = limit
        self.pad_token_id = pad_token_id
        self.batches: deque[Experience] = deque()
        self.batch_collector: list[BufferItem] = []  # items waiting for a full batch
        self.counts = BufferCounts()
        self.closed = False
        self.infos: list[dict[str, float]] = []  # the `info` of each batch accepted since `take_info`
        self._cond = threading.Condition()

    # ---- maker side ---------------------------------------------------------------------------
    @torch.no_grad()
    def append(self, experience: Experience) -> str:
        """Push one experience batch (any size); returns ACCEPTED, FULL or CLOSED."""
        return self.extend(split_experience_batch(experience.to_device("cpu")), experience.info)

    @torch.no_grad()
    def extend(self, items: list[BufferItem], info: dict[str, float] | None = None) -> str:
        """Push unpadded rollouts (and what their maker measured of them); returns ACCEPTED,
        FULL or CLOSED (nothing is kept unless ACCEPTED)."""
        with self._cond:
            if self.closed:
                self.counts.refused_closed += len(items)
                return CLOSED
            if self.limit and len(self.batches) >= self.limit:
                self.counts.refused_full += 1
                return FULL
            self.counts.received += len(items)
            if info:
                self.infos.append(dict(info))
            self.batch_collector.extend(items)
            while len(self.batch_collector) >= self.sample_batch_size:
                group, self.batch_collector = self.batch_collector[: self.sample_batch_size], self.batch_collector[self.sample_batch_size :]
                self.batches.append(make_experience_batch(group, self.pad_token_id))
            self._cond.notify_all()
            return ACCEPTED

    # ---- trainer side -------------------------------------------------------------------------
    def sample(self, timeout: float | None = None, min_version: int | None = None) -> Experience | None:
        """Pop the oldest batch made by weights of version >= `min_version`, waiting up to
        `timeout` seconds for one (None: forever); None when none arrived in time."""
        with self._cond:
            while True:
                while self.batches and min_version is not None and self.batches[0].policy_version < min_version:
                    self.counts.dropped_stale += self.batches.popleft().batch_size
                if self.batches:
                    batch = self.batches.popleft()
                    self.counts.sampled += batch.batch_size
                    return batch
                if self.closed or not self._cond.wait(timeout):
                    return None

    def get_length(self) -> int:
        """Whole batches waiting to be sampled."""
        with self._cond:
            return len(self.batches)

    def take_info(self) -> dict[str, float]:
        """The mean of every pushed batch's `info` since the last call, key by key over the
        batches that have the key (a tool counter exists only where a tool environment ran);
        empty when none arrived."""
        with self._cond:
            infos, self.infos = self.infos, []
        keys = dict.fromkeys(k for info in infos for k in info)
        return {k: sum(float(i[k]) for i in infos if k in i) / sum(k in i for i in infos) for k in keys}

    def clear(self) -> None:
        with self._cond:
            self.batches.clear()
            self.batch_collector = []
            self.infos = []

    def close(self) -> int:
        """Refuse every later push and wake waiting samplers; returns the rollouts left unused."""
        with self._cond:
            self.closed = True
            leftover = sum(b.batch_size for b in self.batches) + len(self.batch_collector)
            self._cond.notify_all()
            return leftover
