"""What each `olingo` subcommand does once its arguments are parsed (`olingo.cli.parser` sets
each as its subcommand's `handler`): run the stage, experiment, plan, report or demo, and print
its outcome. Each imports what it runs only when called, so `olingo --help` imports none of it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from olingo.config import ConfigError, dump_config, load_config, packaged_config, packaged_configs


def cmd_plan(args: argparse.Namespace) -> int:
    from olingo.cli.plan import human, run_plan

    plan, table, fits = run_plan(str(args.config) if args.config else None, args.overrides, stage=args.stage, world_size=args.world_size)
    print(table)
    if fits:
        return 0
    print(f"olingo plan: WARNING: the estimated peak {human(plan.total)} per device exceeds the device memory", file=sys.stderr)
    return 1 if args.strict else 0


def cmd_experiment_run(args: argparse.Namespace) -> int:
    from olingo.cli.report_experiment import format_experiment_table
    from olingo.experiment import run_experiment

    result = run_experiment(args.path, args.overrides)
    print(f"experiment directory: {result.output_dir}")
    print(format_experiment_table(result))
    print(f"status: {result.status}")
    print(f"conclusion: {result.conclusion}")
    return 0 if result.status == "completed" else 1


def cmd_configs(args: argparse.Namespace) -> int:
    """`olingo configs`: one line per packaged config."""
    found = packaged_configs()
    width = max(len(c.name) for c in found)
    print(f"{'name':<{width}}  {'stage':<10}  description")
    for config in found:
        print(f"{config.name:<{width}}  {config.stage:<10}  {config.description}")
    print("\nRun one with: olingo <stage> --config NAME [KEY=VALUE ...] (a local file of that name wins); "
          "experiments: olingo experiment run packaged:NAME")
    return 0


def _load(args: argparse.Namespace):
    path = args.config or packaged_config(args.default_config)
    for text in args.overrides:
        if "=" not in text and text.endswith((".yaml", ".yml")):  # `olingo ppo my.yaml`: a file, not an override
            raise ConfigError(f"'{text}' is a config file, not a KEY=VALUE override: olingo {args.command} --config {text} [KEY=VALUE ...]")
    return load_config(args.config_model, path, args.overrides)


def checked(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """`handler`, or with --check: load and validate the config, print it resolved, run nothing."""

    def run(args: argparse.Namespace) -> int:
        if not getattr(args, "check", False):
            return handler(args)
        print(dump_config(_load(args)), end="")
        print_on_master(f"olingo: the {args.command} config is valid (--check: nothing was loaded or run)")
        return 0

    return run


def cmd_sft(args: argparse.Namespace) -> int:
    from olingo.recipes.sft import run_sft

    result = run_sft(_load(args))
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"run directory: {result['run_dir']}")
        print(f"final model:   {result['final_model']}")
        if result["eval"]:
            print(f"held-out loss: {result['eval']['eval/loss']:.4f}")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    from olingo.recipes.rm import run_rm

    result = run_rm(_load(args))
    acc = (result["eval"] or {}).get("eval/acc")
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"run directory: {result['run_dir']}")
        print(f"final model:   {result['final_model']}")
        if acc is not None:
            print(f"held-out pairwise accuracy: {acc:.3f}")
    return 0


def cmd_ppo(args: argparse.Namespace) -> int:
    from olingo.recipes.ppo import run_ppo

    return _print_rl_result(run_ppo(_load(args)))


def cmd_grpo(args: argparse.Namespace) -> int:
    from olingo.recipes.grpo import run_grpo

    return _print_rl_result(run_grpo(_load(args)))


def cmd_offline(args: argparse.Namespace) -> int:
    from olingo.recipes import dpo

    run = {"dpo": dpo.run_dpo, "orpo": dpo.run_orpo, "kto": dpo.run_kto}[args.command]
    result = run(_load(args))
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"run directory: {result['run_dir']}")
        print(f"final model:   {result['final_model']}")
        for name in ("eval/loss", "eval/rewards/accuracies", "eval/rewards/margins"):
            if name in (result["eval"] or {}):
                print(f"held-out {name.removeprefix('eval/')}: {result['eval'][name]:.4f}")
    return 0


def _print_rl_result(result: dict[str, Any]) -> int:
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"run directory: {result['run_dir']}")
        print(f"final actor:   {result['final_model']}")
        before = result.get("eval_before") or {}  # the step-0 evaluation, when it ran
        for name, value in (result["eval"] or {}).items():
            start = f" (before training: {before[name]:.4f})" if name in before else ""
            print(f"held-out {name}: {value:.4f}{start}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from olingo.cli.eval import eval_command

    return eval_command(args)


def cmd_report(args: argparse.Namespace) -> int:
    from olingo.cli.report import is_eval_dir, write_eval_report, write_report
    from olingo.cli.report_experiment import is_experiment_dir
    from olingo.cli.report_series import format_summary, summarize

    for run_dir in args.run_dirs:
        if is_experiment_dir(run_dir):
            _report_experiment(run_dir, args.smooth)
            continue
        if is_eval_dir(run_dir):
            try:
                print(write_eval_report(run_dir))
            except FileNotFoundError as err:
                print(f"olingo report: {err}", file=sys.stderr)
                return 2
            continue
        try:
            paths = write_report(run_dir, smooth=args.smooth)
        except (FileNotFoundError, ValueError) as err:
            print(f"olingo report: {err}", file=sys.stderr)
            return 2
        print(f"{run_dir}: wrote {len(paths)} plots to {Path(run_dir) / 'plots'}")
        print(format_summary(summarize(run_dir)))
    return 0


def _report_experiment(exp_dir: str, smooth: int | None) -> None:
    from olingo.cli.report_experiment import (
        format_experiment_table,
        load_experiment_result,
        write_experiment_report,
    )

    paths = write_experiment_report(exp_dir, smooth=smooth)
    result = load_experiment_result(exp_dir)
    print(f"{exp_dir}: experiment {result.name} ({result.status}); wrote {len(paths)} plots to {Path(exp_dir) / 'plots'}")
    print(format_experiment_table(result))
    print(f"conclusion: {result.conclusion}")


def cmd_demo(args: argparse.Namespace) -> int:
    if args.through != "environment" and args.pipeline != "agent":
        from olingo.errors import OlingoError

        raise OlingoError("olingo demo --through applies to --pipeline agent only")
    if args.pipeline == "agent":
        if args.model != "smollm2":
            from olingo.errors import OlingoError

            raise OlingoError("olingo demo --pipeline agent runs on the real model only: add --model smollm2 (`make real` installs it)")
        from olingo.cli.demo_agent import run_agent_demo

        run_agent_demo(args.output_dir, through=args.through)
        return 0
    if args.pipeline in ("distill", "overopt"):
        if args.model != "tiny":
            from olingo.errors import OlingoError

            raise OlingoError(f"olingo demo --pipeline {args.pipeline} runs on the embedded tiny model only: drop --model smollm2")
        from olingo.cli.demo_distill import run_distill_demo
        from olingo.cli.demo_overopt import run_overopt_demo

        (run_distill_demo if args.pipeline == "distill" else run_overopt_demo)(args.output_dir, seed=args.seed)
        return 0
    if args.model == "smollm2":
        from olingo.cli.demo_real import run_real_demo

        run_real_demo(args.output_dir)
        return 0
    from olingo.cli.demo import run_demo, run_dpo_demo

    (run_dpo_demo if args.pipeline == "dpo" else run_demo)(args.output_dir, seed=args.seed)
    return 0


def print_on_master(message: str) -> None:
    """`message` on stderr, from rank 0 only (under torchrun every rank runs the command)."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(message, file=sys.stderr, flush=True)
