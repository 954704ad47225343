"""Results of an experiment: `EvalResult`, `RunResult`, `ArmResult`, `ExperimentResult`.

Plain dataclasses with `to_json`/`from_json`, so `result.json` in the experiment directory
reads back into the same objects (`olingo report` does). The aggregation (mean and std over
repeats, best arm, conclusion) is in small pure functions at the end of the module.
This module imports nothing from olingo, so loggers may use it freely.

A best arm is claimed only when the data support it (`pick_best`): arms are ranked by the mean
of `success_metric` over their completed seeds, and the leader wins when it and the runner-up
each have at least `MIN_SEEDS_FOR_CLAIM` scored seeds and the gap between their means is larger
than the sum of their sample standard deviations. Otherwise there is no clear winner:
`best_arm` stays None and the conclusion says why, with every arm's mean +- std (n).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

RunStatus = Literal["pending", "completed", "failed", "skipped"]
# With one seed an arm has no measured spread, so a gap to it cannot be told from seed noise.
MIN_SEEDS_FOR_CLAIM = 2


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

    @property
    def stage_label(self) -> str:
        """The stage this run trained: its kind (`sft`, `rm`, `ppo`), plus `:<name>` for a
        continual stage (`sft:more`); `stage` alone is None for an arm's first stage."""
        kind = str(self.run_config.get("stage") or "")
        if self.stage is None:
            return kind
        return f"{kind}:{self.stage}" if kind else self.stage

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
    """The whole experiment: every run, the best arm by `success_metric` (None without a clear
    winner, see `winner_verdict`), a conclusion line."""

    name: str
    status: Literal["completed", "partial", "failed", "interrupted"] = "completed"
    arms: list[ArmResult] = field(default_factory=list)
    best_arm: str | None = None  # None when no arm beats the runner-up by more than the seed spread
    best_score: float | None = None  # the best arm's mean
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


@dataclass(frozen=True)
class ArmScore:
    """An arm's `success_metric` over its scored seeds: mean, sample std and seed count."""

    arm: str
    mean: float
    std: float
    n: int

    def describe(self) -> str:
        """`A 0.6 +- 0.14 (n=2)`."""
        return f"{self.arm} {self.mean:.4g} +- {self.std:.2g} (n={self.n})"


def rank_arms(scores: dict[str, list[float]], mode: str) -> list[ArmScore]:
    """Arms with at least one score, best mean first (`mode` "max" or "min"); ties keep the
    listed order. Arms without scores are left out."""
    ranked = [ArmScore(arm, *mean_std(values), len(values)) for arm, values in scores.items() if values]
    sign = -1.0 if mode == "max" else 1.0
    return sorted(ranked, key=lambda a: sign * a.mean)  # sorted() is stable: ties stay in order


def winner_verdict(ranked: list[ArmScore]) -> tuple[ArmScore | None, str]:
    """(the clear winner or None, why): the leader wins when it and the runner-up each have
    `MIN_SEEDS_FOR_CLAIM` seeds and their gap exceeds the sum of their std's."""
    if not ranked:
        return None, "no arm has a score"
    if len(ranked) == 1:
        return None, f"only {ranked[0].arm} has a score: nothing to compare it with"
    best, runner_up = ranked[0], ranked[1]
    gap, spread = abs(best.mean - runner_up.mean), best.std + runner_up.std
    if gap == 0:
        return None, f"{best.arm} and {runner_up.arm} tie at {best.mean:.4g}"
    few = [a.arm for a in (best, runner_up) if a.n < MIN_SEEDS_FOR_CLAIM]
    if few:
        return None, (
            f"{best.arm} leads {runner_up.arm} by {gap:.2g}, but {' and '.join(few)} "
            f"{'has' if len(few) == 1 else 'have'} one seed: no spread to compare the gap with "
            f"(n_repeats >= {MIN_SEEDS_FOR_CLAIM} measures it)"
        )
    if gap <= spread:
        return None, (
            f"the gap between {best.arm} and {runner_up.arm} ({gap:.2g}) is within "
            f"their summed std ({spread:.2g})"
        )
    return best, f"gap to {runner_up.arm} {gap:.2g} > summed std {spread:.2g}"


def pick_best(scores: dict[str, list[float]], mode: str) -> tuple[str | None, float | None]:
    """(arm, mean) of the clear winner by `winner_verdict`; (None, None) when there is none."""
    best, _ = winner_verdict(rank_arms(scores, mode))
    return (best.arm, best.mean) if best is not None else (None, None)


def conclusion_line(scores: dict[str, list[float]], metric: str | None, mode: str, best: str | None) -> str:
    """One sentence: the winner on `metric` (or "no clear winner" and why), with mean +- std
    and seed counts of every scored arm, best first. `best` is `pick_best`'s arm."""
    if metric is None:
        return "no success_metric set: no arm was ranked"
    ranked = rank_arms(scores, mode)
    if not ranked:
        return f"no completed run reported '{metric}': no arm was ranked"
    winner, reason = winner_verdict(ranked)
    failed = [arm for arm, values in scores.items() if not values]
    if best is not None and winner is not None and winner.arm == best:
        others = [a.describe() for a in ranked if a.arm != best]
        text = f"best arm by {metric} ({mode}): {winner.describe()} ({reason})"
        text += "; vs " + ", ".join(others)  # a winner always has a runner-up
    else:
        text = f"no clear winner by {metric} ({mode}): {reason}; " + ", ".join(a.describe() for a in ranked)
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
