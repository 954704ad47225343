"""TRL's GRPOTrainer (latest, 1.16), timed per optimizer step and per phase.

Runs under the ``trl-latest`` venv (``bench/trl/env.py --which grpo``)::

    bench/.venvs/trl-latest/bin/python bench/trl/grpo_trl.py --spec SPEC.json --out RESULT.json

The same GRPO step as ``bench/grpo_run.py`` (see its docstring): B prompts x G responses of exactly
L tokens, the arithmetic checker as the reward function, group-normalised advantages, the DAPO
token-mean clipped loss, one AdamW step per generation batch (mu = 1, no reference model). TRL's
loop runs unmodified; the timing comes from outside: ``bench.phases.PhaseClock(scoring=True)``
(the same clock the olingo and minimal runners install: ``generate`` wrapped, forward hooks on the
policy, ``torch.autograd.backward`` and optimizer-step hooks) and a TrainerCallback marking the
end of every optimizer step. Nothing here imports olingo (``bench.phases`` imports torch and
transformers only). See README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # for bench.phases

import torch  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from bench.phases import PhaseClock  # noqa: E402

_INTEGER = re.compile(r"[-+]?\d+")


def first_integer(text: str) -> str | None:
    """The first integer in `text`, canonicalised: olingo.tasks.arithmetic.extract_answer."""
    match = _INTEGER.search(text)
    return None if match is None else str(int(match.group()))


def arithmetic_exact(prompts, completions, gt_answer, **kwargs) -> list[float]:
    """TRL reward function: 1.0 when the completion's first integer equals the answer (the
    checker olingo's `arithmetic_exact` and the minimal loop use)."""
    out = []
    for completion, answer in zip(completions, gt_answer, strict=True):
        predicted = first_integer(completion)
        out.append(1.0 if predicted is not None and predicted == first_integer(answer) else 0.0)
    return out


class StepClock(TrainerCallback):
    """One step = on_step_end to on_step_end (generation happens inside the step's training_step;
    the batch fetch and the previous step's log fall between, and are counted). `cpu` marks the
    process CPU time (user + system, all threads) at the same points."""

    def __init__(self, clock: PhaseClock | None) -> None:
        self.clock, self.marks, self.cpu, self.phases, self.seen_tokens = clock, [], [], [], []

    def on_train_begin(self, args, state, control, **kwargs):
        self.marks, self.cpu = [time.perf_counter()], [time.process_time()]
        if self.clock is not None:
            self.clock.take()

    def on_step_end(self, args, state, control, **kwargs):
        self.marks.append(time.perf_counter())
        self.cpu.append(time.process_time())
        self.phases.append(self.clock.take() if self.clock is not None else {})
        self.seen_tokens.append(int(state.num_input_tokens_seen))


def load_prompts(path: str, tokenizer, count: int) -> Dataset:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()][:count]
    for row in rows:  # TRL tokenizes the text itself: it must give the ids the other runners use
        if tokenizer(row["prompt"])["input_ids"] != row["input_ids"]:
            raise ValueError(f"{path}: {row['prompt']!r} does not tokenize to its input_ids")
    return Dataset.from_dict({"prompt": [r["prompt"] for r in rows], "gt_answer": [r["gt_answer"] for r in rows]})


def run(spec: dict) -> dict:
    """Train TRL's GRPOTrainer as the spec says: step and phase times, rewards and the settings that ran."""
    mode = spec.get("mode", "fp32")
    if mode not in ("defaults", "fp32"):
        raise ValueError(f"mode must be 'defaults' or 'fp32', got {mode!r}")
    B, G, L = int(spec["batch_size"]), int(spec["num_generations"]), int(spec["response_length"])
    warmup, updates = int(spec["warmup_updates"]), int(spec["updates"])
    total = warmup + updates
    seed = int(spec["seed"])
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    torch.manual_seed(seed)

    tokenizer = AutoTokenizer.from_pretrained(spec["policy_dir"])
    prompts = load_prompts(spec["prompts"], tokenizer, B * total)
    policy = AutoModelForCausalLM.from_pretrained(spec["policy_dir"], dtype=torch.float32)
    clock = PhaseClock(scoring=True).install({"actor": policy}) if spec.get("phases", True) else None
    reward_fn = clock.wrap(arithmetic_exact, "reward_fn") if clock is not None else arithmetic_exact

    args = grpo_config(spec, mode, B, G, L, total, seed)
    timer = StepClock(clock)
    trainer = GRPOTrainer(model=policy, reward_funcs=reward_fn, args=args, train_dataset=prompts, processing_class=tokenizer, callbacks=[timer])
    rewards = record_mean_rewards(trainer)
    try:
        trainer.train()
    finally:
        shutil.rmtree(args.output_dir, ignore_errors=True)  # nothing is saved there

    steps = [b - a for a, b in zip(timer.marks, timer.marks[1:], strict=False)]
    cpu = [b - a for a, b in zip(timer.cpu, timer.cpu[1:], strict=False)]
    tokens = [b - a for a, b in zip([0, *timer.seen_tokens], timer.seen_tokens, strict=False)]
    settings = settings_that_ran(trainer, policy, args, mode, tokens)
    # prompt + completion tokens per step: B*G*(P+L) means every completion had exactly L tokens
    expected = B * G * (len(tokenizer(prompts[0]["prompt"])["input_ids"]) + L)
    if any(t != expected for t in tokens):
        raise RuntimeError(f"completions were not all {L} tokens long: tokens per step {tokens}, expected {expected}")
    return {
        "impl": "trl-fp32" if mode == "fp32" else "trl-defaults",
        "trl_version": trl.__version__, "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "step_times_s": steps[warmup:], "cpu_times_s": cpu[warmup:], "warmup_step_times_s": steps[:warmup], "phase_s": timer.phases[warmup:],
        "mean_reward": rewards, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "settings": settings,
    }


def grpo_config(spec: dict, mode: str, B: int, G: int, L: int, total: int, seed: int) -> GRPOConfig:
    """The `GRPOConfig` the spec describes: one generate of B x G completions of exactly L tokens
    per optimizer step, no KL term (bench/trl/README.md says how each field maps)."""
    kwargs = dict(
        output_dir=tempfile.mkdtemp(prefix="trl-grpo-"),
        per_device_train_batch_size=B * G,  # completions per optimizer step
        gradient_accumulation_steps=1,  # -> steps_per_generation 1: one generate of B x G per step
        num_generations=G,
        max_completion_length=L,
        # TRL always stops on the tokenizer's eos; min_new_tokens = L masks it, so every completion
        # has exactly L tokens, as in the other runners (which generate without an eos).
        generation_kwargs={"min_new_tokens": L},
        temperature=float(spec["temperature"]),
        top_p=1.0,
        top_k=0,
        beta=0.0,  # no KL term, no reference model
        num_iterations=1,
        epsilon=float(spec["eps_low"]),
        epsilon_high=float(spec["eps_high"]),
        loss_type="dapo",  # token mean over the whole step (TRL's default; olingo's token_mean)
        scale_rewards="group",
        learning_rate=float(spec["lr"]),
        adam_beta1=0.9,
        adam_beta2=0.95,
        weight_decay=0.0,
        max_grad_norm=1.0,
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": 0.1},
        warmup_steps=0,
        max_steps=total,
        seed=seed,
        eval_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
    )
    if spec.get("optim"):
        kwargs["optim"] = spec["optim"]
    if mode == "fp32":
        kwargs.update(bf16=False, fp16=False, gradient_checkpointing=False)
    return GRPOConfig(**kwargs)


def record_mean_rewards(trainer: GRPOTrainer) -> list[float]:
    """Each batch's mean reward, appended to the returned list as the trainer computes them."""
    rewards = []
    real_calculate = trainer._calculate_rewards

    def calculate_rewards(*a, **k):  # the batch's mean reward, for the results (not timed apart)
        out = real_calculate(*a, **k)
        rewards.append(float(out.float().mean()))
        return out

    trainer._calculate_rewards = calculate_rewards
    return rewards


def settings_that_ran(trainer: GRPOTrainer, policy: torch.nn.Module, args: GRPOConfig, mode: str, tokens: list[int]) -> dict:
    """What really ran: precision, generation, loss, optimizer and schedule settings, read back
    from the trainer, its optimizer and the policy (TRL's defaults included)."""
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    return {
        "mode": mode, "bf16": bool(args.bf16), "gradient_checkpointing": bool(args.gradient_checkpointing),
        "param_dtype": str(next(policy.parameters()).dtype), "per_device_train_batch_size": args.per_device_train_batch_size,
        "num_generations": args.num_generations, "generation_batch_size": args.generation_batch_size,
        "steps_per_generation": args.steps_per_generation, "max_completion_length": args.max_completion_length,
        "generation_kwargs": args.generation_kwargs, "eos_token_ids": trainer.eos_token_ids, "beta": args.beta,
        "loss_type": args.loss_type, "scale_rewards": args.scale_rewards, "epsilon": [args.epsilon, args.epsilon_high],
        "optim": getattr(args.optim, "value", str(args.optim)), "optimizer_class": type(optimizer).__name__,
        "optimizer_fused": optimizer.defaults.get("fused"), "lr_scheduler_type": getattr(args.lr_scheduler_type, "value", str(args.lr_scheduler_type)),
        "logging_steps": args.logging_steps, "shuffle_dataset": args.shuffle_dataset, "tokens_per_step": tokens,
        "torch_threads": torch.get_num_threads(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    result = run(json.loads(Path(a.spec).read_text()))
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    steps = result["step_times_s"]
    summary = f"[grpo_trl] {result['impl']}: {len(steps)} steps, median {statistics.median(steps):.3f} s" if steps else "[grpo_trl] no timed steps"
    print(summary, file=sys.stderr)


if __name__ == "__main__":
    main()
