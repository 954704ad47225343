"""`olingo report`: PNG curves and a summary table from a run's `metrics.jsonl` (docs/callbacks.md).

`write_report(run_dir)` reads `<run_dir>/metrics.jsonl` and writes into `<run_dir>/plots/`:

| file          | written when                    | shows                                              |
|---------------|---------------------------------|----------------------------------------------------|
| `reward.png`  | a reward metric is logged       | `*/reward*` curves, a ±std band where `*_std` exists and does not swamp the mean |
| `kl.png`      | `rollout/kl` is logged, not off | KL per step; an adaptive `rollout/kl_coef` on a second y axis |
| `loss.png`    | a loss that is on exists        | one panel per loss (`loss`, `policy_loss`, `value_loss`, ...), train and eval lines in it |
| `overoptimisation.png` | the `reward_monitor` callback ran | proxy and gold reward against steps and against sqrt(KL), flags marked (docs/monitor.md) |
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
`summarize(run_dir)` (olingo/cli/report_series.py) gives each metric's first/last/min/max/count
for a text table. The figures themselves are built in olingo/cli/report_figures.py; an
experiment's report (`write_experiment_report`) is in olingo/cli/report_experiment.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from olingo.cli.report_figures import (
    PLOTS_DIR,
    kl_figure,
    loss_figure,
    monitor_figure,
    namespace_grid,
    reward_figure,
    safe_filename,
)
from olingo.cli.report_series import load_series

__all__ = ["is_eval_dir", "write_eval_report", "write_report"]


def is_eval_dir(path: str | Path) -> bool:
    """An `olingo eval` directory (docs/eval.md): `olingo report` draws it with `write_eval_report`."""
    from olingo.eval.store import is_eval_dir as holds_eval

    return holds_eval(path)


def write_eval_report(eval_dir: str | Path) -> str:
    """Redraw an eval directory's figure (plots/eval.png) from its eval.json; its table and where the figure is."""
    from olingo.cli.eval import format_eval_table, write_eval_plot
    from olingo.eval.store import read_result

    result = read_result(eval_dir)
    path = write_eval_plot(eval_dir, result)
    return f"{eval_dir}: eval directory; wrote {path}\n{format_eval_table(result)}"


def write_report(run_dir: str | Path, *, smooth: int | None = None) -> list[Path]:
    """Write the run's PNG curves into `<run_dir>/plots/` and return their paths.

    Order: `reward.png`, `kl.png`, `loss.png`, `overoptimisation.png` (each only when its metrics exist and are on),
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
        "reward": reward_figure(series, run_name, smooth),
        "kl": kl_figure(series, run_name, smooth),
        "loss": loss_figure(series, run_name, smooth),
        "overoptimisation": monitor_figure(series, run_name, _monitor_summary(run_dir)),
    }
    for namespace in dict.fromkeys(s.namespace for s in series.values()):
        figures[namespace] = namespace_grid(series, namespace, run_name, smooth)

    out_dir = run_dir / PLOTS_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in figures.items():
        if fig is None:
            continue
        path = out_dir / f"{safe_filename(name)}.png"
        fig.savefig(path, dpi=100)
        written.append(path)
    return written


def _monitor_summary(run_dir: Path) -> dict[str, Any] | None:
    """The reward monitor's `monitor.json` (flags, best gold), when the run has one."""
    path = run_dir / "monitor.json"
    return json.loads(path.read_text()) if path.is_file() else None
