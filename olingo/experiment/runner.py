"""`Experiment`: run every planned run of an experiment config, firing the experiment hooks.

The order, as callbacks see it (docs/callbacks.md, "Order in an experiment"):

    on_experiment_start(ctx)
    on_group_start(ctx, group)                 once per arm with repeats or continual stages
    for each run (arms, then seeds, then continual stages):
        on_run_start(ctx)                      ctx.run_name, ctx.group_name, ctx.run_config set
            the stage's loop hooks (on_train_start ... on_train_end), with in-loop benchmarks
            firing on_eval and on_benchmark_eval(..., step=N)
        on_benchmark_eval(ctx, result, predictions, step=None)   per benchmark, after training
        on_run_end(ctx, run_result, arm)       always: also when the run failed or was skipped
    on_experiment_end(ctx, result)             always; result.json is written just before

A run that raises is recorded (status "failed", the traceback in `error`) and the next run
starts; the continual stages after it are "skipped". Ctrl-C ends the experiment after the
hooks of the interrupted run and `on_experiment_end` (status "interrupted").
"""

from __future__ import annotations

import json
import logging
import shutil
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from olingo.config import ConfigError, dump_config, find_config_file, load_config
from olingo.experiment.benchmarks import (
    ArithmeticBenchmark,
    InLoopBenchmark,
    build_benchmark,
    prefixed,
)
from olingo.experiment.config import (
    ExperimentConfig,
    RunPlan,
    deep_merge,
    plan_runs,
    stages,
    validate_stage,
)
from olingo.experiment.results import (
    ArmResult,
    EvalResult,
    ExperimentResult,
    RunResult,
    arm_scores,
    conclusion_line,
    experiment_status,
    pick_best,
)
from olingo.recipes.common import build_callbacks
from olingo.trainer.callbacks import Callback, LogContext, LoopArtifacts, LoopState, dispatch
from olingo.trainer.callbacks.builtin.metric_output import as_number

logger = logging.getLogger("olingo.experiment")

RUNS_DIR = "runs"
RESULT_FILE = "result.json"
CONFIG_FILE = "experiment.yaml"


class Experiment:
    """An experiment config made runnable: `Experiment.from_yaml("exp.yaml").run()`.

    Everything that can be checked is checked here, before any training: every run's stage
    config, benchmark kinds and parameters, callback kinds and parameters. `callbacks` are
    added after those the config names; all of them get the experiment hooks and every run's
    loop hooks.
    """

    def __init__(self, config: ExperimentConfig, *, base_dir: str | Path = ".", callbacks: Sequence[Callback] = ()) -> None:
        self.config = config
        self.dir = Path(config.output_dir) / config.name
        self.plans = plan_runs(config, Path(base_dir), self.dir / RUNS_DIR)
        self.benchmarks = [build_benchmark(spec) for spec in config.benchmarks]
        check_benchmarks_apply(self.benchmarks, self.plans)
        self.callbacks: list[Callback] = [*build_callbacks(config.callbacks), *callbacks]
        self.ctx = LogContext(experiment_name=config.name, output_dir=self.dir, num_runs=len(self.plans))
        self._finals: dict[str, RunResult] = {}  # run name -> what it returned (continual chaining)

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: Sequence[str] = (), *, callbacks: Sequence[Callback] = ()) -> Experiment:
        """Load `path` (strict: unknown keys are errors) with dotted overrides applied."""
        config = load_config(ExperimentConfig, path, list(overrides))
        return cls(config, base_dir=find_config_file(path).parent, callbacks=callbacks)

    # ---- the experiment -------------------------------------------------------------------------
    def run(self) -> ExperimentResult:
        """Run every planned run; returns (and writes to result.json) the experiment's result."""
        cfg = self.config
        self._prepare_dir()
        result = ExperimentResult(
            name=cfg.name, hypothesis=cfg.hypothesis, success_metric=cfg.success_metric,
            success_mode=cfg.success_mode, output_dir=str(self.dir),
        )
        dispatch(self.callbacks, "on_experiment_start", self.ctx)
        try:
            for group in dict.fromkeys(p.group for p in self.plans if p.group is not None):
                dispatch(self.callbacks, "on_group_start", self.ctx, group)
            for index, plan in enumerate(self.plans):
                result.arms.append(self._run_one(index, plan))
        except KeyboardInterrupt:
            result.status = "interrupted"
            raise
        finally:
            conclude(result)
            (self.dir / RESULT_FILE).write_text(json.dumps(result.to_json(), indent=2, default=str) + "\n")
            dispatch(self.callbacks, "on_experiment_end", self.ctx, result)
        return result

    def _prepare_dir(self) -> None:
        if self.dir.exists() and any(self.dir.iterdir()):
            if not self.config.overwrite:
                raise ConfigError(f"experiment directory {self.dir} already exists: pass overwrite=true to start over, or another name")
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / CONFIG_FILE).write_text(dump_config(self.config))

    # ---- one run --------------------------------------------------------------------------------
    def _run_one(self, index: int, plan: RunPlan) -> ArmResult:
        """Train one run and score its benchmarks; failures are recorded, never raised."""
        previous = self._finals.get(plan.previous) if plan.previous else None
        config = self._stage_config(plan, previous)
        arm = ArmResult(
            name=plan.name, run_config={"stage": plan.kind, **config.model_dump(mode="json")}, arm=plan.arm,
            group=plan.group, seed=plan.seed, stage=plan.stage, run_dir=str(self.dir / RUNS_DIR / plan.name),
        )
        ctx = self.ctx
        ctx.group_name, ctx.run_name, ctx.run_config = plan.group, plan.name, arm.run_config
        ctx.run_dir, ctx.run_index = Path(arm.run_dir), index
        dispatch(self.callbacks, "on_run_start", ctx)
        run_result = RunResult()
        try:
            if plan.previous is not None and previous is None:
                arm.status, arm.error = "skipped", f"previous stage {plan.previous} did not complete"
            else:
                run_result = self._train(plan, config, arm)
                self._score_final_model(run_result, arm)
                arm.status = "completed"
                self._finals[plan.name] = run_result
        except Exception:
            arm.status, arm.error = "failed", traceback.format_exc()
            logger.error("run %s failed; the experiment goes on:\n%s", plan.name, arm.error)
        except BaseException:
            arm.status, arm.error = "failed", "interrupted"
            raise
        finally:
            dispatch(self.callbacks, "on_run_end", ctx, run_result, arm)
        return arm

    def _stage_config(self, plan: RunPlan, previous: RunResult | None) -> Any:
        """The run's validated stage config; a continual stage starts from the previous weights."""
        data = plan.config
        if plan.model_path is not None and previous is not None and previous.final_model:
            data = deep_merge(data, {plan.model_path: previous.final_model})
        return validate_stage(plan.kind, data, plan.where)

    def _train(self, plan: RunPlan, config: Any, arm: ArmResult) -> RunResult:
        recorder = RunRecorder()
        tags = tags_of(arm)
        evaluators = [InLoopBenchmark(b, tags) for b in self.benchmarks if b.run_every > 0]
        try:
            out = stages()[plan.kind].run(config, callbacks=[*self.callbacks, recorder], ctx=self.ctx, evaluators=evaluators)
        finally:
            recorder.fill(arm)  # what the loop reached, also when it raised
        return RunResult(run_dir=out["run_dir"], final_model=out["final_model"], eval=out["eval"], steps=out["steps"])

    def _score_final_model(self, run_result: RunResult, arm: ArmResult) -> None:
        """Post-training benchmarks (step=None) on the saved final model."""
        for benchmark in self.benchmarks:
            result, predictions = benchmark.evaluate_dir(run_result.final_model, tags_of(arm))
            arm.evals.append(result)
            arm.eval_metrics.update(prefixed(benchmark.name, result.metrics))
            dispatch(self.callbacks, "on_benchmark_eval", self.ctx, result, predictions, step=None)


def run_experiment(path: str | Path, overrides: Sequence[str] = (), *, callbacks: Sequence[Callback] = ()) -> ExperimentResult:
    """`olingo experiment run PATH KEY=VALUE...` as a function."""
    return Experiment.from_yaml(path, overrides, callbacks=callbacks).run()


# ---- helpers --------------------------------------------------------------------------------------
class RunRecorder(Callback):
    """Collects what one run's loop reports, for its `ArmResult` (one recorder per run)."""

    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}
        self.evals: list[EvalResult] = []
        self.artifacts: LoopArtifacts | None = None

    def on_step_end(self, state: LoopState, step_idx: int, batch: Any, metrics: dict[str, float]) -> None:
        self.metrics.update(numbers(metrics))

    def on_eval(self, state: LoopState, step_idx: int, eval_name: str, metrics: dict[str, float]) -> None:
        self.metrics.update(numbers(metrics))

    def on_benchmark_eval(self, ctx: LogContext, eval_result: Any, predictions: list[dict], *, step: int | None = None) -> None:
        self.evals.append(eval_result)

    def on_train_end(self, state: LoopState, artifacts: LoopArtifacts) -> None:
        self.artifacts = artifacts

    def fill(self, arm: ArmResult) -> None:
        arm.metrics.update(self.metrics)
        arm.evals.extend(self.evals)
        if self.artifacts is not None:
            a = self.artifacts
            arm.steps, arm.requested_steps = a.completed_steps, a.requested_steps
            arm.train_seconds, arm.stopped_early = a.train_seconds, a.stopped_early


def numbers(metrics: dict[str, Any]) -> dict[str, float]:
    return {key: n for key, value in metrics.items() if (n := as_number(value)) is not None}


def tags_of(arm: ArmResult) -> dict[str, str]:
    """Tags of a run's benchmark results: run, arm, seed and continual stage."""
    return {"run": arm.name, "arm": arm.arm, "seed": str(arm.seed), **({"stage": arm.stage} if arm.stage else {})}


def check_benchmarks_apply(benchmarks: list[ArithmeticBenchmark], plans: list[RunPlan]) -> None:
    """A benchmark that decodes answers cannot score a reward model: say so before training."""
    for benchmark in benchmarks:
        for plan in plans:
            if benchmark.needs_generation and not stages()[plan.kind].generates:
                raise ConfigError(f"benchmark '{benchmark.name}' scores generated answers, but {plan.where} is a {plan.kind} stage")


def conclude(result: ExperimentResult) -> None:
    """Status, best arm and conclusion from the runs so far."""
    if result.status != "interrupted":
        result.status = experiment_status(result.arms) if result.arms else "failed"
    scores = arm_scores(result.arms, result.success_metric) if result.success_metric else {}
    result.best_arm, result.best_score = pick_best(scores, result.success_mode)
    result.conclusion = conclusion_line(scores, result.success_metric, result.success_mode, result.best_arm)
