"""TRL's multi-turn GRPO (``GRPOTrainer(environment_factory=...)``, TRL 1.16), timed per optimizer step.

Runs under the ``trl-latest`` venv (``bench/trl/env.py --which grpo``)::

    bench/.venvs/trl-latest/bin/python bench/trl/agent_trl.py --spec SPEC.json --out RESULT.json

The same step as ``bench/agent_run.py``: B conversational prompts x G rollouts, each rollout
``max_turns`` assistant turns with a tool reply between two turns (``bench/agent_env.py``). How TRL
1.16 runs it (``trl/trainer/grpo_trainer.py``): the factory is called once per rollout the first time
(instances are pooled and ``reset(**row)`` each batch); the environment's public methods are the tools,
rendered into the prompt with ``tools=``; every turn is one ``generate`` over the rollouts still
calling tools, whose completions are parsed by ``tokenizer.parse_response`` (the response template);
each parsed call runs, its result is appended as a ``tool`` message, whose tokens come from the chat
template (``_get_tool_suffix_ids``), for at most ``max_tool_calling_iterations`` rounds (so
``max_turns - 1``); ``max_completion_length`` bounds the whole completion (tool tokens included), and
``generation_kwargs={"max_new_tokens": ...}`` each turn. Tool tokens are masked out of the loss
(``tool_mask``). The rollout's reward is the environment's ``get_reward()``.
TRL's loop runs unmodified; the timing comes from outside (``bench.phases.PhaseClock`` and the step
callback of ``grpo_trl.py``); ``_tool_call_loop`` is wrapped only to read the tool mask back
(tokens by role) and time it.
"""

from __future__ import annotations

import argparse
import json
import os
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
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # for bench.phases, bench.agent_env

import torch  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from bench.agent_env import TRLLookupEnv, load_agent_tokenizer, user_messages  # noqa: E402
from bench.phases import PhaseClock  # noqa: E402
from bench.trl.grpo_trl import StepClock  # noqa: E402


def load_prompts(path: str, tokenizer, count: int) -> Dataset:
    """Conversational prompts; TRL renders each with the chat template (and ``tools=``): that must give
    the ids the olingo runner starts its episodes from (checked)."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    rows = [rows[i % len(rows)] for i in range(count)]
    for row in rows[:8]:
        ids = tokenizer.apply_chat_template(user_messages(row["prompt"]), add_generation_prompt=True, tokenize=True, return_dict=False)
        if list(ids) != row["input_ids"]:
            raise ValueError(f"{path}: {row['prompt']!r} does not render to its input_ids")
    return Dataset.from_dict({"prompt": [user_messages(r["prompt"]) for r in rows], "gt_answer": [r["gt_answer"] for r in rows]})


def agent_config(spec: dict, B: int, G: int, total: int, seed: int) -> GRPOConfig:
    """The GRPOConfig of one step of B x G rollouts, ``max_turns`` turns each, no KL term; the
    optimizer and schedule as ``grpo_trl.py``."""
    return GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-agent-"),
        per_device_train_batch_size=B * G, gradient_accumulation_steps=1, num_generations=G,
        max_completion_length=int(spec["max_episode_tokens"]),  # the whole episode, tool tokens included
        generation_kwargs={"max_new_tokens": int(spec["max_new_tokens"])},  # each turn
        max_tool_calling_iterations=int(spec["max_turns"]) - 1,
        temperature=float(spec["temperature"]), top_p=1.0, top_k=0,
        beta=0.0, num_iterations=1, epsilon=float(spec["eps_low"]), epsilon_high=float(spec["eps_high"]),
        loss_type="dapo", scale_rewards="group",
        learning_rate=float(spec["lr"]), adam_beta1=0.9, adam_beta2=0.95, weight_decay=0.0, max_grad_norm=1.0,
        lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr_rate": 0.1}, warmup_steps=0,
        max_steps=total, seed=seed, eval_strategy="no", save_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True,
        bf16=False, fp16=False, gradient_checkpointing=False,
    )


def count_tokens(trainer: GRPOTrainer) -> list[dict]:
    """Per generation batch: rollouts, assistant turns, sampled and tool tokens (from TRL's own
    ``tool_mask``) and the seconds inside ``_tool_call_loop`` (tools and the turns after the first)."""
    counts = []
    real_loop = trainer._tool_call_loop

    def tool_call_loop(*args, **kwargs):
        started = time.perf_counter()
        out = real_loop(*args, **kwargs)
        seconds = time.perf_counter() - started
        tool_mask, completions = out[0], out[1]
        sampled = sum(sum(m) for m in tool_mask)
        turns = sum(sum(1 for msg in c if msg.get("role") == "assistant") for c in completions)
        counts.append({"episodes": len(tool_mask), "turns": turns, "sampled": sampled, "env": sum(len(m) for m in tool_mask) - sampled,
                       "tool_calls": out[4], "tool_failures": out[5], "tool_loop_seconds": seconds})
        return out

    trainer._tool_call_loop = tool_call_loop
    return counts


def run(spec: dict) -> dict:
    """Train TRL's GRPOTrainer with the environment as the spec says: step times, tokens by role, settings."""
    B, G = int(spec["batch_size"]), int(spec["num_generations"])
    warmup, total, seed = int(spec["warmup_updates"]), int(spec["warmup_updates"]) + int(spec["updates"]), int(spec["seed"])
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    torch.manual_seed(seed)
    tokenizer = load_agent_tokenizer(spec["policy_dir"])
    prompts = load_prompts(spec["prompts"], tokenizer, B * total)
    policy = AutoModelForCausalLM.from_pretrained(spec["policy_dir"], dtype=torch.float32)
    clock = PhaseClock(scoring=True).install({"actor": policy}) if spec.get("phases", True) else None
    args = agent_config(spec, B, G, total, seed)
    timer = StepClock(clock)
    trainer = GRPOTrainer(model=policy, args=args, train_dataset=prompts, processing_class=tokenizer, callbacks=[timer],
                          environment_factory=TRLLookupEnv)
    counts = count_tokens(trainer)
    try:
        trainer.train()
    finally:
        shutil.rmtree(args.output_dir, ignore_errors=True)
    steps = [b - a for a, b in zip(timer.marks, timer.marks[1:], strict=False)]
    cpu = [b - a for a, b in zip(timer.cpu, timer.cpu[1:], strict=False)]
    settings = {"max_completion_length": args.max_completion_length, "generation_kwargs": args.generation_kwargs,
                "max_tool_calling_iterations": args.max_tool_calling_iterations, "eos_token_ids": trainer.eos_token_ids,
                "chat_template_replaced": trainer.chat_template is not None, "tools": [t.__name__ for t in trainer.tools],
                "optim": getattr(args.optim, "value", str(args.optim)), "torch_threads": torch.get_num_threads()}
    return {
        "impl": "trl", "trl_version": trl.__version__, "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "step_times_s": steps[warmup:], "cpu_times_s": cpu[warmup:], "warmup_step_times_s": steps[:warmup], "phase_s": timer.phases[warmup:],
        "tokens": counts[warmup:], "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "settings": settings,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    result = run(json.loads(Path(a.spec).read_text()))
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    steps = result["step_times_s"]
    print(f"[agent_trl] {len(steps)} steps, median {statistics.median(steps):.3f} s" if steps else "[agent_trl] no timed steps", file=sys.stderr)


if __name__ == "__main__":
    main()
