"""GRPO of SmolLM2-135M-Instruct on one GPU: the real-model demo's task, longer, with its learning curve.

    PYTHONPATH=. python bench/gpu_grpo_real.py [--episodes 80] [--rollout-prompts 32] [--out DIR]

The recipe is `olingo grpo` with the demo's config (`configs/grpo_smollm2.yaml`: LoRA r 16 on
every linear layer, rewarded by `math_answer` + 0.25 x `ends_with_number`, no KL term) and these
changes for a GPU: the base weights in bf16 (`model.dtype=bfloat16`; peft keeps the adapters in
fp32, so AdamW updates fp32 tensors), `--rollout-prompts` x 8 responses per episode (the demo: 6 x 8),
one optimizer step per episode as in the demo, and the held-out questions evaluated every
`--eval-every` steps (`eval/accuracy` in metrics.jsonl: one sampled answer per question at the
rollout temperature). After training, the start and the final model are evaluated as the CPU
demo does (`evaluate_models`: `--eval-samples` sampled answers per question with the same draws
for both, and greedy).

Writes into --out (default $OUT, else runs/gpu-grpo-real): `gpu_grpo_real.json` (the
configuration, the device, the before/after table, the eval curve, seconds per step),
`metrics.jsonl` of the run and its plots `reward.png`, `eval.png`, `time.png`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from olingo.cli.demo_real import RealDemoSizes, evaluate_models, write_task_data  # noqa: E402
from olingo.cli.report import write_report  # noqa: E402
from olingo.config import load_config  # noqa: E402
from olingo.recipes.common import packaged_config, resolve_model_path  # noqa: E402
from olingo.recipes.grpo import GRPOConfig, run_grpo  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=80, help="GRPO episodes (one optimizer step each)")
    p.add_argument("--rollout-prompts", type=int, default=32, help="questions per episode (x 8 responses)")
    p.add_argument("--train-prompts", type=int, default=4096, help="generated training questions")
    p.add_argument("--eval-prompts", type=int, default=256, help="held-out questions")
    p.add_argument("--eval-samples", type=int, default=4, help="sampled answers per held-out question, before/after")
    p.add_argument("--eval-every", type=int, default=10, help="optimizer steps between held-out evaluations")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="the base weights' dtype")
    p.add_argument("--out", type=Path, help="output directory (default $OUT, else runs/gpu-grpo-real)")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    out = args.out or Path(os.environ.get("OUT") or "runs/gpu-grpo-real")
    work = Path(os.environ.get("GPU_GRPO_WORK", "runs/gpu-grpo-work"))
    sizes = RealDemoSizes(train_prompts=args.train_prompts, eval_prompts=args.eval_prompts, eval_samples=args.eval_samples)
    data = write_task_data(work / "data", sizes)
    start = resolve_model_path("builtin:smollm2")
    generations = 8
    cfg = load_config(GRPOConfig, packaged_config("grpo_smollm2.yaml"), [
        f"run.output_dir={work}", "run.overwrite=true", "run.name=gpu-grpo-real", f"model.dtype={args.dtype}",
        f"data.prompts=[{data['train']}]", f"data.eval_prompts=[{data['eval']}]", f"loop.eval_interval={args.eval_every}",
        f"experience.num_generations={generations}", f"loop.episodes={args.episodes}", f"loop.rollout_batch_size={args.rollout_prompts}",
        f"loop.train_batch_size={args.rollout_prompts * generations // 4}", "loop.accumulation_steps=4", "logging.progress=false",
    ])
    report: dict = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu", "torch": torch.__version__,
                    "args": {k: str(v) for k, v in vars(args).items()}, "config": cfg.model_dump(mode="json")}
    began = time.monotonic()
    run = run_grpo(cfg)
    report["grpo_s"] = time.monotonic() - began
    sampled = evaluate_models([start, run["final_model"]], data["eval"], cfg, args.eval_samples, greedy=False)
    greedy = evaluate_models([start, run["final_model"]], data["eval"], cfg, 1, greedy=True)
    report["table"] = {"start": {"sampled": sampled[0], "greedy": greedy[0]}, "GRPO": {"sampled": sampled[1], "greedy": greedy[1]}}
    rows = [json.loads(line) for line in (Path(run["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    report["eval_curve"] = [{"step": r["step"], **{k: v for k, v in r.items() if k.startswith("eval/")}} for r in rows if r.get("split") == "eval"]
    report["reward_curve"] = [[r["step"], r["rollout/reward_mean"]] for r in rows if "rollout/reward_mean" in r]
    report["step_seconds"] = [[r["step"], r.get("time/make_experience"), r.get("time/learn")] for r in rows if "time/learn" in r]
    if torch.cuda.is_available():
        report["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_grpo_real.json").write_text(json.dumps(report, indent=1) + "\n")
    shutil.copy(Path(run["run_dir"]) / "metrics.jsonl", out / "metrics.jsonl")
    for plot in write_report(run["run_dir"]):
        if plot.name in ("reward.png", "eval.png", "time.png"):
            shutil.copy(plot, out / plot.name)
    print(json.dumps(report["table"], indent=1))


if __name__ == "__main__":
    main()
