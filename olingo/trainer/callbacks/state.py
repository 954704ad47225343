"""Records the loop hands to callbacks: `LoopState`, `ManifestRow`, `LoopArtifacts`, `LogContext`.

Step numbering, everywhere in olingo: `step` counts *completed optimizer steps*. The first
optimizer step is step 1; `on_step_end(state, 1, ...)` fires after it; the metrics row of that
step has `"step": 1`; a checkpoint taken after it is named `step_1`; a run resumed from it starts
with `state.step == 1`. Evaluations and in-loop benchmarks carry the step they ran after
(`on_eval(state, N, ...)`, `on_benchmark_eval(..., step=N)`); benchmarks of the final model
carry `step=None`. The step is never 0-based.

A checkpoint at step N is taken before the evaluations due at step N, so a run resumed from it
runs those evaluations again: loggers keep train rows up to N and eval rows before N
(`kept_on_resume`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class ManifestRow:
    """One line of `checkpoints.jsonl`: a checkpoint that is complete on disk."""

    name: str  # "step_<n>" or "final"
    step: int  # optimizer steps completed when it was taken
    epoch: int  # epoch the loop was in (0-based)
    batch: int  # micro-batches of that epoch already consumed (the data position)
    path: str  # checkpoint directory, relative to the run directory
    time: float  # unix time the checkpoint was completed

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LoopState:
    """Live view of a training loop, handed to every loop hook."""

    step: int = 0  # optimizer steps completed (see module docstring)
    num_steps: int = 0  # optimizer steps the run will take in total
    epoch: int = 0  # current epoch, 0-based
    output_dir: Path | None = None  # run directory (None when nothing is written)
    is_master: bool = True  # rank 0 of the job: loggers write only there
    stop_requested: bool = False
    ctx: LogContext | None = None  # set when the run is part of an experiment
    # The model being trained, unwrapped (PPO: the actor), and its tokenizer, for in-loop
    # evaluators; kept out of repr() so that printing a state never prints a model.
    policy: Any = field(default=None, repr=False)
    tokenizer: Any = field(default=None, repr=False)
    config: dict[str, Any] | None = None  # resolved run config, for loggers that record it
    extra: dict[str, Any] = field(default_factory=dict)  # trainer-specific live values

    def request_stop(self) -> None:
        """End training after the current step (its checkpoint and evals still happen)."""
        self.stop_requested = True


@dataclass
class LoopArtifacts:
    """What a finished (or crashed) loop leaves behind; passed to `on_train_end`."""

    run_dir: Path | None
    manifest_path: Path | None
    checkpoints: list[ManifestRow]  # rows this run (process) appended
    requested_steps: int  # num_steps the loop was asked to run
    completed_steps: int  # state.step at the end
    train_seconds: float
    stopped_early: bool = False  # a callback requested the stop
    error: BaseException | None = None  # set when the loop raised


@dataclass
class LogContext:
    """Shared context of an experiment: one object for every experiment-scope hook.

    The runner updates the run fields before `on_run_start`; they keep the last run's values
    until the next one starts (so `on_run_end` sees the run that just ended).
    """

    experiment_name: str = ""
    group_name: str | None = None  # the arm when it has repeats or continual stages, else None
    run_name: str | None = None  # "<arm>__s<seed>" (and "__<stage>" for continual stages)
    run_config: dict[str, Any] | None = None  # the run's resolved stage config ("stage" included)
    output_dir: Path | None = None  # the experiment directory
    run_dir: Path | None = None  # the current run's directory
    run_index: int = 0  # 0-based position of the current run among all runs
    num_runs: int = 0  # runs the experiment plans in total
    ids: dict[str, Any] = field(default_factory=dict)  # ids loggers create and share


def kept_on_resume(step: int, split: str, resume_step: int) -> bool:
    """Whether a logged row survives resuming at `resume_step` (see the module docstring)."""
    return step < resume_step or (step == resume_step and split == "train")
