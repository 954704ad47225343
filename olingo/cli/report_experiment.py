"""`olingo report` for an experiment directory (it holds `result.json`, written by
`olingo experiment run`).

`write_experiment_report(exp_dir)`: one PNG per metric in `<exp_dir>/plots/`, with one curve per
arm (the mean over its seeds' completed runs, continual stages as `arm/stage`) and a band of
+- one standard deviation where two or more seeds logged the step. Benchmark curves end with the
post-training score (the one the table and conclusion use), placed at the run's last step:
`metrics.jsonl` holds only in-loop scores at multiples of `run_every`. And
`format_experiment_table(result)`: each arm's stage, then each final metric's mean +- std over
the repeats, per arm.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from olingo.cli.report_figures import (
    MARKER_MAX_POINTS,
    PLOTS_DIR,
    safe_filename,
    single_axes,
    window_for,
)
from olingo.cli.report_series import METRICS_FILE, Series, is_number, load_series, moving_average
from olingo.experiment.monitor_report import monitor_section
from olingo.experiment.results import ArmResult, ExperimentResult, aggregate, final_runs
from olingo.trainer.callbacks.builtin.metric_output import format_number

__all__ = [
    "band_over_seeds",
    "format_experiment_table",
    "is_experiment_dir",
    "load_experiment_result",
    "scoring_stages",
    "with_final_benchmarks",
    "write_experiment_report",
]

RESULT_FILE = "result.json"  # marks an experiment directory (olingo.experiment.runner)


def is_experiment_dir(path: str | Path) -> bool:
    """Whether `path` is an experiment directory (it holds the runner's result.json)."""
    return (Path(path) / RESULT_FILE).is_file() and (Path(path) / "experiment.yaml").is_file()


def load_experiment_result(exp_dir: str | Path) -> ExperimentResult:
    """The `ExperimentResult` an experiment wrote to `<exp_dir>/result.json`."""
    path = Path(exp_dir) / RESULT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not an experiment directory (no result.json); run `olingo experiment run EXP.yaml` first")
    return ExperimentResult.from_json(json.loads(path.read_text()))


def format_experiment_table(result: ExperimentResult) -> str:
    """Each final metric as a row, each arm as a column: `mean +- std (n)` over the repeats.

    The first row is the stage that scores each arm (`sft`, `ppo`, `sft:more` for a continual
    stage; see `ArmResult.stage_label`).
    """
    table = aggregate(result.arms)
    arms = list(table)
    metrics = sorted({m for row in table.values() for m in row}, key=lambda m: (m != result.success_metric, m))
    header = ["metric", *arms]
    rows = [["stage", *(scoring_stages(result.arms).get(a, "-") for a in arms)]]
    rows += [
        [m, *(f"{format_number(row[m][0])} +- {format_number(row[m][1])} ({row[m][2]})" if m in (row := table[a]) else "-" for a in arms)]
        for m in metrics
    ]
    failed = [f"{a.name}: {a.status}" for a in result.arms if a.status != "completed"]
    lines = [header, *rows]
    widths = [max(len(r[i]) for r in lines) for i in range(len(header))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in lines)
    if failed:
        text += "\nnot completed (left out): " + ", ".join(failed)
    monitor = monitor_section(result.arms)  # the reward monitor's verdict per arm, when it ran
    return text + ("\n" + "\n".join(monitor[1:]) if monitor else "")


def scoring_stages(arms: list[ArmResult]) -> dict[str, str]:
    """Per arm, the stage label of the runs that score it (the last stage of each seed's chain),
    joined with '/' should its seeds' chains ever differ."""
    labels: dict[str, list[str]] = {}
    for run in final_runs(arms):
        seen = labels.setdefault(run.arm, [])
        if run.stage_label not in seen:
            seen.append(run.stage_label)
    return {arm: "/".join(label or "?" for label in seen) for arm, seen in labels.items()}


def band_over_seeds(series: list[Series]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(steps, mean, std, n) at every step any seed logged: the mean over the seeds that logged
    it and their sample std (0 where a single seed did)."""
    by_step: dict[float, list[float]] = {}
    for s in series:
        for step, value in zip(s.steps, s.values, strict=True):
            by_step.setdefault(step, []).append(value)
    steps = sorted(by_step)
    values = [np.asarray(by_step[x]) for x in steps]
    mean = np.array([v.mean() for v in values])
    std = np.array([v.std(ddof=1) if len(v) > 1 else 0.0 for v in values])
    return np.asarray(steps, dtype=float), mean, std, np.array([len(v) for v in values])


def _curves_by_arm(exp_dir: Path, arms: list[ArmResult]) -> dict[str, dict[str, list[Series]]]:
    """metric label -> arm label -> one Series per completed run that logged it."""
    curves: dict[str, dict[str, list[Series]]] = {}
    for arm in arms:
        run_dir = Path(arm.run_dir) if arm.run_dir else exp_dir / "runs" / arm.name
        if arm.status != "completed" or not (run_dir / METRICS_FILE).is_file():
            continue
        label = arm.arm if arm.stage is None else f"{arm.arm}/{arm.stage}"
        for metric, series in with_final_benchmarks(load_series(run_dir), arm).items():
            curves.setdefault(metric, {}).setdefault(label, []).append(series)
    return curves


def with_final_benchmarks(series: dict[str, Series], arm: ArmResult) -> dict[str, Series]:
    """`series` of one run with its post-training benchmark scores (`EvalResult.step` None)
    appended at the run's last step, in new Series (the input is not changed).

    `metrics.jsonl` holds only the in-loop scores at multiples of `run_every` (the file is
    closed when training ends, before the final model is scored), so without this a curve
    ends early, or is missing when `run_every` is 0, and disagrees with the table. An in-loop
    score at that same step is replaced: the table and conclusion use the post-training one.
    """
    out = dict(series)
    last_step = arm.steps or max((s.steps[-1] for s in series.values() if s.steps), default=0)
    for result in arm.evals:
        if result.step is not None:
            continue
        for key, value in result.metrics.items():
            if not is_number(value):
                continue
            metric = f"{result.name}/{key}"
            label = next((lb for lb in (f"{metric} [{result.name}]", metric) if lb in series), metric)
            old = out.get(label, Series(metric, label))
            steps, values = list(old.steps), list(old.values)
            if steps and steps[-1] == last_step:
                steps.pop(), values.pop()
            out[label] = Series(metric, label, [*steps, last_step], [*values, float(value)])
    return out


def write_experiment_report(exp_dir: str | Path, *, smooth: int | None = None) -> list[Path]:
    """One PNG per metric in `<exp_dir>/plots/`: per arm the mean over seeds and a +- std band.

    `smooth` as in `write_report` (applied to the mean and the std). Returns the paths written.
    """
    exp_dir = Path(exp_dir)
    result = load_experiment_result(exp_dir)
    out_dir = exp_dir / PLOTS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    curves = _curves_by_arm(exp_dir, result.arms)
    written = []
    for label, by_arm in curves.items():
        metric = next(iter(by_arm.values()))[0].metric
        # The evaluator's name is only needed in the file name when two evaluators log `metric`.
        name = metric if sum(c == metric or c.startswith(metric + " [") for c in curves) == 1 else label
        fig = _arm_band_figure(metric, by_arm, f"{result.name}: {label}", smooth)
        path = out_dir / f"{safe_filename(name)}.png"
        fig.savefig(path, dpi=100)
        written.append(path)
    return written


def _arm_band_figure(metric: str, by_arm: dict[str, list[Series]], title: str, smooth: int | None) -> Figure:
    fig, ax = single_axes(title)
    for arm, series in by_arm.items():
        steps, mean, std, _ = band_over_seeds(series)
        window = window_for(Series(metric, metric, list(steps), list(mean)), smooth)
        if window > 1:
            mean, std = moving_average(mean, window), moving_average(std, window)
        marker = "o" if len(steps) <= MARKER_MAX_POINTS else None
        (line,) = ax.plot(steps, mean, marker=marker, markersize=3, label=f"{arm} (n={len(series)})")
        if len(series) > 1:
            ax.fill_between(steps, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_ylabel(metric)
    ax.legend(fontsize=8)
    return fig
