"""`performance`: where PPO's time goes (generation vs learning) and how fast each part runs."""

from __future__ import annotations

import json
import logging
import time
from typing import Annotated, Any

import torch
from pydantic import Field

from olingo.trainer.callbacks.base import Callback
from olingo.trainer.callbacks.registry import checked_init, register_callback
from olingo.trainer.callbacks.state import LoopState

logger = logging.getLogger("olingo.perf")
PHASES = ("make_experience", "learn")


def _now() -> float:
    # Accelerator work is asynchronous: wait for it, or the time lands in the wrong phase.
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


@register_callback("performance")
class PerformanceEvaluator(Callback):
    """Time the make-experience and learn phases through the online-trainer hooks.

    Per phase it sums wall seconds, sequences and tokens (generated response tokens for
    make-experience; sequence tokens forwarded for learn). After each episode it logs one line at
    DEBUG (the same figures are in the metrics rows, `time/learn` on each step's and
    `time/make_experience` on each episode's first, and hundreds of episode lines would bury the
    progress bar); at the end of fit it logs the totals and writes them to `<run_dir>/<path>`: seconds and
    share of each phase, samples/s and tokens/s of each, and peak accelerator memory. The first
    `ignore_episodes` episodes (warm-up, compilation) are left out of the totals.
    """

    @checked_init
    def __init__(self, ignore_episodes: Annotated[int, Field(ge=0)] = 0, path: str = "perf.json") -> None:
        self.ignore_episodes = ignore_episodes
        self.path = path
        self.state: LoopState | None = None
        self.totals = {phase: {"seconds": 0.0, "samples": 0.0, "tokens": 0.0} for phase in PHASES}
        self.episode = {phase: {"seconds": 0.0, "samples": 0.0, "tokens": 0.0} for phase in PHASES}
        self._started: dict[str, float] = {}
        self._episodes_seen = 0

    def on_train_start(self, state: LoopState) -> None:
        self.state = state

    def on_episode_start(self, episode: int) -> None:
        self.episode = {phase: {"seconds": 0.0, "samples": 0.0, "tokens": 0.0} for phase in PHASES}

    def on_make_experience_start(self) -> None:
        self._started["make_experience"] = _now()

    def on_make_experience_end(self, experience: Any) -> None:
        self._add("make_experience", experience.batch_size, float(experience.action_mask.sum()))

    def on_learn_batch_start(self) -> None:
        self._started["learn"] = _now()

    def on_learn_batch_end(self, experience: Any) -> None:
        self._add("learn", experience.batch_size, float(experience.attention_mask.sum()))

    def _add(self, phase: str, samples: int, tokens: float) -> None:
        if phase not in self._started:
            return
        record = self.episode[phase]
        record["seconds"] += _now() - self._started.pop(phase)
        record["samples"] += samples
        record["tokens"] += tokens

    def on_episode_end(self, episode: int) -> None:
        self._episodes_seen += 1
        gen, learn = self.episode["make_experience"], self.episode["learn"]
        logger.debug(
            "episode %d: make_experience %.2fs (%.0f tok/s), learn %.2fs (%.0f tok/s)",
            episode, gen["seconds"], _rate(gen["tokens"], gen["seconds"]), learn["seconds"], _rate(learn["tokens"], learn["seconds"]),
        )
        if self._episodes_seen > self.ignore_episodes:
            for phase in PHASES:
                for key, value in self.episode[phase].items():
                    self.totals[phase][key] += value

    def summary(self) -> dict[str, float]:
        total_seconds = sum(self.totals[p]["seconds"] for p in PHASES)
        out: dict[str, float] = {"episodes": max(self._episodes_seen - self.ignore_episodes, 0)}
        for phase in PHASES:
            t = self.totals[phase]
            out[f"{phase}_seconds"] = t["seconds"]
            out[f"{phase}_share"] = t["seconds"] / total_seconds if total_seconds else 0.0
            out[f"{phase}_samples_per_s"] = _rate(t["samples"], t["seconds"])
            out[f"{phase}_tokens_per_s"] = _rate(t["tokens"], t["seconds"])
        if torch.cuda.is_available():
            out["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        return out

    def on_fit_end(self) -> None:
        summary = self.summary()
        logger.info("performance: %s", ", ".join(f"{k}={v:.3g}" for k, v in summary.items()))
        state = self.state
        if state is not None and state.is_master and state.output_dir is not None:
            (state.output_dir / self.path).write_text(json.dumps(summary, indent=2) + "\n")


def _rate(amount: float, seconds: float) -> float:
    return amount / seconds if seconds > 0 else 0.0
