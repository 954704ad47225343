"""Ctrl-C and SIGTERM during training: finish the step or episode, checkpoint, exit cleanly.

`handle_stop_signals()` (the CLI wraps every command in it) installs handlers for SIGINT and
SIGTERM. While a training loop runs (between `arm()` and `disarm()`), the first signal only
records itself; the loop sees it (`stop_requested`) at the next point where a checkpoint resumes
exactly, writes a `step_<N>` checkpoint there and raises `TrainingInterrupted`, which the CLI
turns into a one-line "resume with ..." message and exit status 128 + signal (130 for SIGINT,
143 for SIGTERM). That point is the end of the current optimizer step for supervised loops
(SFT, RM, DPO: the data position is saved with it) and the end of the current episode for
online RL (PPO, GRPO: the episode's experience lives only in memory). Outside a loop (loading
models and data), or at a second signal, the handler raises `KeyboardInterrupt` at
once: checkpoints are written atomically, so the last complete one stays usable whenever the
process stops.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

logger = logging.getLogger("olingo.trainer")

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_armed = 0  # training loops running in this process (nested fits are possible in experiments)
_received: int | None = None  # the signal number recorded while armed
_stop_at: list[str] = []  # where each armed loop honours a stop ("optimizer step", "episode")


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on a signal after a complete optimizer step and a checkpoint.

    A `KeyboardInterrupt`, so code that catches `Exception` (an experiment's per-arm error
    handling, say) lets it through and the whole command stops.
    """

    def __init__(self, signum: int, step: int, checkpoint: Path | None) -> None:
        super().__init__(signum, step, checkpoint)
        self.signum, self.step, self.checkpoint = signum, step, checkpoint

    def __str__(self) -> str:
        where = f"checkpoint {self.checkpoint} written" if self.checkpoint else "no checkpoint written (no save directory)"
        return f"stopped by {signal.Signals(self.signum).name} after optimizer step {self.step}; {where}"


def _handler(signum: int, frame: object) -> None:
    global _received
    if _armed and _received is None:
        _received = signum
        where = _stop_at[-1] if _stop_at else "optimizer step"
        logger.warning("%s: stopping at the end of the current %s and writing a checkpoint (send it again to stop at once)", signal.Signals(signum).name, where)
        return
    raise KeyboardInterrupt(signum)


@contextmanager
def handle_stop_signals() -> Iterator[None]:
    """Install the SIGINT/SIGTERM handlers for the duration (main thread only; elsewhere a no-op)."""
    global _received
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _handler) for sig in _STOP_SIGNALS}
    _received = None
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def arm(stop_at: str = "optimizer step") -> None:
    """A training loop starts: the first signal from now on is a request to stop cleanly, at the
    end of the loop's current `stop_at` (named in the warning the signal logs)."""
    global _armed
    _armed += 1
    _stop_at.append(stop_at)


def disarm() -> None:
    global _armed
    _armed = max(0, _armed - 1)
    if _stop_at:
        _stop_at.pop()


def stop_requested(plugin=None) -> int | None:  # an olingo.booster Plugin
    """The stop signal if this process, or with a distributed `plugin` any rank, received one.

    Every rank must stop after the same optimizer step (they checkpoint together), so under
    data parallelism the flag is summed over ranks (one tiny collective per optimizer step);
    a rank that got no signal itself reports SIGTERM.
    """
    mine = _received
    if plugin is None or not plugin.coordinator.is_distributed:
        return mine
    import torch  # only here: the CLI imports this module before it knows it will train

    flag = plugin.all_reduce_sum(torch.tensor([1.0 if mine else 0.0], device=plugin.device))
    if float(flag[0]) == 0.0:
        return None
    return mine or int(signal.SIGTERM)
