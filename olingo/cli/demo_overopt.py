"""`olingo demo --pipeline overopt`: the reward monitor catching over-optimisation (docs/monitor.md).

    1. SFT (sft_tiny.yaml)
    2. a reward model from the SFT model trained for 2 epochs instead of 20 (rm_tiny.yaml): an
       under-trained proxy, right on fewer held-out pairs than the full one
    3. the packaged experiment experiment_overopt.yaml: GRPO from the SFT model rewarded by that
       reward model alone, at KL coefficients 0.001 and 3, two seeds each, watched by `reward_monitor`
       with the answer checker as the held-out gold; a flagged run stops and keeps its best-gold policy
    4. per arm over its seeds: the monitor's verdict and flag step, proxy and gold at the first and
       the last evaluation, the greedy accuracy of the final policy; each run's
       plots/overoptimisation.png (proxy and gold against steps and against sqrt(KL))

Each stage is an ordinary run directory under the output directory, the experiment under
`<output_dir>/experiments/overopt`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from olingo.cli.demo import seed_overrides
from olingo.cli.report_series import monitor_rows
from olingo.config import load_config, packaged_config
from olingo.experiment.monitor_report import arm_verdicts
from olingo.experiment.results import ArmResult, mean_std
from olingo.recipes.rm import RMConfig, run_rm
from olingo.recipes.sft import SFTConfig, run_sft

UNDER_TRAINED = ["train.epochs=2"]
"""The proxy: rm_tiny.yaml stopped at 2 of its 20 epochs."""


@dataclass
class ArmSummary:
    """One arm of the experiment over its seeds (means; `flag_step` None when no seed was flagged)."""

    kl_coef: float
    seeds: int
    flagged: int
    flag_step: float | None
    proxy: tuple[float, float]  # mean over seeds at the first and at the last evaluation
    gold: tuple[float, float]
    greedy: float  # the `arithmetic` benchmark: greedy accuracy of the final policy


@dataclass
class OveroptDemoResult:
    run_dirs: dict[str, str]
    experiment_dir: str
    rm_pair_accuracy: float
    arms: dict[str, ArmSummary]
    minutes: float


def run_overopt_demo(
    output_dir: str = "runs", *, sft_overrides: Sequence[str] = (), rm_overrides: Sequence[str] = (), experiment_overrides: Sequence[str] = (),
    print_table: bool = True, seed: int | None = None,
) -> OveroptDemoResult:
    """SFT, the under-trained reward model, the two-arm experiment, and the table; overrides shorten
    it for tests (`experiment_overrides` are the experiment's, e.g. `matrix.base.loop.episodes=2`)."""
    from olingo.cli.report import write_report
    from olingo.cli.report_experiment import write_experiment_report
    from olingo.experiment import Experiment

    started = time.monotonic()
    common = [f"run.output_dir={output_dir}", "run.overwrite=true", *seed_overrides(seed)]
    sft = run_sft(load_config(SFTConfig, packaged_config("sft_tiny.yaml"), [*common, "run.name=demo-sft", *sft_overrides]))
    rm = run_rm(load_config(RMConfig, packaged_config("rm_tiny.yaml"), [
        *common, "run.name=demo-rm-weak", f"model.path={sft['final_model']}", *UNDER_TRAINED, *rm_overrides,
    ]))
    experiment = Experiment.from_yaml(packaged_config("experiment_overopt.yaml"), [
        f"output_dir={Path(output_dir) / 'experiments'}", "overwrite=true", *([f"base_seed={seed}"] if seed is not None else []),
        f"matrix.base.model.actor={sft['final_model']}", f"matrix.base.reward.model={rm['final_model']}", *experiment_overrides,
    ])
    outcome = experiment.run()
    for run in outcome.arms:
        if run.run_dir:
            write_report(run.run_dir)
    write_experiment_report(experiment.dir)
    result = OveroptDemoResult(
        run_dirs={"sft": sft["run_dir"], "rm": rm["run_dir"]},
        experiment_dir=str(experiment.dir),
        rm_pair_accuracy=rm["eval"]["eval/acc"],
        arms=summarise_arms(outcome.arms),
        minutes=(time.monotonic() - started) / 60,
    )
    if print_table:
        print(format_overopt_table(result))
    return result


def summarise_arms(runs: list[ArmResult]) -> dict[str, ArmSummary]:
    """Per arm: the monitor's verdict over seeds and the monitor rows' first and last proxy and gold."""
    verdicts = arm_verdicts(runs)
    out = {}
    for arm, verdict in verdicts.items():
        members = [r for r in runs if r.arm == arm and r.run_dir]
        curves = [monitor_rows(Path(r.run_dir)) for r in members]
        first = [c[0] for c in curves if c]
        last = [c[-1] for c in curves if c]
        out[arm] = ArmSummary(
            kl_coef=float(members[0].run_config["experience"]["kl_coef"]),
            seeds=verdict["seeds"],
            flagged=verdict["flagged"],
            flag_step=verdict["flag_step"][0] if verdict["flag_step"] else None,
            proxy=(mean_std([r["monitor/proxy"] for r in first])[0], mean_std([r["monitor/proxy"] for r in last])[0]),
            gold=(mean_std([r["monitor/gold"] for r in first])[0], mean_std([r["monitor/gold"] for r in last])[0]),
            greedy=mean_std([v for r in members if (v := r.value("arithmetic/accuracy")) is not None])[0],
        )
    return out


def format_overopt_table(r: OveroptDemoResult) -> str:
    """The verdict table as text."""
    lines = [
        "\n== olingo demo --pipeline overopt: GRPO on an under-trained reward model, watched by the reward monitor ==",
        f"proxy: the reward model after 2 of 20 epochs (held-out pairwise accuracy {r.rm_pair_accuracy:.3f}); "
        "gold (held out): the answer checker on the same held-out samples",
        f"{'arm':<10}{'kl_coef':>8}{'flagged':>9}{'flag step':>11}{'proxy first -> last':>22}{'gold first -> last':>21}{'greedy acc':>12}",
    ]
    for name, a in r.arms.items():
        step = f"{a.flag_step:.0f}" if a.flag_step is not None else "-"
        lines.append(
            f"{name:<10}{a.kl_coef:>8g}{f'{a.flagged}/{a.seeds}':>9}{step:>11}{f'{a.proxy[0]:.3f} -> {a.proxy[1]:.3f}':>22}"
            f"{f'{a.gold[0]:.3f} -> {a.gold[1]:.3f}':>21}{a.greedy:>12.3f}"
        )
    lines += [
        "(means over seeds; a flagged run stops at its flag, so its last evaluation is the flagged one; greedy acc: the final policy)",
        f"\nexperiment: {r.experiment_dir} (experiment.md; `olingo report {r.experiment_dir}`); each run's plots/overoptimisation.png",
        f"run directories: {', '.join(r.run_dirs.values())}; {r.minutes:.1f} minutes",
    ]
    return "\n".join(lines)


__all__ = ["OveroptDemoResult", "run_overopt_demo"]
