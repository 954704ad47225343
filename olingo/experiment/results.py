"""Results of an experiment: `EvalResult`, `RunResult`, `ArmResult`, `ExperimentResult`.

Plain dataclasses with `to_json`/`from_json`, so `result.json` in the experiment directory
reads back into the same objects (`olingo report` does). The aggregation (mean and std over
repeats, best arm, conclusion) is in small pure functions at the end of the module.
This module imports nothing from olingo, so loggers may use it freely.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

RunStatus = Literal["pending", "completed", "failed", "skipped"]


@dataclass
class EvalResult:
    """One benchmark scored once: in the loop (`step` = optimizer step) or after training (None)."""

    name: str  # the benchmark's name in the experiment config
    metrics: dict[str, float]  # e.g. {"accuracy": 0.62, "n": 67}
    breakdowns: dict[str, dict[str, float]] = field(default_factory=dict)  # e.g. {"op": {"+": 0.8}}
    eval_seconds: float = 0.0
    step: int | None = None
    tags: dict[str, str] = field(default_factory=dict)  # run, arm, seed, benchmark kind

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EvalResult:
        return cls(**data)


@dataclass
class RunResult:
    """What one stage run returned (`run_sft`/`run_rm`/`run_ppo`); empty when it failed early."""

    run_dir: str | None = None
    final_model: str | None = None
    eval: dict[str, float] | None = None  # the stage's own final evaluation (eval/...)
    steps: int = 0


@dataclass
class ArmResult:
    """One training run of the experiment: an arm, one seed, one continual stage."""

    name: str  # "<arm>" or "<arm>__s<seed>", plus "__<stage>" for continual stages
    run_config: dict[str, Any]  # the resolved stage config, "stage" included
    status: RunStatus = "pending"
    metrics: dict[str, float] = field(default_factory=dict)  # last train row and last evaluations
    eval_metrics: dict[str, float] = field(default_factory=dict)  # "<benchmark>/<metric>" after training
    evals: list[EvalResult] = field(default_factory=list)  # every benchmark result, in-loop ones too
    error: str | None = None  # the traceback when the run failed, the reason when skipped
    train_seconds: float = 0.0
    arm: str = ""  # the arm this run belongs to
    group: str | None = None
    seed: int = 0
    stage: str | None = None  # continual stage name; None for the arm's own (first) stage
    run_dir: str | None = None
    steps: int = 0  # optimizer steps completed
    requested_steps: int = 0
    stopped_early: bool = False

    def value(self, metric: str) -> float | None:
        """`metric` from the benchmark metrics, else from the loop metrics; None when absent."""
        value = self.eval_metrics.get(metric, self.metrics.get(metric))
        return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["evals"] = [e.to_json() for e in self.evals]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ArmResult:
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["evals"] = [EvalResult.from_json(e) for e in data.get("evals", [])]
        return cls(**kwargs)


@dataclass
class ExperimentResult:
    """The whole experiment: every run, the best arm by `success_metric`, a conclusion line."""

    name: str
    status: Literal["completed", "partial", "failed", "interrupted"] = "completed"
    arms: list[ArmResult] = field(default_factory=list)
    best_arm: str | None = None
    best_score: float | None = None
    conclusion: str = ""
    hypothesis: str = ""
    success_metric: str | None = None
    success_mode: Literal["max", "min"] = "max"
    output_dir: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["arms"] = [a.to_json() for a in self.arms]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ExperimentResult:
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["arms"] = [ArmResult.from_json(a) for a in data.get("arms", [])]
        return cls(**kwargs)


# ---- aggregation --------------------------------------------------------------------------------
def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (n - 1); the std of a single value is 0."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n == 1:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def final_runs(arms: list[ArmResult]) -> list[ArmResult]:
    """The last run of each (arm, seed) chain: the run that scores the arm for that seed."""
    last: dict[tuple[str, int], ArmResult] = {}
    for result in arms:
        last[(result.arm, result.seed)] = result
    return list(last.values())


def arm_scores(arms: list[ArmResult], metric: str) -> dict[str, list[float]]:
    """Per arm, `metric` of each completed final run (seeds whose runs failed are left out)."""
    scores: dict[str, list[float]] = {}
    for result in final_runs(arms):
        scores.setdefault(result.arm, [])
        value = result.value(metric)
        if result.status == "completed" and value is not None and math.isfinite(value):
            scores[result.arm].append(value)
    return scores


def pick_best(scores: dict[str, list[float]], mode: str) -> tuple[str | None, float | None]:
    """The arm with the best mean score (ties: the first listed); (None, None) without scores."""
    means = {arm: mean_std(values)[0] for arm, values in scores.items() if values}
    if not means:
        return None, None
    pick = max if mode == "max" else min
    best = pick(means, key=lambda arm: means[arm])
    return best, means[best]


def conclusion_line(scores: dict[str, list[float]], metric: str | None, mode: str, best: str | None) -> str:
    """One sentence: which arm won on `metric`, with mean +- std and seed counts of every arm."""
    if metric is None:
        return "no success_metric set: no arm was ranked"
    if best is None:
        return f"no completed run reported '{metric}': no arm was ranked"

    def describe(arm: str) -> str:
        mean, std = mean_std(scores[arm])
        return f"{arm} {mean:.4g} +- {std:.2g} (n={len(scores[arm])})"

    others = [describe(arm) for arm in scores if arm != best and scores[arm]]
    failed = [arm for arm, values in scores.items() if not values]
    best_mean = mean_std(scores[best])[0]
    tied = [arm for arm in scores if arm != best and scores[arm] and mean_std(scores[arm])[0] == best_mean]
    text = f"best arm by {metric} ({mode}): {describe(best)}"
    if tied:
        text += f" (tied with {', '.join(tied)}: the first listed is named)"
    if others:
        text += "; vs " + ", ".join(others)
    if failed:
        text += "; no score for " + ", ".join(failed)
    return text


def experiment_status(arms: list[ArmResult]) -> Literal["completed", "partial", "failed"]:
    """completed when every run completed, failed when none did, partial otherwise."""
    done = sum(a.status == "completed" for a in arms)
    if done == len(arms):
        return "completed"
    return "failed" if done == 0 else "partial"


def aggregate(arms: list[ArmResult]) -> dict[str, dict[str, tuple[float, float, int]]]:
    """Per arm, per final metric: (mean, std, n) over the completed final runs of its seeds.

    Every arm is listed, also one whose runs all failed (with no metrics).
    """
    values: dict[str, dict[str, list[float]]] = {}
    for result in final_runs(arms):
        row = values.setdefault(result.arm, {})
        if result.status != "completed":
            continue
        for key in sorted({**result.metrics, **result.eval_metrics}):
            value = result.value(key)
            if value is not None and math.isfinite(value):
                row.setdefault(key, []).append(value)
    return {arm: {key: (*mean_std(v), len(v)) for key, v in row.items()} for arm, row in values.items()}
