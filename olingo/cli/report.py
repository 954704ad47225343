"""`olingo report`: PNG curves and a summary table from a run's `metrics.jsonl` (docs/callbacks.md).

`write_report(run_dir)` reads `<run_dir>/metrics.jsonl` and writes into `<run_dir>/plots/`:

| file          | written when                    | shows                                              |
|---------------|---------------------------------|----------------------------------------------------|
| `reward.png`  | a reward metric is logged       | `*/reward*` curves, a ±std band where `*_std` exists and does not swamp the mean |
| `kl.png`      | `rollout/kl` is logged, not off | KL per step; an adaptive `rollout/kl_coef` on a second y axis |
| `loss.png`    | a loss that is on exists        | one panel per loss (`loss`, `policy_loss`, `value_loss`, ...), train and eval lines in it |
| `<ns>.png`    | namespace `<ns>` has metrics    | one small panel per metric of `train/`, `rollout/`, `eval/`, `perf/`, `time/`, ... |

What is drawn, and why (each figure says in its text what it left out):
- Each loss has its own panel and y axis, so a value-loss spike cannot flatten the policy loss.
  The panel holds the train and eval series of the same loss, which are meant to be compared.
- A term that is off is not drawn: a loss (`*loss`) or `*/kl` that is exactly 0 at every logged
  step (PPO logs `train/ptx_loss` 0 without pretrain data, and `rollout/kl` 0 when the reference
  forward is skipped at kl_coef 0), or a loss `<ns>/<x>_loss` whose coefficient `*/<x>_coef` is
  logged and 0 throughout.
- A ±std band around a mean reward is drawn only when its median half-width is at most half the
  range the drawn (smoothed) mean moves over. A wider band (a 0/1 reward's std dwarfs the mean's
  movement; a reward-model score spreads over many units around a mean that moves a few) would set
  the y axis by itself and hide the trend, so it is omitted and the legend says so. A flat mean
  therefore never gets a band.
- A KL coefficient that is constant for the whole run is a setting, not a curve: it goes into
  the KL figure's title; only an adaptive (varying) one is drawn, on a second y axis labelled
  "adaptive". In the namespace grids a metric constant over two or more points is titled with
  its value ("= 0.05, constant"), and so is a single point (one evaluation).

Figures are drawn on `matplotlib.figure.Figure` objects with an explicit Agg canvas, never
through pyplot's global state, so reports are safe in tests, threads and headless servers.
`summarize(run_dir)` gives each metric's first/last/min/max/count for a text table.

An experiment directory (it holds `result.json`, written by `olingo experiment run`) gets
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

from olingo.experiment.results import ArmResult, ExperimentResult, aggregate, final_runs
from olingo.trainer.callbacks.builtin import read_metrics
from olingo.trainer.callbacks.builtin.jsonl import RESERVED_KEYS
from olingo.trainer.callbacks.builtin.metric_output import format_number

__all__ = [
    "Series",
    "band_over_seeds",
    "band_swamps_mean",
    "format_experiment_table",
    "format_summary",
    "is_constant",
    "is_experiment_dir",
    "load_experiment_result",
    "load_series",
    "moving_average",
    "off_reason",
    "scoring_stages",
    "summarize",
    "with_final_benchmarks",
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
LOSS_COLUMNS = 3
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
    booleans, NaN), are skipped; a metric may be missing from any number of rows. An eval
    metric's label names its evaluator only when two evaluators log that same metric.
    """
    path = Path(run_dir) / METRICS_FILE
    rows = _read_rows(path)
    shared = _metrics_of_several_evaluators(rows)
    series: dict[str, Series] = {}
    for row in rows:
        step = row.get("step")
        if not _is_number(step):
            continue
        is_eval = row.get("split") == "eval"
        for metric, value in row.items():
            if metric in RESERVED_KEYS or not _is_number(value):
                continue
            label = f"{metric} [{row.get('eval_name')}]" if is_eval and metric in shared else metric
            entry = series.setdefault(label, Series(metric, label))
            entry.steps.append(step)
            entry.values.append(float(value))
    if not series:
        raise ValueError(f"{path}: {len(rows)} rows but no numeric metrics in them yet")
    return dict(sorted(series.items(), key=lambda item: _plot_order(item[1])))


def _metrics_of_several_evaluators(rows: list[dict[str, Any]]) -> set[str]:
    """Eval metrics logged by two or more evaluators (`eval/loss` of `heldout` and `ood`).

    Only these need the evaluator in their label: naming it for every metric as soon as a
    run has two evaluators would give an experiment's seeds different labels for the same
    curve whenever one seed ran an evaluator the other did not.
    """
    names: dict[str, set[Any]] = {}
    for row in rows:
        if row.get("split") == "eval":
            for metric in row:
                names.setdefault(metric, set()).add(row.get("eval_name"))
    return {metric for metric, evaluators in names.items() if len(evaluators) > 1}


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
# What is worth drawing


def is_constant(series: Series) -> bool:
    """Whether `series` holds one value at two or more points (a single point is not a trend)."""
    return len(series.values) > 1 and min(series.values) == max(series.values)


def _varies(series: Series) -> bool:
    return min(series.values) != max(series.values)


def off_reason(series: Series, all_series: dict[str, Series]) -> str | None:
    """Why the loss or KL term `series` is off (not drawn), or None when it is on.

    Off: exactly 0 at every logged step (a term that is not computed is logged as 0), or,
    for `<ns>/<x>_loss`, a logged coefficient `*/<x>_coef` that is 0 throughout.
    """
    if not (series.leaf.endswith("loss") or series.leaf == "kl"):
        return None
    if all(v == 0 for v in series.values):
        return f"{series.label} = 0 throughout"
    stem = series.leaf.removesuffix("_loss")
    if stem != series.leaf:
        for coef in all_series.values():
            if coef.leaf == f"{stem}_coef" and all(v == 0 for v in coef.values):
                return f"{series.label} ({coef.label} = 0)"
    return None


def band_swamps_mean(mean: Iterable[float], std: Iterable[float]) -> bool:
    """Whether a ±std band would swamp its mean curve: the band's median half-width is larger
    than half the range (max - min) the drawn mean moves over, so the band, not the mean,
    would set the y axis (a reward spread over many outcomes, say 0..10, around a mean moving
    from 4 to 7)."""
    mean, std = np.asarray(list(mean), dtype=float), np.asarray(list(std), dtype=float)
    return bool(np.median(std) > 0.5 * np.ptp(mean))


def _split_off(members: list[Series], all_series: dict[str, Series]) -> tuple[list[Series], list[str]]:
    """(the members that are on, why each other one is off)."""
    reasons = {s.label: off_reason(s, all_series) for s in members}
    return [s for s in members if reasons[s.label] is None], [r for r in reasons.values() if r]


# ---------------------------------------------------------------------------------------------
# Figures


def write_report(run_dir: str | Path, *, smooth: int | None = None) -> list[Path]:
    """Write the run's PNG curves into `<run_dir>/plots/` and return their paths.

    Order: `reward.png`, `kl.png`, `loss.png` (each only when its metrics exist and are on),
    then one grid per namespace (`train.png`, `rollout.png`, `eval.png`, `perf.png`, `time.png`,
    others). `smooth`: moving-average window drawn over the faint raw curve; None picks no
    smoothing below 50 points and about len/20 above; 0 or 1 turns smoothing off. Schedules
    (`*lr`, `*kl_coef`) and constant curves are always drawn raw. What is left out, and why,
    is in the module docstring.
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
    """Reward curves, each with a ±std band when its `*_std` sibling is logged and the band
    does not swamp the mean (`band_swamps_mean`); an omitted band is named in the legend."""
    rewards = [s for s in series.values() if _is_reward(s)]
    if not rewards:
        return None
    fig, ax = _single_axes(f"{run_name}: reward")
    for s in rewards:
        line = _draw(ax, s, smooth)
        std = series.get(_std_name(s.metric) + s.label.removeprefix(s.metric))
        if std is None:
            continue
        x, y, sd = _aligned(s, std)
        if len(x) < 2:  # a band needs two points; one eval's std has no trend to swamp
            continue
        window = _window_for(s, smooth)
        if window > 1:  # the band follows the drawn (smoothed) mean, not the faint raw one
            y, sd = moving_average(y, window), moving_average(sd, window)
        if band_swamps_mean(y, sd):
            note = (
                f"± {std.label} not drawn: its median {np.median(sd):.2g} > {0.5 * np.ptp(y):.2g}, "
                "half the range of the mean"
            )
            ax.plot([], [], " ", label=note)  # a legend entry without a line
            continue
        ax.fill_between(
            x, y - sd, y + sd, color=line.get_color(), alpha=0.15, linewidth=0,
            label=f"± {std.label}",
        )
    ax.set_ylabel("reward")
    ax.legend(fontsize=8)
    return fig


def _is_reward(series: Series) -> bool:
    return series.leaf.startswith("reward") and not series.leaf.endswith("_std")


def _std_name(metric: str) -> str:
    """'rollout/reward_mean' -> 'rollout/reward_std'; 'eval/reward' -> 'eval/reward_std'."""
    return metric.removesuffix("_mean") + "_std"


def _aligned(mean: Series, std: Series) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(steps, mean, std) at the steps where both were logged."""
    std_at = dict(zip(std.steps, std.values, strict=True))
    points = [
        (x, y, std_at[x]) for x, y in zip(mean.steps, mean.values, strict=True) if x in std_at
    ]
    if not points:
        return np.array([]), np.array([]), np.array([])
    x, y, sd = (np.asarray(column, dtype=float) for column in zip(*points, strict=True))
    return x, y, sd


def _kl_figure(series: dict[str, Series], run_name: str, smooth: int | None) -> Figure | None:
    """Every `*/kl` curve that is on; an adaptive `rollout/kl_coef` on a second y axis, a fixed
    one in the title (a flat line on its own axis would read like a threshold for the KL)."""
    if "rollout/kl" not in series or off_reason(series["rollout/kl"], series):
        return None
    kls = [s for s in series.values() if s.leaf == "kl" and not off_reason(s, series)]
    coef = series.get("rollout/kl_coef")
    title = f"{run_name}: KL to the reference policy"
    if coef is not None and not _varies(coef):
        title += f" (kl_coef fixed at {coef.values[0]:.4g})"
    fig, ax = _single_axes(title)
    lines = [_draw(ax, s, smooth) for s in kls]
    ax.set_ylabel("KL")
    if coef is not None and _varies(coef):
        twin = ax.twinx()
        line = _draw(twin, coef, smooth, color="tab:red", linestyle="--")
        line.set_label(f"{coef.label} (adaptive)")
        lines.append(line)
        twin.set_ylabel("KL coefficient (adaptive, right axis)")
    # The legend goes on the topmost axes so that the coefficient's line does not cover it.
    lines[-1].axes.legend(handles=lines, fontsize=8)
    return fig


def _loss_figure(series: dict[str, Series], run_name: str, smooth: int | None) -> Figure | None:
    """One panel per loss that is on (train and eval of the same loss share it); the losses
    that are off are named under the panels."""
    losses, off = _split_off([s for s in series.values() if s.metric.endswith("loss")], series)
    panels: dict[str, list[Series]] = {}
    for s in losses:
        panels.setdefault(s.leaf, []).append(s)
    if not panels:
        return None
    ncols = min(LOSS_COLUMNS, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = _new_figure((8, 4.5) if len(panels) == 1 else (4.6 * ncols + 0.4, 3.6 * nrows + 0.8))
    for i, (leaf, members) in enumerate(panels.items()):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        for s in members:
            _draw(ax, s, smooth)
        ax.set_title(leaf, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _titled_grid(fig, f"{run_name}: losses (one axis each)", off)


def _namespace_grid(
    series: dict[str, Series], namespace: str, run_name: str, smooth: int | None
) -> Figure | None:
    """One small panel per metric of `namespace`, titled with its name (and its value when it
    is constant); terms that are off are named under the panels instead."""
    members, off = _split_off([s for s in series.values() if s.namespace == namespace], series)
    if not members:
        return None
    ncols = min(GRID_COLUMNS, len(members))
    nrows = math.ceil(len(members) / ncols)
    fig = _new_figure((3.2 * ncols + 0.4, 2.4 * nrows + 0.8))
    for i, s in enumerate(members):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        _draw(ax, s, smooth)
        title = s.label
        if is_constant(s) or len(s.values) == 1:  # the value reads better than a lone tick
            title += f" = {s.values[0]:.4g}" + (", constant" if len(s.values) > 1 else "")
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    return _titled_grid(fig, f"{run_name}: {namespace}/", off)


def _titled_grid(fig: Figure, title: str, off: list[str]) -> Figure:
    """A grid's title, and under its panels the x label and the terms left out as off."""
    fig.suptitle(title)
    note = "\nnot drawn (off): " + "; ".join(off) if off else ""
    fig.supxlabel(X_LABEL + note, fontsize=9)
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
    return text


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
            if not _is_number(value):
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
