"""`local_logger`: an experiment's results as plain files (JSON, JSONL, Markdown), no service needed.

Per run, in the run directory (next to the trainer's `metrics.jsonl`):

| file                                  | what                                                      |
|---------------------------------------|-----------------------------------------------------------|
| `evals.jsonl`                         | one row per benchmark result: name, step (null after training), metrics, breakdowns |
| `predictions/<benchmark>/step_N.jsonl`| the scored rows of an in-loop benchmark at step N         |
| `predictions/<benchmark>/final.jsonl` | the scored rows of the benchmark after training           |
| `result.json`                         | the run's `ArmResult`: status, final metrics, error       |
| `summary.md`                          | the same for people                                       |

In the experiment directory, `experiment.md`: the hypothesis, the success metric, one line per
run, mean +- std per arm and the conclusion; rewritten after every run, so a stopped experiment
still has it. Outside an experiment, `summary.md` is written at train end from the last metrics.

It lives beside the results it writes (`olingo.experiment.results`); the callback registry loads
this module by name on the first lookup, so `{"kind": "local_logger"}` builds it anywhere
without the trainer layer importing the experiment layer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from olingo.experiment.monitor_report import monitor_section, run_monitor_lines
from olingo.experiment.results import ArmResult, aggregate
from olingo.trainer.callbacks.base import Callback
from olingo.trainer.callbacks.builtin.metric_output import as_number, format_number
from olingo.trainer.callbacks.registry import register_callback
from olingo.trainer.callbacks.state import LogContext, LoopArtifacts, LoopState


@register_callback("local_logger")
class LocalLogger(Callback):
    """Write runs' benchmark results, predictions and summaries as files (see the module doc).

    `predictions=False` skips the prediction files; `max_predictions` keeps at most that many
    rows per file.
    """

    def __init__(self, predictions: bool = True, max_predictions: int | None = None) -> None:
        self.predictions = predictions
        self.max_predictions = max_predictions
        self._arms: list[ArmResult] = []
        self._in_experiment = False
        self._last: dict[str, float] = {}

    # ---- experiment scope -------------------------------------------------------------------
    def on_experiment_start(self, ctx: LogContext) -> None:
        self._arms, self._in_experiment = [], True
        ctx.ids.setdefault("experiment_id", str(ctx.output_dir))

    def on_run_start(self, ctx: LogContext) -> None:
        ctx.ids["run_id"] = ctx.run_name

    def on_benchmark_eval(self, ctx: LogContext, eval_result: Any, predictions: list[dict], *, step: int | None = None) -> None:
        if ctx.run_dir is None:
            return
        run_dir = Path(ctx.run_dir)
        row = {"name": eval_result.name, "step": step, "metrics": eval_result.metrics, "breakdowns": eval_result.breakdowns,
               "eval_seconds": eval_result.eval_seconds}
        append_jsonl(run_dir / "evals.jsonl", [row])
        if self.predictions:
            rows = predictions[: self.max_predictions] if self.max_predictions else predictions
            name = "final" if step is None else f"step_{step}"
            write_jsonl(run_dir / "predictions" / eval_result.name / f"{name}.jsonl", rows)

    def on_run_end(self, ctx: LogContext, run_result: Any, arm: ArmResult) -> None:
        self._arms.append(arm)
        run_dir = Path(arm.run_dir or ctx.run_dir or ".")
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "result.json").write_text(json.dumps(arm.to_json(), indent=2, default=str) + "\n")
        (run_dir / "summary.md").write_text(run_summary(arm))
        self._write_experiment(ctx, conclusion=f"(running: {len(self._arms)} of {ctx.num_runs} runs done)")

    def on_experiment_end(self, ctx: LogContext, result: Any) -> None:
        self._write_experiment(ctx, conclusion=result.conclusion, hypothesis=result.hypothesis, metric=result.success_metric, status=result.status)
        self._in_experiment = False

    def _write_experiment(self, ctx: LogContext, conclusion: str, hypothesis: str | None = None, metric: str | None = None, status: str = "running") -> None:
        if ctx.output_dir is None:
            return
        if hypothesis is None:  # not known before the end: read it from the experiment's own file
            hypothesis, metric = _metadata(Path(ctx.output_dir))
        text = experiment_markdown(ctx.experiment_name, status, hypothesis, metric, self._arms, conclusion)
        (Path(ctx.output_dir) / "experiment.md").write_text(text)

    # ---- a single run outside an experiment -------------------------------------------------
    def on_step_end(self, state: LoopState, step_idx: int, batch: Any, metrics: dict[str, float]) -> None:
        self._last.update({k: n for k, v in metrics.items() if (n := as_number(v)) is not None})

    def on_eval(self, state: LoopState, step_idx: int, eval_name: str, metrics: dict[str, float]) -> None:
        self._last.update({k: n for k, v in metrics.items() if (n := as_number(v)) is not None})

    def on_train_start(self, state: LoopState) -> None:
        self._last = {}

    def on_train_end(self, state: LoopState, artifacts: LoopArtifacts) -> None:
        if self._in_experiment or not state.is_master or state.output_dir is None:
            return
        status = "failed" if artifacts.error is not None else "completed"
        arm = ArmResult(name=Path(state.output_dir).name, run_config=state.config or {}, status=status, metrics=dict(self._last),
                        error=repr(artifacts.error) if artifacts.error else None, train_seconds=artifacts.train_seconds,
                        steps=artifacts.completed_steps, requested_steps=artifacts.requested_steps, stopped_early=artifacts.stopped_early,
                        run_dir=str(state.output_dir))
        (Path(state.output_dir) / "summary.md").write_text(run_summary(arm))


def _metadata(exp_dir: Path) -> tuple[str, str | None]:
    """(hypothesis, success_metric) from the experiment.yaml the runner wrote."""
    import yaml

    path = exp_dir / "experiment.yaml"
    data = yaml.safe_load(path.read_text()) if path.is_file() else {}
    return str(data.get("hypothesis") or ""), data.get("success_metric")


# ---- file helpers and Markdown (pure apart from the writes) ---------------------------------------
def append_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.writelines(json.dumps(row, default=str) + "\n" for row in rows)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row, default=str) + "\n" for row in rows), encoding="utf-8")


def _fmt(value: Any) -> str:
    number = as_number(value)
    return format_number(number) if number is not None else str(value)


def run_summary(arm: ArmResult) -> str:
    """A run's summary.md: status, steps, final metrics, benchmark results, the error."""
    lines = [f"# {arm.name}", "", f"- status: {arm.status}", f"- steps: {arm.steps}/{arm.requested_steps}"
             + (" (stopped early)" if arm.stopped_early else ""), f"- train seconds: {arm.train_seconds:.1f}"]
    if arm.seed or arm.arm:
        lines.append(f"- arm: {arm.arm}, seed: {arm.seed}" + (f", stage: {arm.stage}" if arm.stage else ""))
    metrics = {**arm.metrics, **arm.eval_metrics}
    if metrics:
        lines += ["", "| metric | value |", "|---|---|"] + [f"| {k} | {_fmt(v)} |" for k, v in sorted(metrics.items())]
    for result in arm.evals:
        at = "after training" if result.step is None else f"step {result.step}"
        lines += ["", f"## {result.name} ({at})", ""] + [f"- {k}: {_fmt(v)}" for k, v in result.metrics.items()]
        lines += [f"- {key}: " + ", ".join(f"{v} {_fmt(x)}" for v, x in values.items()) for key, values in result.breakdowns.items()]
    lines += run_monitor_lines(arm)  # the reward monitor's flags, when it watched the run
    if arm.error:
        lines += ["", "## error", "", "```", arm.error.rstrip(), "```"]
    return "\n".join(lines) + "\n"


def experiment_markdown(name: str, status: str, hypothesis: str, metric: str | None, arms: list[ArmResult], conclusion: str) -> str:
    """experiment.md: hypothesis, one line per run, mean +- std per arm, the conclusion."""
    lines = [f"# Experiment {name}", "", f"- status: {status}", f"- hypothesis: {hypothesis or '(none given)'}",
             f"- success metric: {metric or '(none)'}", "", "## Runs", "",
             "| run | arm | seed | stage | status | steps | " + (metric or "-") + " |", "|---|---|---|---|---|---|---|"]
    for a in arms:
        value = a.value(metric) if metric else None
        lines.append(f"| {a.name} | {a.arm} | {a.seed} | {a.stage_label} | {a.status} | {a.steps} | {_fmt(value) if value is not None else ''} |")
    table = aggregate(arms)
    keys = sorted({k for row in table.values() for k in row if k == metric or not k.startswith("train/")})
    if keys:
        lines += ["", "## Arms (mean +- std over seeds)", "", "| arm | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
        for arm, row in table.items():
            cells = [f"{_fmt(row[k][0])} +- {_fmt(row[k][1])} (n={row[k][2]})" if k in row else "" for k in keys]
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    lines += monitor_section(arms)
    lines += ["", "## Conclusion", "", conclusion]
    return "\n".join(lines) + "\n"
