"""The `olingo` command: one subcommand per stage, each driven by a strict YAML config."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from olingo.config import ConfigError, config_help, load_config
from olingo.recipes.common import packaged_config


def setup_logging() -> None:
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()


def _stage_parser(sub: argparse._SubParsersAction, name: str, summary: str, config_model: type, default_config: str) -> argparse.ArgumentParser:
    epilog = (
        f"Without --config, the packaged {default_config} is used (embedded task, tiny model).\n"
        "Override any field with dotted KEY=VALUE arguments (values parse as YAML), e.g.\n"
        f"  olingo {name} --config my.yaml train.lr=1e-4 run.name=try2 data.train=[a.jsonl,b.jsonl]\n"
        "Unknown keys are errors. Fields (section.key  type  = default  meaning):\n" + config_help(config_model)
    )
    parser = sub.add_parser(name, help=summary, description=summary, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", type=Path, default=None, help=f"YAML config file (default: packaged {default_config})")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides")
    parser.set_defaults(default_config=default_config, config_model=config_model)
    return parser


def build_parser() -> argparse.ArgumentParser:
    from olingo.recipes.ppo import PPOConfig
    from olingo.recipes.rm import RMConfig
    from olingo.recipes.sft import SFTConfig

    parser = argparse.ArgumentParser(prog="olingo", description="RLHF post-training: SFT, reward models and PPO, from a laptop CPU to a GPU cluster.")
    sub = parser.add_subparsers(dest="command", required=True)
    sft = _stage_parser(sub, "sft", "supervised fine-tuning of a causal LM on assistant tokens", SFTConfig, "sft_tiny.yaml")
    sft.set_defaults(handler=_cmd_sft)
    rm = _stage_parser(sub, "rm", "train a reward model on preference pairs", RMConfig, "rm_tiny.yaml")
    rm.set_defaults(handler=_cmd_rm)
    ppo = _stage_parser(sub, "ppo", "PPO from an SFT model against a reward model or reward functions", PPOConfig, "ppo_tiny.yaml")
    ppo.set_defaults(handler=_cmd_ppo)
    demo = sub.add_parser(
        "demo",
        help="SFT -> reward model -> PPO on the embedded arithmetic task; before/after table and plots",
        description="Runs olingo/configs/sft_tiny.yaml, then rm_tiny.yaml from the SFT model, then ppo_tiny.yaml "
        "with the SFT model as actor and the reward model as reward and critic start; each stage is a normal run "
        "directory under --output-dir. Prints held-out results before and after PPO and writes PNG plots "
        "(<run>/plots/).",
    )
    demo.add_argument("--output-dir", default="runs", help="parent of the run directories (default: runs)")
    demo.set_defaults(handler=_cmd_demo)
    _experiment_parser(sub)
    _plan_parser(sub)
    report = sub.add_parser(
        "report",
        help="plot a run's or an experiment's metrics as PNGs and print a summary",
        description="For a run directory: reads RUN_DIR/metrics.jsonl, writes RUN_DIR/plots/*.png and prints "
        "first/last/min/max per metric. For an experiment directory (it holds result.json): prints each final "
        "metric's mean +- std over the repeats per arm, and writes EXP_DIR/plots/<metric>.png with one curve "
        "per arm (mean over seeds) and a +- std band.",
    )
    report.add_argument("run_dirs", nargs="+", metavar="DIR", help="run directory (holds metrics.jsonl) or experiment directory")
    report.add_argument("--smooth", type=int, default=None, help="moving-average window (default: automatic; 0 = none)")
    report.set_defaults(handler=_cmd_report)
    return parser


def _experiment_parser(sub: argparse._SubParsersAction) -> None:
    from olingo.experiment.config import ExperimentConfig

    experiment = sub.add_parser("experiment", help="run an experiment: arms x seeds x continual stages, benchmarks, loggers")
    actions = experiment.add_subparsers(dest="action", required=True)
    epilog = (
        "Override any field with dotted KEY=VALUE arguments (values parse as YAML), e.g.\n"
        "  olingo experiment run exp.yaml n_repeats=3 matrix.base.train.epochs=5 overwrite=true\n"
        "Unknown keys are errors. Top-level fields (each arm is an olingo stage config, see docs/experiments.md):\n"
        + config_help(ExperimentConfig)
    )
    run = actions.add_parser(
        "run", help="run every arm and seed of EXP.yaml, then print the results", epilog=epilog,
        description="Runs EXP.yaml's arms one after another in this process; writes <output_dir>/<name>/ "
        "(experiment.yaml, result.json, runs/<run>/...). Exit status 0 when every run completed, 1 otherwise.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("path", type=Path, metavar="EXP.yaml", help="experiment config file")
    run.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides")
    run.set_defaults(handler=_cmd_experiment_run)


def _plan_parser(sub: argparse._SubParsersAction) -> None:
    plan = sub.add_parser(
        "plan", help="estimate memory per device for a stage config and warn when it will not fit",
        description="Reads a stage config (sft, rm or ppo; the stage is the one whose strict config accepts the file, "
        "or --stage) and prints per device: weights, gradients, AdamW state, activations and, for PPO, the KV cache "
        "of generation, then the peak against the device's memory (CUDA, else system RAM). Model sizes come from "
        "the models' config.json; no weights are loaded. Formulas and measured comparisons: docs/plan.md. "
        "Exit status 0 (a warning on stderr when it does not fit), 1 with --strict when it does not fit, 2 on a bad config.",
        epilog="Example: olingo plan --config my_sft.yaml train.batch_size=16 --world-size 8",
    )
    plan.add_argument("--config", type=Path, default=None, help="stage config file (default with --stage: the packaged <stage>_tiny.yaml)")
    plan.add_argument("--stage", choices=["sft", "rm", "ppo"], default=None, help="the config's stage (default: detected)")
    plan.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", "1")), help="processes the run will use (fsdp shards over them; default: $WORLD_SIZE or 1)")
    plan.add_argument("--strict", action="store_true", help="exit 1 when the estimate exceeds the device memory")
    plan.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides")
    plan.set_defaults(handler=_cmd_plan)


def _cmd_plan(args: argparse.Namespace) -> int:
    from olingo.plan import human, run_plan

    plan, table, fits = run_plan(str(args.config) if args.config else None, args.overrides, stage=args.stage, world_size=args.world_size)
    print(table)
    if fits:
        return 0
    print(f"olingo plan: WARNING: the estimated peak {human(plan.total)} per device exceeds the device memory", file=sys.stderr)
    return 1 if args.strict else 0


def _cmd_experiment_run(args: argparse.Namespace) -> int:
    from olingo.experiment import run_experiment
    from olingo.report import format_experiment_table

    result = run_experiment(args.path, args.overrides)
    print(f"experiment directory: {result.output_dir}")
    print(format_experiment_table(result))
    print(f"status: {result.status}")
    print(f"conclusion: {result.conclusion}")
    return 0 if result.status == "completed" else 1


def _load(args: argparse.Namespace):
    path = args.config or packaged_config(args.default_config)
    return load_config(args.config_model, path, args.overrides)


def _cmd_sft(args: argparse.Namespace) -> int:
    from olingo.recipes.sft import run_sft

    result = run_sft(_load(args))
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"run directory: {result['run_dir']}")
        print(f"final model:   {result['final_model']}")
        if result["eval"]:
            print(f"held-out loss: {result['eval']['eval/loss']:.4f}")
    return 0


def _cmd_rm(args: argparse.Namespace) -> int:
    from olingo.recipes.rm import run_rm

    result = run_rm(_load(args))
    acc = (result["eval"] or {}).get("eval/acc")
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"run directory: {result['run_dir']}")
        print(f"final model:   {result['final_model']}")
        if acc is not None:
            print(f"held-out pairwise accuracy: {acc:.3f}")
    return 0


def _cmd_ppo(args: argparse.Namespace) -> int:
    from olingo.recipes.ppo import run_ppo

    result = run_ppo(_load(args))
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"run directory: {result['run_dir']}")
        print(f"final actor:   {result['final_model']}")
        for name, value in (result["eval"] or {}).items():
            print(f"held-out {name}: {value:.4f}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from olingo.report import format_summary, is_experiment_dir, summarize, write_report

    for run_dir in args.run_dirs:
        if is_experiment_dir(run_dir):
            _report_experiment(run_dir, args.smooth)
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
    from olingo.report import (
        format_experiment_table,
        load_experiment_result,
        write_experiment_report,
    )

    paths = write_experiment_report(exp_dir, smooth=smooth)
    result = load_experiment_result(exp_dir)
    print(f"{exp_dir}: experiment {result.name} ({result.status}); wrote {len(paths)} plots to {Path(exp_dir) / 'plots'}")
    print(format_experiment_table(result))
    print(f"conclusion: {result.conclusion}")


def _cmd_demo(args: argparse.Namespace) -> int:
    from olingo.recipes.demo import run_demo

    run_demo(args.output_dir)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging()
    from olingo.dataset import DataError

    try:
        return args.handler(args)
    except (ConfigError, DataError) as err:
        print(f"olingo: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
