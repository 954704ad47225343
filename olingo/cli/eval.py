"""`olingo eval MODEL [MODEL ...] [KEY=VALUE ...]`: the command (`eval_command`), its terminal
table (`format_eval_table`) and its figure (`eval_figure`, also drawn by `olingo report DIR`).
The sampling and the statistics are in `olingo.eval` (docs/eval.md)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from olingo.config import ConfigError, dump_config, load_config, packaged_config

PLOT = "eval.png"


OPTIONS_WITH_VALUE = ("--config", "--output")


def options_first(argv: list[str]) -> list[str]:
    """`eval` and its options, then the MODEL and KEY=VALUE words: argparse takes one run of
    positionals only, and `olingo eval A B --output D k=v` is how people type it."""
    options, words, rest = [], [], list(argv[1:])
    while rest:
        word = rest.pop(0)
        if word in OPTIONS_WITH_VALUE and rest:
            options += [word, rest.pop(0)]
        elif word.startswith("-"):
            options.append(word)
        else:
            words.append(word)
    return [argv[0], *options, *words]


def split_arguments(items: list[str]) -> tuple[list[str], list[str]]:
    """(MODEL arguments, KEY=VALUE overrides) of the command line, in order. A word holding '='
    is an override; a .yaml file is refused as a model (it belongs after --config)."""
    models, overrides = [], []
    for item in items:
        if "=" in item:
            overrides.append(item)
        elif item.endswith((".yaml", ".yml")) and Path(item).is_file():
            raise ConfigError(f"'{item}' is a config file, not a MODEL: olingo eval MODEL [MODEL ...] --config {item} [KEY=VALUE ...]")
        else:
            models.append(item)
    return models, overrides


def load_eval_config(args: argparse.Namespace) -> Any:
    """The `EvalConfig` of the command line: --config (default the packaged eval_tiny.yaml), the
    overrides, and the MODEL arguments in place of its `models` list."""
    models, overrides = split_arguments(args.items)
    cfg = load_config(args.config_model, args.config or packaged_config(args.default_config), overrides)
    if models:
        cfg.models = models
    return cfg


def eval_command(args: argparse.Namespace) -> int:
    """Run (or with --check, validate) the evaluation, print its table, draw its figure."""
    from olingo.cli.commands import print_on_master

    cfg = load_eval_config(args)
    if args.check:
        print(dump_config(cfg), end="")
        print_on_master("olingo: the eval config is valid (--check: nothing was loaded or run)")
        return 0
    from olingo.eval.runner import run_eval

    outcome = run_eval(cfg, args.output)
    print(format_eval_table(outcome.result))
    plot = write_eval_plot(outcome.output_dir, outcome.result)
    print(f"\neval directory: {outcome.output_dir} (eval.json, samples.jsonl; figure {plot})")
    return 0


def _cell(interval: dict[str, Any], signed: bool = False) -> str:
    """'0.512 [0.431, 0.590]' (with signs for a difference); '-' where undefined."""
    if interval.get("value") is None:
        return "-"
    form = "{:+.3f}" if signed else "{:.3f}"
    return f"{form.format(interval['value'])} [{form.format(interval['low'])}, {form.format(interval['high'])}]"


def format_eval_table(result: dict[str, Any]) -> str:
    """The terminal table: one row per metric, each model's value and interval, then each later
    model's difference to the first with its verdict. Models are M1, M2, ... (named below)."""
    labels = [m["label"] for m in result["models"]]
    short = {label: f"M{i + 1}" for i, label in enumerate(labels)}
    confidence = result["config"]["eval"]["confidence"]
    lines = [
        f"== olingo eval: {result['prompts']} prompts x {result['samples_per_prompt']} samples; "
        f"{confidence:.0%} bootstrap intervals over prompts; differences paired (same prompts, same seeds) ==",
    ]
    header = [f"{'metric':<16}"] + [f"{short[label]:<26}" for label in labels]
    header += [f"{short[label] + ' - M1':<28}{'verdict':<13}" for label in labels[1:]]
    lines.append("".join(header).rstrip())
    for metric in result["metrics"][labels[0]]:
        row = [f"{metric:<16}"] + [f"{_cell(result['metrics'][label].get(metric, {})):<26}" for label in labels]
        for label in labels[1:]:
            compared = result["comparisons"][label].get(metric, {})
            row.append(f"{_cell(compared, signed=True):<28}{compared.get('verdict', '-'):<13}")
        lines.append("".join(row).rstrip())
    lines += [f"{short[m['label']]} = {m['label']}" + (f" ({m['path']})" if m["path"] != m["label"] else "") for m in result["models"]]
    return "\n".join(lines)


def eval_figure(result: dict[str, Any]) -> Any:
    """pass@k and maj@k against k per model with their intervals; with two models or more, a
    second panel of each metric's difference to the first model with its paired interval."""
    from olingo.cli.report_figures import new_figure

    labels = [m["label"] for m in result["models"]]
    ks = result["k"]
    compare = len(labels) > 1
    fig = new_figure((12 if compare else 6.5, 4.5))
    axes = fig.subplots(1, 2 if compare else 1, squeeze=False)[0]
    for i, label in enumerate(labels):
        for family, style in (("pass", "-o"), ("maj", "--s")):
            points = [result["metrics"][label].get(f"{family}@{k}", {}) for k in ks]
            if any(p.get("value") is None for p in points):
                continue
            values = [p["value"] for p in points]
            errors = [[v - p["low"] for v, p in zip(values, points, strict=True)], [p["high"] - v for v, p in zip(values, points, strict=True)]]
            axes[0].errorbar(ks, values, yerr=errors, fmt=style, color=f"C{i}", capsize=3, label=f"M{i + 1} {family}@k")
    axes[0].set(xlabel="k", ylabel="estimate", title="pass@k (solid) and maj@k (dashed), with intervals", xscale="log", xticks=ks)
    axes[0].set_xticklabels([str(k) for k in ks])
    axes[0].minorticks_off()
    axes[0].legend(fontsize="small")
    if compare:
        _differences_panel(axes[1], result, labels)
    fig.suptitle(f"olingo eval: {result['prompts']} prompts x {result['samples_per_prompt']} samples (M1 = {labels[0]})", fontsize="medium")
    return fig


def _differences_panel(ax: Any, result: dict[str, Any], labels: list[str]) -> None:
    """Each bounded metric's difference to M1 (rows), one marker per later model, with intervals."""
    metrics = [m for m in result["metrics"][labels[0]] if m not in ("response_length", "turns", "tool_calls")]
    for i, label in enumerate(labels[1:], start=1):
        compared = result["comparisons"][label]
        rows = [(y, compared[m]) for y, m in enumerate(metrics) if compared.get(m, {}).get("value") is not None]
        offset = 0.15 * (i - (len(labels) - 1) / 2 - 0.5)
        for y, c in rows:
            ax.errorbar([c["value"]], [y + offset], xerr=[[c["value"] - c["low"]], [c["high"] - c["value"]]], fmt="o", color=f"C{i}", capsize=3)
        ax.plot([], [], "o", color=f"C{i}", label=f"M{i + 1} - M1")
    ax.axvline(0.0, color="grey", linewidth=1)
    ax.set_yticks(range(len(metrics)), metrics)
    ax.invert_yaxis()
    ax.set(xlabel="difference to M1 (paired bootstrap interval)", title="differences: an interval off 0 is a verdict")
    ax.legend(fontsize="small")


def write_eval_plot(out_dir: str | Path, result: dict[str, Any]) -> Path:
    """The figure as <out_dir>/plots/eval.png."""
    path = Path(out_dir) / "plots" / PLOT
    path.parent.mkdir(parents=True, exist_ok=True)
    eval_figure(result).savefig(path, dpi=100)
    return path
