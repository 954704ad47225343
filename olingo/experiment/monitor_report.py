"""The reward monitor in experiment reports (docs/monitor.md): per arm, over its seeds, whether
and when over-optimisation was flagged and the gold score at the best-gold evaluation.

It reads each run's `monitor.json`, which the `reward_monitor` callback keeps in the run directory;
runs without one (the monitor was not configured) are left out, and so is the section when no
run has one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from olingo.experiment.results import ArmResult, mean_std

SUMMARY = "monitor.json"


def run_monitor(run: ArmResult) -> dict[str, Any] | None:
    """The run's `monitor.json`, or None (no run directory, or no monitor in the run)."""
    path = Path(run.run_dir) / SUMMARY if run.run_dir else None
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError:
        return None  # a file cut short by a killed run: the report goes on without it


def flag_step(summary: dict[str, Any], kind: str = "overoptimisation") -> int | None:
    """The step at which `kind` was flagged in one run's summary, or None."""
    return next((f["step"] for f in summary.get("flags", []) if f["kind"] == kind), None)


def arm_verdicts(arms: list[ArmResult]) -> dict[str, dict[str, Any]]:
    """Per arm (`arm` or `arm/stage`), over its monitored runs: seeds, flagged seeds, the flag
    steps' mean and std, length-hacking flags, the gold at the best-gold evaluation's mean and std."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for run in arms:
        summary = run_monitor(run)
        if summary is not None:
            runs.setdefault(run.arm + (f"/{run.stage}" if run.stage else ""), []).append(summary)
    out = {}
    for label, summaries in runs.items():
        steps = [s for s in (flag_step(m) for m in summaries) if s is not None]
        golds = [m["best_gold"]["gold"] for m in summaries if m.get("best_gold")]
        out[label] = {"seeds": len(summaries), "flagged": len(steps), "flag_step": mean_std([float(s) for s in steps]) if steps else None,
                      "length_flagged": sum(flag_step(m, "length_hacking") is not None for m in summaries),
                      "best_gold": mean_std(golds) if golds else None}
    return out


def monitor_section(arms: list[ArmResult]) -> list[str]:
    """Markdown lines of the reward-monitor section (empty when no run was monitored)."""
    verdicts = arm_verdicts(arms)
    if not verdicts:
        return []
    lines = ["", "## Reward monitor (over-optimisation, docs/monitor.md)", "",
             "| arm | verdict | flagged seeds | flag step (mean +- std) | length hacking | gold at best gold (mean +- std) |", "|---|---|---|---|---|---|"]
    for label, v in verdicts.items():
        verdict = "over-optimised" if v["flagged"] else "not flagged"
        step = f"{v['flag_step'][0]:.1f} +- {v['flag_step'][1]:.1f}" if v["flag_step"] else "-"
        gold = f"{v['best_gold'][0]:.4g} +- {v['best_gold'][1]:.2g}" if v["best_gold"] else "-"
        lines.append(f"| {label} | {verdict} | {v['flagged']}/{v['seeds']} | {step} | {v['length_flagged']}/{v['seeds']} | {gold} |")
    return lines


def run_monitor_lines(run: ArmResult) -> list[str]:
    """Markdown lines for one run's summary.md: its flags with their evidence and the best gold."""
    summary = run_monitor(run)
    if summary is None:
        return []
    lines = ["", "## reward monitor", ""]
    lines += [f"- FLAG {f['kind']}: {f['message']}" for f in summary.get("flags", [])] or ["- no flag"]
    best = summary.get("best_gold")
    if best:
        lines.append(f"- best gold {best['gold']:.4g} at step {best['step']} (proxy {best['proxy']:.4g}); policy: {best.get('path') or 'not kept'}")
    return lines
