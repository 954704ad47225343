"""The `olingo` command: one subcommand per stage, each driven by a strict YAML config."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from importlib import resources
from pathlib import Path

from olingo.config import ConfigError, config_help, load_config

CONFIGS = resources.files("olingo") / "configs"


def packaged_config(name: str) -> Path:
    """Path of a config shipped inside the package (olingo/configs/<name>)."""
    return Path(str(CONFIGS / name))


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
    from olingo.recipes.rm import RMConfig
    from olingo.recipes.sft import SFTConfig

    parser = argparse.ArgumentParser(prog="olingo", description="RLHF post-training: SFT and reward models (PPO next) from a laptop CPU to a GPU cluster.")
    sub = parser.add_subparsers(dest="command", required=True)
    sft = _stage_parser(sub, "sft", "supervised fine-tuning of a causal LM on assistant tokens", SFTConfig, "sft_tiny.yaml")
    sft.set_defaults(handler=_cmd_sft)
    rm = _stage_parser(sub, "rm", "train a reward model on preference pairs", RMConfig, "rm_tiny.yaml")
    rm.set_defaults(handler=_cmd_rm)
    demo = sub.add_parser(
        "demo",
        help="SFT then a reward model on the embedded arithmetic task; reports held-out results",
        description="Runs olingo/configs/sft_tiny.yaml, then rm_tiny.yaml starting from the SFT model, "
        "each a normal run directory under --output-dir, and prints held-out results.",
    )
    demo.add_argument("--output-dir", default="runs", help="parent of the run directories (default: runs)")
    demo.set_defaults(handler=_cmd_demo)
    return parser


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


def _cmd_demo(args: argparse.Namespace) -> int:
    from olingo.recipes.common import resolve_path
    from olingo.recipes.rm import RMConfig, run_rm
    from olingo.recipes.sft import SFTConfig, run_sft
    from olingo.tasks.evaluate import greedy_accuracy

    common = [f"run.output_dir={args.output_dir}", "run.overwrite=true"]
    sft = run_sft(load_config(SFTConfig, packaged_config("sft_tiny.yaml"), [*common, "run.name=demo-sft"]))
    rm = run_rm(load_config(RMConfig, packaged_config("rm_tiny.yaml"), [*common, "run.name=demo-rm", f"model.path={sft['final_model']}"]))
    base_acc, sft_acc = greedy_accuracy(resolve_path("builtin:tiny-llama")), greedy_accuracy(sft["final_model"])
    print("\n== olingo demo: the embedded arithmetic task (held-out prompts never seen in training) ==")
    print(f"{'stage':<14}{'metric':<44}{'value':>8}")
    print(f"{'base model':<14}{'greedy answer accuracy':<44}{base_acc:>8.3f}")
    print(f"{'SFT':<14}{'greedy answer accuracy':<44}{sft_acc:>8.3f}")
    print(f"{'reward model':<14}{'pairwise accuracy (correct > wrong answer)':<44}{rm['eval']['eval/acc']:>8.3f}")
    print(f"run directories: {sft['run_dir']}, {rm['run_dir']}  (metrics.jsonl, tb/, checkpoints/final/model)")
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
