"""Reading a run's `metrics.jsonl` into `Series`, summarising them, and judging what is worth
drawing (`olingo report`, see `olingo/cli/report.py` for what each figure shows and why).

`load_series(run_dir)` gives every numeric metric in plotting order; `summarize(run_dir)` gives
each metric's first/last/min/max/count for a text table (`format_summary`). `off_reason` and
`band_swamps_mean` decide what the figures leave out; `moving_average` and `smoothing_window`
decide how a curve is smoothed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from olingo.trainer.callbacks.builtin import read_metrics
from olingo.trainer.callbacks.builtin.jsonl import RESERVED_KEYS
from olingo.trainer.callbacks.builtin.metric_output import format_number

__all__ = [
    "Series",
    "band_swamps_mean",
    "format_summary",
    "is_constant",
    "is_number",
    "load_series",
    "moving_average",
    "off_reason",
    "smoothing_window",
    "split_off",
    "summarize",
    "varies",
]

METRICS_FILE = "metrics.jsonl"
MONITOR_FILE = "monitor.jsonl"  # written beside it by the reward_monitor callback (docs/monitor.md)
# Grids are written in this order; other namespaces follow alphabetically.
NAMESPACE_ORDER = ("train", "rollout", "eval", "perf", "time")
# Below this many points a curve is drawn raw; above it the default window is about n/20.
AUTO_SMOOTH_MIN_POINTS = 50
AUTO_SMOOTH_FRACTION = 20


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
    """Every numeric metric of `<run_dir>/metrics.jsonl` (and `monitor.jsonl`), keyed by label, in plotting order.

    Rows without a numeric `step`, and values that are not finite numbers (strings, null,
    booleans, NaN), are skipped; a metric may be missing from any number of rows. An eval
    metric's label names its evaluator only when two evaluators log that same metric.
    """
    path = Path(run_dir) / METRICS_FILE
    rows = _read_rows(path) + monitor_rows(Path(run_dir))
    shared = _metrics_of_several_evaluators(rows)
    series: dict[str, Series] = {}
    for row in rows:
        step = row.get("step")
        if not is_number(step):
            continue
        is_eval = row.get("split") == "eval"
        for metric, value in row.items():
            if metric in RESERVED_KEYS or not is_number(value):
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


def monitor_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The `reward_monitor` callback's rows (`monitor/*`, one per evaluation), when it ran."""
    path = run_dir / MONITOR_FILE
    return read_metrics(path, strict=False) if path.is_file() else []


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


def is_number(value: Any) -> bool:
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


def smoothing_window(n_points: int, smooth: int | None) -> int:
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


def varies(series: Series) -> bool:
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


def split_off(members: list[Series], all_series: dict[str, Series]) -> tuple[list[Series], list[str]]:
    """(the members that are on, why each other one is off)."""
    reasons = {s.label: off_reason(s, all_series) for s in members}
    return [s for s in members if reasons[s.label] is None], [r for r in reasons.values() if r]
