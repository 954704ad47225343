"""`olingo report`: PNG curves and a summary table from a run's `metrics.jsonl` (DESIGN §5).

`write_report(run_dir)` reads `<run_dir>/metrics.jsonl` and writes into `<run_dir>/plots/`:

| file          | written when                    | shows                                              |
|---------------|---------------------------------|----------------------------------------------------|
| `reward.png`  | a reward metric is logged       | `*/reward*` curves, a ±std band where `*_std` exists |
| `kl.png`      | `rollout/kl` is logged          | KL per step, `rollout/kl_coef` on a second y axis  |
| `loss.png`    | a metric ending in "loss" exists | every `*loss` metric (train and eval), one line each |
| `<ns>.png`    | namespace `<ns>` has metrics    | one small panel per metric of `train/`, `rollout/`, `eval/`, `perf/`, `time/`, ... |

Figures are drawn on `matplotlib.figure.Figure` objects with an explicit Agg canvas, never
through pyplot's global state, so reports are safe in tests, threads and headless servers.
`summarize(run_dir)` gives each metric's first/last/min/max/count for a text table.

An experiment directory (it holds `result.json`, written by `olingo experiment run`) gets
`write_experiment_report(exp_dir)`: one PNG per metric in `<exp_dir>/plots/`, with one curve per
arm (the mean over its seeds' completed runs, continual stages as `arm/stage`) and a band of
+- one standard deviation where two or more seeds logged the step; and
`format_experiment_table(result)`: each final metric's mean +- std over the repeats, per arm.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from olingo.experiment.results import ArmResult, ExperimentResult, aggregate
from olingo.trainer.callbacks.builtin import read_metrics
from olingo.trainer.callbacks.builtin._common import format_number
from olingo.trainer.callbacks.builtin.jsonl import RESERVED_KEYS

__all__ = [
    "Series",
    "band_over_seeds",
    "format_experiment_table",
    "format_summary",
    "is_experiment_dir",
    "load_experiment_result",
    "load_series",
    "moving_average",
    "summarize",
    "write_experiment_report",
    "write_report",
]

METRICS_FILE = "metrics.jsonl"
RESULT_FILE = "result.json"  # marks an experiment directory (olingo.experiment.runner)
PLOTS_DIR = "plots"
X_LABEL = "optimizer step"
# Grids are written in this order; other namespaces follow alphabetically.
NAMESPACE_ORDER = ("train", "rollout", "eval", "perf", "time")
# Below this many points a curve is drawn raw; above it the default window is about n/20.
AUTO_SMOOTH_MIN_POINTS = 50
AUTO_SMOOTH_FRACTION = 20
# Sparse curves (evaluations) get markers so that single points stay visible.
MARKER_MAX_POINTS = 30
GRID_COLUMNS = 4
# Schedules are exact, not noisy: averaging would only blur their warmup and jumps.
UNSMOOTHED_LEAVES = ("lr", "kl_coef")


@dataclass
class Series:
    """One metric's numeric values in log order: `values[i]` was logged at step `steps[i]`.

    `metric` is the logged name (`eval/loss`); `label` is unique per series and equals
    `metric`, except when several evaluators log the same metric (`eval/loss [heldout]`).
    """

    metric: str
    label: str
    steps: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)

    @property
    def namespace(self) -> str:
        return self.metric.split("/", 1)[0] if "/" in self.metric else "other"

    @property
    def leaf(self) -> str:
        return self.metric.rsplit("/", 1)[-1]


# ---------------------------------------------------------------------------------------------
# Reading


def load_series(run_dir: str | Path) -> dict[str, Series]:
    """Every numeric metric of `<run_dir>/metrics.jsonl`, keyed by label, in plotting order.

    Rows without a numeric `step`, and values that are not finite numbers (strings, null,
    booleans, NaN), are skipped; a metric may be missing from any number of rows.
    """
    path = Path(run_dir) / METRICS_FILE
    rows = _read_rows(path)
    several_evals = len({r.get("eval_name") for r in rows if r.get("split") == "eval"}) > 1
    series: dict[str, Series] = {}
    for row in rows:
        step = row.get("step")
        if not _is_number(step):
            continue
        suffix = (
            f" [{row.get('eval_name')}]" if several_evals and row.get("split") == "eval" else ""
        )
        for metric, value in row.items():
            if metric in RESERVED_KEYS or not _is_number(value):
                continue
            label = metric + suffix
            entry = series.setdefault(label, Series(metric, label))
            entry.steps.append(step)
            entry.values.append(float(value))
    if not series:
        raise ValueError(f"{path}: {len(rows)} rows but no numeric metrics in them yet")
    return dict(sorted(series.items(), key=lambda item: _plot_order(item[1])))


def _read_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no metrics log. It is written by the `jsonl_metrics` callback while "
            "`olingo sft|rm|ppo` trains; pass the run directory (e.g. runs/<name>)."
        )
    # Lenient: a report should draw what it can of a log that is still being written.
    rows = read_metrics(path, strict=False)
    if not rows:
        raise ValueError(
            f"{path}: no rows yet; the trainer appends one per logged optimizer step "
            "and one per evaluation"
        )
    return rows


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _plot_order(series: Series) -> tuple[int, str, str]:
    namespace = series.namespace
    rank = (
        NAMESPACE_ORDER.index(namespace) if namespace in NAMESPACE_ORDER else len(NAMESPACE_ORDER)
    )
    return rank, namespace, series.label


# ---------------------------------------------------------------------------------------------
# Summary


def summarize(run_dir: str | Path) -> dict[str, dict[str, float]]:
    """For each metric (label as in `load_series`): {"first", "last", "min", "max", "n"}."""
    return {
        label: {
            "first": s.values[0],
            "last": s.values[-1],
            "min": min(s.values),
            "max": max(s.values),
            "n": len(s.values),
        }
        for label, s in load_series(run_dir).items()
    }


def format_summary(summary: dict[str, dict[str, float]]) -> str:
    """`summarize`'s result as an aligned text table, one metric per line."""
    header = ["metric", "n", "first", "last", "min", "max"]
    lines = [
        [label, str(int(s["n"]))] + [format_number(s[k]) for k in ("first", "last", "min", "max")]
        for label, s in summary.items()
    ]
    table = [header, *lines]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            [row[0].ljust(widths[0])]
            + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
        )
        for row in table
    )


# ---------------------------------------------------------------------------------------------
# Smoothing


def moving_average(values: Iterable[float], window: int) -> np.ndarray:
    """Centred moving average over `window` points; the window shrinks at both ends.

    `moving_average([1, 2, 3, 4, 5], 3) == [1.5, 2, 3, 4, 4.5]`.
    """
    v = np.asarray(list(values), dtype=float)
    idx = np.arange(len(v))
    lo = np.maximum(idx - (window - 1) // 2, 0)
    hi = np.minimum(idx + window // 2 + 1, len(v))
    cumsum = np.concatenate([[0.0], np.cumsum(v)])
    return (cumsum[hi] - cumsum[lo]) / (hi - lo)


def _smoothing_window(n_points: int, smooth: int | None) -> int:
    """Window for a curve of `n_points`; 1 means draw it raw."""
    if smooth is None:
        if n_points < AUTO_SMOOTH_MIN_POINTS:
            return 1
        return max(2, round(n_points / AUTO_SMOOTH_FRACTION))
    return max(1, min(smooth, n_points))


# ---------------------------------------------------------------------------------------------
# Figures


def write_report(run_dir: str | Path, *, smooth: int | None = None) -> list[Path]:
    """Write the run's PNG curves into `<run_dir>/plots/` and return their paths.

    Order: `reward.png`, `kl.png`, `loss.png` (each only when its metrics exist), then one
    grid per namespace (`train.png`, `rollout.png`, `eval.png`, `perf.png`, `time.png`, others).
    `smooth`: moving-average window drawn over the faint raw curve; None picks no smoothing
    below 50 points and about len/20 above; 0 or 1 turns smoothing off. Schedules (`*lr`,
    `*kl_coef`) and constant curves are always drawn raw.
    Raises FileNotFoundError without `metrics.jsonl`, ValueError when it has no rows yet.
    """
    if smooth is not None and smooth < 0:
        raise ValueError(f"smooth must be a window of >= 0 points, got {smooth}")
    run_dir = Path(run_dir)
    series = load_series(run_dir)
    run_name = run_dir.resolve().name
    figures = {
        "reward": _reward_figure(series, run_name, smooth),
        "kl": _kl_figure(series, run_name, smooth),
        "loss": _loss_figure(series, run_name, smooth),
    }
    for namespace in dict.fromkeys(s.namespace for s in series.values()):
        figures[namespace] = _namespace_grid(series, namespace, run_name, smooth)

    out_dir = run_dir / PLOTS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in figures.items():
        if fig is None:
            continue
        path = out_dir / f"{_safe_filename(name)}.png"
        fig.savefig(path, dpi=100)
        written.append(path)
    return written


def _reward_figure(series: dict[str, Series], run_name: str, smooth: int | None) -> Figure | None:
    """Reward curves, each with a ±std band when its `*_std` sibling is logged."""
    rewards = [s for s in series.values() if _is_reward(s)]
    if not rewards:
        return None
    fig, ax = _single_axes(f"{run_name}: reward")
    for s in rewards:
        line = _draw(ax, s, smooth)
        std = series.get(_std_name(s.metric) + s.label.removeprefix(s.metric))
        if std is not None:
            _draw_band(ax, s, std, line.get_color())
    ax.set_ylabel("reward")
    ax.legend(fontsize=8)
    return fig


def _is_reward(series: Series) -> bool:
    return series.leaf.startswith("reward") and not series.leaf.endswith("_std")


def _std_name(metric: str) -> str:
    """'rollout/reward_mean' -> 'rollout/reward_std'; 'eval/reward' -> 'eval/reward_std'."""
    return metric.removesuffix("_mean") + "_std"


def _draw_band(ax: Axes, mean: Series, std: Series, color: str) -> None:
    """Shade mean ± std at the steps where both were logged."""
    std_at = dict(zip(std.steps, std.values, strict=True))
    points = [
        (x, y, std_at[x]) for x, y in zip(mean.steps, mean.values, strict=True) if x in std_at
    ]
    if not points:
        return
    x, y, sd = (np.asarray(column) for column in zip(*points, strict=True))
    ax.fill_between(x, y - sd, y + sd, color=color, alpha=0.15, linewidth=0, label=f"± {std.label}")


def _kl_figure(series: dict[str, Series], run_name: str, smooth: int | None) -> Figure | None:
    """Every `*/kl` curve, with the KL coefficient on a second y axis."""
    if "rollout/kl" not in series:
        return None
    fig, ax = _single_axes(f"{run_name}: KL to the reference policy")
    lines = [_draw(ax, s, smooth) for s in series.values() if s.leaf == "kl"]
    ax.set_ylabel("KL")
    if "rollout/kl_coef" in series:
        twin = ax.twinx()
        coef = _draw(twin, series["rollout/kl_coef"], smooth, color="tab:red", linestyle="--")
        lines.append(coef)
        twin.set_ylabel("KL coefficient")
    # The legend goes on the topmost axes so that the coefficient's line does not cover it.
    lines[-1].axes.legend(handles=lines, fontsize=8)
    return fig


def _loss_figure(series: dict[str, Series], run_name: str, smooth: int | None) -> Figure | None:
    losses = [s for s in series.values() if s.metric.endswith("loss")]
    if not losses:
        return None
    fig, ax = _single_axes(f"{run_name}: losses")
    for s in losses:
        _draw(ax, s, smooth)
    ax.set_ylabel("loss")
    ax.legend(fontsize=8)
    return fig


def _namespace_grid(
    series: dict[str, Series], namespace: str, run_name: str, smooth: int | None
) -> Figure:
    """One small panel per metric of `namespace`, titled with the metric's name."""
    members = [s for s in series.values() if s.namespace == namespace]
    ncols = min(GRID_COLUMNS, len(members))
    nrows = math.ceil(len(members) / ncols)
    fig = _new_figure((3.2 * ncols + 0.4, 2.4 * nrows + 0.6))
    for i, s in enumerate(members):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        _draw(ax, s, smooth)
        ax.set_title(s.label, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{run_name}: {namespace}/")
    fig.supxlabel(X_LABEL, fontsize=9)
    return fig


def _draw(ax: Axes, series: Series, smooth: int | None, **style: Any) -> Line2D:
    """Plot one series, raw or faint raw under its moving average; returns the labelled line."""
    window = _window_for(series, smooth)
    marker = "o" if len(series.values) <= MARKER_MAX_POINTS else None
    if window <= 1:
        (line,) = ax.plot(
            series.steps, series.values, marker=marker, markersize=3, label=series.label, **style
        )
        return line
    (raw,) = ax.plot(series.steps, series.values, alpha=0.25, linewidth=0.8, **style)
    style.setdefault("color", raw.get_color())
    (line,) = ax.plot(
        series.steps,
        moving_average(series.values, window),
        linewidth=1.5,
        label=f"{series.label} (avg {window})",
        **style,
    )
    return line


def _window_for(series: Series, smooth: int | None) -> int:
    """Schedules and constant curves are drawn raw: averaging adds only blur and float noise."""
    if series.leaf.endswith(UNSMOOTHED_LEAVES) or min(series.values) == max(series.values):
        return 1
    return _smoothing_window(len(series.values), smooth)


def _single_axes(title: str) -> tuple[Figure, Axes]:
    fig = _new_figure((8, 4.5))
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel(X_LABEL)
    ax.grid(alpha=0.3)
    return fig, ax


def _new_figure(figsize: tuple[float, float]) -> Figure:
    """A figure bound to its own Agg canvas: no pyplot, no global backend switch."""
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _safe_filename(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


# ---------------------------------------------------------------------------------------------
# Experiments


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
    """Each final metric as a row, each arm as a column: `mean +- std (n)` over the repeats."""
    table = aggregate(result.arms)
    arms = list(table)
    metrics = sorted({m for row in table.values() for m in row}, key=lambda m: (m != result.success_metric, m))
    header = ["metric", *arms]
    rows = [
        [m, *(f"{format_number(row[m][0])} +- {format_number(row[m][1])} ({row[m][2]})" if m in (row := table[a]) else "-" for a in arms)]
        for m in metrics
    ]
    failed = [f"{a.name}: {a.status}" for a in result.arms if a.status != "completed"]
    lines = [header, *rows]
    widths = [max(len(r[i]) for r in lines) for i in range(len(header))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in lines)
    if failed:
        text += "\nnot completed (left out): " + ", ".join(failed)
    return text


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
        for metric, series in load_series(run_dir).items():
            curves.setdefault(metric, {}).setdefault(label, []).append(series)
    return curves


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
        path = out_dir / f"{_safe_filename(name)}.png"
        fig.savefig(path, dpi=100)
        written.append(path)
    return written


def _arm_band_figure(metric: str, by_arm: dict[str, list[Series]], title: str, smooth: int | None) -> Figure:
    fig, ax = _single_axes(title)
    for arm, series in by_arm.items():
        steps, mean, std, _ = band_over_seeds(series)
        window = _window_for(Series(metric, metric, list(steps), list(mean)), smooth)
        if window > 1:
            mean, std = moving_average(mean, window), moving_average(std, window)
        marker = "o" if len(steps) <= MARKER_MAX_POINTS else None
        (line,) = ax.plot(steps, mean, marker=marker, markersize=3, label=f"{arm} (n={len(series)})")
        if len(series) > 1:
            ax.fill_between(steps, mean - std, mean + std, color=line.get_color(), alpha=0.2, linewidth=0)
    ax.set_ylabel(metric)
    ax.legend(fontsize=8)
    return fig
