"""`rollout_samples`: a few decoded rollouts every N optimizer steps, to read what the policy says."""

from __future__ import annotations

import json
from typing import IO, Annotated, Any

from pydantic import Field

from olingo.trainer.callbacks.base import Callback
from olingo.trainer.callbacks.builtin.metric_output import resolve_output_path
from olingo.trainer.callbacks.registry import checked_init, register_callback
from olingo.trainer.callbacks.state import LoopArtifacts, LoopState, kept_on_resume

SAMPLE_COLUMNS = ("step", "prompt", "response", "gt_answer", "reward", "truncated")


@register_callback("rollout_samples")
class RolloutSamples(Callback):
    """Append `num_samples` rollouts of the current episode to `<run_dir>/samples.jsonl`
    at the first optimizer step and then every `every` steps (steps 1, N, 2N, ...; one JSON
    object per rollout, with its step), so even a short run shows what the policy says.
    The steps are absolute, so a resumed run writes the rows the uninterrupted one would.

    The trainer puts the texts of its latest experience batch in `state.extra["rollout_samples"]`.
    The same rows are handed to W&B as a table: they are left in `state.extra["samples_table"]`,
    which the `wandb` logger logs at that step. The PPO trainer installs this callback itself,
    in front of the loggers.
    """

    @checked_init
    def __init__(self, every: int = 10, num_samples: Annotated[int, Field(ge=0)] = 4, path: str = "samples.jsonl") -> None:
        self.every = every
        self.num_samples = num_samples
        self.path = path
        self._fh: IO[str] | None = None

    def on_train_start(self, state: LoopState) -> None:
        target = resolve_output_path(state, self.path) if state.is_master else None
        if target is None:
            return
        target.parent.mkdir(parents=True, exist_ok=True)
        if state.step > 0 and target.exists():  # resumed: drop rows of steps about to be redone
            rows = [json.loads(line) for line in target.read_text().splitlines() if line.strip()]
            kept = [r for r in rows if kept_on_resume(int(r.get("step", 0)), "train", state.step)]
            target.write_text("".join(json.dumps(r) + "\n" for r in kept))
            self._fh = target.open("a", encoding="utf-8")
        else:
            self._fh = target.open("w", encoding="utf-8")

    def on_step_end(self, state: LoopState, step_idx: int, batch: Any, metrics: dict[str, float]) -> None:
        samples = state.extra.get("rollout_samples")
        if self._fh is None or not samples or not self.is_due(step_idx):
            return
        rows = [{"step": step_idx, **sample} for sample in samples[: self.num_samples]]
        for row in rows:
            self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()
        state.extra["samples_table"] = {"step": step_idx, "columns": list(SAMPLE_COLUMNS), "rows": [[r.get(c) for c in SAMPLE_COLUMNS] for r in rows]}

    def is_due(self, step_idx: int) -> bool:
        """Step 1 (the first look at the policy's answers), then every multiple of `every`
        (0 or less: never)."""
        return self.every > 0 and (step_idx == 1 or step_idx % self.every == 0)

    def on_train_end(self, state: LoopState, artifacts: LoopArtifacts) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
