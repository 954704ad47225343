"""`olingo demo --pipeline distill`: on-policy distillation on the embedded arithmetic task.

    1. SFT (sft_tiny.yaml): the student's start
    2. GRPO from the SFT model (grpo_tiny.yaml), rewarded by the answer checker: the teacher
    3. on-policy distillation of the teacher into the SFT model (grpo_tiny.yaml with
       `model.teacher`, `experience.distill_coef: 1` and no reward): the student samples, and the
       teacher's log-probs of those samples are its only signal (docs/algorithms.md)
    4. the SFT model, the distilled student and the teacher on held-out prompts x 8 samples, with the
       same random draws for all: answer accuracy, greedy accuracy, KL to the teacher on each
       model's own samples (the reverse KL distillation lowers), response length

Each stage is an ordinary run directory under the output directory.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from olingo.cli.demo import sampled_metrics, seed_overrides
from olingo.config import load_config
from olingo.recipes.common import packaged_config
from olingo.recipes.grpo import GRPOConfig, run_grpo
from olingo.recipes.ppo import PPOConfig
from olingo.recipes.sft import SFTConfig, run_sft
from olingo.rewards.functions import CompositeReward
from olingo.tasks.evaluate import greedy_accuracy

MODELS = ("SFT", "student", "teacher")
DISTILL = ["experience.distill_coef=1.0", "reward.functions={}"]
"""The distillation stage on grpo_tiny.yaml: the teacher alone as the signal, as many episodes as the teacher's GRPO."""


@dataclass
class DistillDemoResult:
    run_dirs: dict[str, str]
    sampled: dict[str, dict[str, float]]  # model -> accuracy, kl (to the teacher), response_length, ...
    greedy: dict[str, float]
    temperature: float
    minutes: float


def run_distill_demo(
    output_dir: str = "runs", *, sft_overrides: Sequence[str] = (), grpo_overrides: Sequence[str] = (), distill_overrides: Sequence[str] = (),
    print_table: bool = True, seed: int | None = None,
) -> DistillDemoResult:
    """SFT, the GRPO teacher, the distilled student, and the table; overrides shorten it for tests."""
    started = time.monotonic()
    common = [f"run.output_dir={output_dir}", "run.overwrite=true", *seed_overrides(seed)]
    sft = run_sft(load_config(SFTConfig, packaged_config("sft_tiny.yaml"), [*common, "run.name=demo-sft", *sft_overrides]))
    teacher = run_grpo(load_config(GRPOConfig, packaged_config("grpo_tiny.yaml"), [
        *common, "run.name=demo-grpo", f"model.actor={sft['final_model']}", *grpo_overrides,
    ]))
    student = run_grpo(load_config(GRPOConfig, packaged_config("grpo_tiny.yaml"), [
        *common, "run.name=demo-distill", f"model.actor={sft['final_model']}", f"model.teacher={teacher['final_model']}", *DISTILL, *distill_overrides,
    ]))
    models = dict(zip(MODELS, (sft["final_model"], student["final_model"], teacher["final_model"]), strict=True))
    eval_cfg = load_config(PPOConfig, packaged_config("ppo_tiny.yaml"), seed_overrides(seed))  # held-out prompts and rollout sampling
    # The first model of `sampled_metrics` is the reference of the others' KL: here the teacher.
    teacher_row, *others = sampled_metrics(models["teacher"], [models["SFT"], models["student"]], CompositeReward({"arithmetic_exact": 1.0}), eval_cfg)
    result = DistillDemoResult(
        run_dirs={"sft": sft["run_dir"], "grpo": teacher["run_dir"], "distill": student["run_dir"]},
        sampled=dict(zip(MODELS, (*others, teacher_row), strict=True)),
        greedy={name: greedy_accuracy(path) for name, path in models.items()},
        temperature=eval_cfg.generation.temperature,
        minutes=(time.monotonic() - started) / 60,
    )
    if print_table:
        print(format_distill_table(result))
    return result


def format_distill_table(r: DistillDemoResult) -> str:
    """The before/after table as text."""
    rows = [
        (f"answer accuracy, sampled at temperature {r.temperature:g} (x 8 per prompt)", {m: r.sampled[m]["accuracy"] for m in MODELS}),
        ("greedy answer accuracy", r.greedy),
        ("KL to the teacher (nats per own sampled response)", {m: r.sampled[m]["kl"] for m in MODELS}),
        ("response length (tokens)", {m: r.sampled[m]["response_length"] for m in MODELS}),
    ]
    lines = [
        "\n== olingo demo --pipeline distill: the GRPO model distilled into its SFT start, on-policy (held-out prompts) ==",
        f"{'metric':<58}{'SFT':>9}{'student':>9}{'teacher':>9}",
        *(f"{label:<58}" + "".join(f"{values[m]:>9.3f}" for m in MODELS) for label, values in rows),
        "(student: the SFT model after on-policy distillation from the teacher, no reward; teacher: the SFT model after GRPO)",
        f"\nrun directories: {', '.join(r.run_dirs.values())}; {r.minutes:.1f} minutes",
    ]
    return "\n".join(lines)


__all__ = ["DistillDemoResult", "run_distill_demo"]
