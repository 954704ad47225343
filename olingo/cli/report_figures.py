"""The figures of one run's report (`olingo/cli/report.py` says what each shows and why).

Each builder takes the run's `Series` by label and returns a `matplotlib.figure.Figure`, or None
when it has nothing to draw: `reward_figure`, `kl_figure`, `loss_figure`, `namespace_grid`.
Figures are drawn on `Figure` objects with an explicit Agg canvas (`new_figure`), never through
pyplot's global state, so reports are safe in tests, threads and headless servers.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from olingo.cli.report_series import (
    Series,
    band_swamps_mean,
    is_constant,
    moving_average,
    off_reason,
    smoothing_window,
    split_off,
    varies,
)

__all__ = [
    "draw",
    "kl_figure",
    "loss_figure",
    "monitor_figure",
    "namespace_grid",
    "new_figure",
    "reward_figure",
    "safe_filename",
    "single_axes",
    "window_for",
]

PLOTS_DIR = "plots"
X_LABEL = "optimizer step"
# Sparse curves (evaluations) get markers so that single points stay visible.
MARKER_MAX_POINTS = 30
GRID_COLUMNS = 4
LOSS_COLUMNS = 3
# Schedules are exact, not noisy: averaging would only blur their warmup and jumps.
UNSMOOTHED_LEAVES = ("lr", "kl_coef")


def reward_figure(series: dict[str, Series], run_name: str, smooth: int | None) -> Figure | None:
    """Reward curves, each with a ±std band when its `*_std` sibling is logged and the band
    does not swamp the mean (`band_swamps_mean`); an omitted band is named in the legend."""
    rewards = [s for s in series.values() if _is_reward(s)]
    if not rewards:
        return None
    fig, ax = single_axes(f"{run_name}: reward")
    for s in rewards:
        line = draw(ax, s, smooth)
        std = series.get(_std_name(s.metric) + s.label.removeprefix(s.metric))
        if std is None:
            continue
        x, y, sd = _aligned(s, std)
        if len(x) < 2:  # a band needs two points; one eval's std has no trend to swamp
            continue
        window = window_for(s, smooth)
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


def kl_figure(series: dict[str, Series], run_name: str, smooth: int | None) -> Figure | None:
    """Every `*/kl` curve that is on; an adaptive `rollout/kl_coef` on a second y axis, a fixed
    one in the title (a flat line on its own axis would read like a threshold for the KL)."""
    if "rollout/kl" not in series or off_reason(series["rollout/kl"], series):
        return None
    kls = [s for s in series.values() if s.leaf == "kl" and not off_reason(s, series)]
    coef = series.get("rollout/kl_coef")
    title = f"{run_name}: KL to the reference policy"
    if coef is not None and not varies(coef):
        title += f" (kl_coef fixed at {coef.values[0]:.4g})"
    fig, ax = single_axes(title)
    lines = [draw(ax, s, smooth) for s in kls]
    ax.set_ylabel("KL")
    if coef is not None and varies(coef):
        twin = ax.twinx()
        line = draw(twin, coef, smooth, color="tab:red", linestyle="--")
        line.set_label(f"{coef.label} (adaptive)")
        lines.append(line)
        twin.set_ylabel("KL coefficient (adaptive, right axis)")
    # The legend goes on the topmost axes so that the coefficient's line does not cover it.
    lines[-1].axes.legend(handles=lines, fontsize=8)
    return fig


def loss_figure(series: dict[str, Series], run_name: str, smooth: int | None) -> Figure | None:
    """One panel per loss that is on (train and eval of the same loss share it); the losses
    that are off are named under the panels."""
    losses, off = split_off([s for s in series.values() if s.metric.endswith("loss")], series)
    panels: dict[str, list[Series]] = {}
    for s in losses:
        panels.setdefault(s.leaf, []).append(s)
    if not panels:
        return None
    ncols = min(LOSS_COLUMNS, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig = new_figure((8, 4.5) if len(panels) == 1 else (4.6 * ncols + 0.4, 3.6 * nrows + 0.8))
    for i, (leaf, members) in enumerate(panels.items()):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        for s in members:
            draw(ax, s, smooth)
        ax.set_title(leaf, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _titled_grid(fig, f"{run_name}: losses (one axis each)", off)


def namespace_grid(
    series: dict[str, Series], namespace: str, run_name: str, smooth: int | None
) -> Figure | None:
    """One small panel per metric of `namespace`, titled with its name (and its value when it
    is constant); terms that are off are named under the panels instead."""
    members, off = split_off([s for s in series.values() if s.namespace == namespace], series)
    if not members:
        return None
    ncols = min(GRID_COLUMNS, len(members))
    nrows = math.ceil(len(members) / ncols)
    fig = new_figure((3.2 * ncols + 0.4, 2.4 * nrows + 0.8))
    for i, s in enumerate(members):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        draw(ax, s, smooth)
        title = s.label
        if is_constant(s) or len(s.values) == 1:  # the value reads better than a lone tick
            title += f" = {s.values[0]:.4g}" + (", constant" if len(s.values) > 1 else "")
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    return _titled_grid(fig, f"{run_name}: {namespace}/", off)


def monitor_figure(series: dict[str, Series], run_name: str, summary: dict[str, Any] | None) -> Figure | None:
    """The reward monitor's picture (docs/monitor.md): proxy (left axis) and gold (right axis)
    against optimizer steps and against sqrt(KL) to the reference, as in Gao et al. 2023,
    "Scaling laws for reward model overoptimization" (their d = sqrt(KL)). Raised flags are
    vertical lines (steps) or ringed points (sqrt KL); the best-gold evaluation is a star."""
    proxy, gold = series.get("monitor/proxy"), series.get("monitor/gold")
    if proxy is None:
        return None
    flags = (summary or {}).get("flags", [])
    best = (summary or {}).get("best_gold") or {}
    fig = new_figure((12, 4.5))
    for i, x_name in enumerate(("step", "monitor/sqrt_kl")):
        ax = fig.add_subplot(1, 2, i + 1)
        xs = dict(zip(proxy.steps, proxy.steps, strict=True)) if x_name == "step" else _by_step(series.get(x_name))
        if not xs:
            ax.text(0.5, 0.5, "no KL logged (the run has no reference model)", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
            continue
        lines = [_monitor_line(ax, proxy, xs, "tab:blue", "proxy (training reward)")]
        right = ax.twinx() if gold is not None else None
        if gold is not None:
            lines.append(_monitor_line(right, gold, xs, "tab:orange", "gold (held out)"))
            if best.get("step") in xs:
                right.plot([xs[best["step"]]], [best["gold"]], "*", color="tab:orange", markersize=14, label="best gold")
            right.set_ylabel("gold")
        for flag in flags:
            if flag["step"] in xs:
                ax.axvline(xs[flag["step"]], color="tab:red", linestyle="--", linewidth=1)
                lines.append(Line2D([], [], color="tab:red", linestyle="--", label=f"{flag['kind']} flagged (step {flag['step']})"))
        ax.set_xlabel(X_LABEL if x_name == "step" else "sqrt(KL to the reference)")
        ax.set_ylabel("proxy")
        ax.grid(alpha=0.3)
        ax.legend(handles=lines, fontsize=8, loc="center left")
    fig.suptitle(f"{run_name}: proxy vs gold reward" + (" (flagged)" if flags else " (no flag)"))
    return fig


def _by_step(series: Series | None) -> dict[float, float]:
    return dict(zip(series.steps, series.values, strict=True)) if series is not None else {}


def _monitor_line(ax: Axes, series: Series, xs: dict[float, float], color: str, label: str) -> Line2D:
    """`series` at the x positions `xs` gives its steps (steps without an x are skipped)."""
    points = [(xs[step], value) for step, value in zip(series.steps, series.values, strict=True) if step in xs]
    (line,) = ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, color=color, label=label)
    return line


def _titled_grid(fig: Figure, title: str, off: list[str]) -> Figure:
    """A grid's title, and under its panels the x label and the terms left out as off."""
    fig.suptitle(title)
    note = "\nnot drawn (off): " + "; ".join(off) if off else ""
    fig.supxlabel(X_LABEL + note, fontsize=9)
    return fig


def draw(ax: Axes, series: Series, smooth: int | None, **style: Any) -> Line2D:
    """Plot one series, raw or faint raw under its moving average; returns the labelled line."""
    window = window_for(series, smooth)
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


def window_for(series: Series, smooth: int | None) -> int:
    """Schedules and constant curves are drawn raw: averaging adds only blur and float noise."""
    if series.leaf.endswith(UNSMOOTHED_LEAVES) or min(series.values) == max(series.values):
        return 1
    return smoothing_window(len(series.values), smooth)


def single_axes(title: str) -> tuple[Figure, Axes]:
    fig = new_figure((8, 4.5))
    ax = fig.add_subplot()
    ax.set_title(title)
    ax.set_xlabel(X_LABEL)
    ax.grid(alpha=0.3)
    return fig, ax


def new_figure(figsize: tuple[float, float]) -> Figure:
    """A figure bound to its own Agg canvas: no pyplot, no global backend switch."""
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def safe_filename(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)
