"""TRL 1.12's PPOTrainer (``trl.experimental.ppo``), timed per update and per phase.

Runs under the ``trl-1.12`` venv (``bench/trl/env.py --which ppo``)::

    bench/.venvs/trl-1.12/bin/python bench/trl/ppo_trl.py --spec SPEC.json --out RESULT.json

TRL's train loop is run unmodified (its ``gc.collect()`` and ``empty_cache()`` calls included); the
timing is taken from outside: a TrainerCallback, forward hooks on the models, a timing wrapper
around the module-level ``batch_generation`` that PPOTrainer.train calls, an optimizer step
post-hook, and timing wrappers around ``gc.collect`` and TRL's ``empty_cache``. See README.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    TrainerCallback,
)
from trl.experimental.ppo import PPOConfig, PPOTrainer  # noqa: E402
from trl.experimental.ppo import ppo_trainer as ppo_mod  # noqa: E402

PHASES = ("generation", "ref_forward", "value_forward", "reward_forward", "learning",
          "learn_forward", "gc", "empty_cache")


class Timing:
    """Per-update accumulators. ``idx`` is the update in progress (0-based)."""

    def __init__(self) -> None:
        self.idx = 0
        self.acc: dict[str, defaultdict] = {p: defaultdict(float) for p in PHASES}
        self.learn_first: dict[int, float] = {}
        self.learn_last: dict[int, float] = {}
        self.boundaries: list[float] = []  # end of update k at boundaries[k + 1]
        self.cpu_boundaries: list[float] = []  # process CPU time (user + system) at the same points
        self.after_step_end = False
        self.step_end_time = 0.0
        self.step_end_cpu = 0.0
        self.in_generation = False
        self.in_learning_forward = False
        self.gen_lengths: list[int] = []
        self.pad_rows: list[int] = []
        self.eos_rows: list[int] = []
        self.optimizer_steps: defaultdict = defaultdict(int)

    def add(self, phase: str, dt: float) -> None:
        self.acc[phase][self.idx] += dt

    def close_update(self, t: float, cpu: float) -> None:
        self.boundaries.append(t)
        self.cpu_boundaries.append(cpu)
        self.idx += 1
        self.after_step_end = False


T = Timing()


class UpdateTimer(TrainerCallback):
    """PPOTrainer.train fires on_step_end once per update (after its log); the update is closed
    at the end of the gc.collect() that follows it (see ``timed_gc``), or at on_train_end."""

    def on_train_begin(self, args, state, control, **kwargs):
        T.boundaries, T.cpu_boundaries = [time.perf_counter()], [time.process_time()]

    def on_step_end(self, args, state, control, **kwargs):
        T.step_end_time, T.step_end_cpu = time.perf_counter(), time.process_time()
        T.after_step_end = True

    def on_train_end(self, args, state, control, **kwargs):
        if T.after_step_end:
            T.close_update(T.step_end_time, T.step_end_cpu)


_real_gc_collect = gc.collect


def timed_gc(*args, **kwargs):
    t0 = time.perf_counter()
    out = _real_gc_collect(*args, **kwargs)
    t1 = time.perf_counter()
    T.add("gc", t1 - t0)
    if T.after_step_end:  # the gc.collect() right after on_step_end ends the update
        T.close_update(t1, time.process_time())
    return out


_real_empty_cache = ppo_mod.empty_cache


def timed_empty_cache():
    t0 = time.perf_counter()
    _real_empty_cache()
    T.add("empty_cache", time.perf_counter() - t0)


_real_batch_generation = ppo_mod.batch_generation


def make_timed_batch_generation(pad_id: int, eos_id: int | None):
    def timed_batch_generation(model, queries, *args, **kwargs):
        T.in_generation = True
        t0 = time.perf_counter()
        try:
            query_responses, logitss = _real_batch_generation(model, queries, *args, **kwargs)
        finally:
            T.in_generation = False
        T.add("generation", time.perf_counter() - t0)
        resp = query_responses[:, queries.shape[1]:]
        T.gen_lengths.append(int(resp.shape[1]))
        T.pad_rows.append(int((resp == pad_id).any(dim=1).sum()))
        T.eos_rows.append(int((resp == eos_id).any(dim=1).sum()) if eos_id is not None else 0)
        return query_responses, logitss

    return timed_batch_generation


def hook_phase(module: torch.nn.Module, phase: str, skip_in_learning: bool = False) -> None:
    state = {}

    def pre(mod, args, kwargs=None):
        if T.in_generation or (skip_in_learning and T.in_learning_forward):
            state["t0"] = None
        else:
            state["t0"] = time.perf_counter()

    def post(mod, args, out):
        if state.get("t0") is not None:
            T.add(phase, time.perf_counter() - state["t0"])
            state["t0"] = None

    module.register_forward_pre_hook(pre)
    module.register_forward_hook(post)


def hook_learning(wrapper: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    state = {}

    def pre(mod, args, kwargs=None):
        T.in_learning_forward = True
        t = time.perf_counter()
        state["t0"] = t
        T.learn_first.setdefault(T.idx, t)

    def post(mod, args, out):
        T.in_learning_forward = False
        T.add("learn_forward", time.perf_counter() - state["t0"])

    def step_post(opt, args, kwargs):
        T.learn_last[T.idx] = time.perf_counter()
        T.optimizer_steps[T.idx] += 1

    wrapper.register_forward_pre_hook(pre)
    wrapper.register_forward_hook(post)
    optimizer.register_step_post_hook(step_post)


def load_prompts(path: str) -> Dataset:
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line)["input_ids"])
    if len({len(r) for r in rows}) != 1:
        raise ValueError(f"{path}: prompts must all have the same length")
    return Dataset.from_dict({"input_ids": rows})


def run(spec: dict) -> dict:
    """Train TRL's PPOTrainer as the spec says: update and phase times and the settings that ran."""
    mode = spec.get("mode", "fp32")
    if mode not in ("defaults", "fp32"):
        raise ValueError(f"mode must be 'defaults' or 'fp32', got {mode!r}")
    B, mb = int(spec["batch_size"]), int(spec["mini_batch_size"])
    if B % mb:
        raise ValueError(f"batch_size {B} is not a multiple of mini_batch_size {mb}")
    warmup, updates = int(spec["warmup_updates"]), int(spec["updates"])
    total = warmup + updates
    seed = int(spec["seed"])
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))

    tokenizer = AutoTokenizer.from_pretrained(spec["policy_dir"])
    prompts = load_checked_prompts(spec, tokenizer, B, total)
    torch.manual_seed(seed)
    policy, ref_policy, value_model, reward_model = load_models(spec)
    args = ppo_config(spec, mode, B, mb, total, seed)

    trainer = PPOTrainer(
        args=args,
        processing_class=tokenizer,
        model=policy,
        ref_model=ref_policy,
        reward_model=reward_model,
        value_model=value_model,
        train_dataset=prompts.select(range(min(len(prompts), B * total))),
        callbacks=[UpdateTimer()],
    )
    inner_opt = hook_phases(trainer)
    train_timed(trainer, tokenizer, args.output_dir)

    n = len(T.boundaries) - 1
    update_times, cpu_times, phase = times_per_update(n)
    settings = settings_that_ran(trainer, policy, args, inner_opt, mode, n, warmup)
    if any(length != args.response_length for length in T.gen_lengths):
        raise RuntimeError(f"generation did not produce {args.response_length} tokens: {T.gen_lengths}")
    return {
        "impl": "trl-ppo" if mode == "fp32" else "trl-ppo-defaults",
        "trl_version": trl.__version__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "update_times_s": update_times[warmup:],
        "cpu_times_s": cpu_times[warmup:],
        "warmup_update_times_s": update_times[:warmup],
        "phase_s": {p: v[warmup:] for p, v in phase.items()},
        "gc_s": phase["gc"][warmup:],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "settings": settings,
    }


def load_checked_prompts(spec: dict, tokenizer, B: int, total: int) -> Dataset:
    """The spec's prompts, refused when there are fewer than one batch (TRL would loop forever)
    or the tokenizer has no pad token; a pad id inside a prompt is warned about."""
    if tokenizer.pad_token_id is None:
        raise ValueError("the policy tokenizer needs a pad token (distinct from eos)")
    prompts = load_prompts(spec["prompts"])
    if len(prompts) < B:  # TRL's dataloader drops the last partial batch and would loop forever
        raise ValueError(f"{spec['prompts']} has {len(prompts)} prompts; batch_size is {B}")
    if any(tokenizer.pad_token_id in r for r in prompts["input_ids"][: B * total]):
        print("[ppo_trl] warning: prompts contain the pad id; TRL masks those positions", file=sys.stderr)
    return prompts


def load_models(spec: dict) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module, torch.nn.Module]:
    """(policy, reference, value model, reward model) in fp32, loaded as TRL's ppo.py example does;
    the policy generates exactly `response_length` tokens."""
    f32 = {"dtype": torch.float32}
    policy = AutoModelForCausalLM.from_pretrained(spec["policy_dir"], **f32)
    ref_policy = AutoModelForCausalLM.from_pretrained(spec["policy_dir"], **f32)  # as TRL's ppo.py example
    value_model = AutoModelForSequenceClassification.from_pretrained(spec["value_dir"], num_labels=1, **f32)
    reward_model = AutoModelForSequenceClassification.from_pretrained(spec["reward_dir"], num_labels=1, **f32)
    # Fixed-length generation: TRL sets policy.generation_config.eos_token_id = stop_token_id (None
    # here) so generate() has no eos stopping criterion; min_new_tokens pins it again from below.
    policy.generation_config.min_new_tokens = int(spec["response_length"])
    return policy, ref_policy, value_model, reward_model


def ppo_config(spec: dict, mode: str, B: int, mb: int, total: int, seed: int) -> PPOConfig:
    """The `PPOConfig` the spec describes: B rollouts per update in B / mb minibatches, fixed-length
    responses (bench/trl/README.md says how each field maps)."""
    kwargs = dict(
        output_dir=tempfile.mkdtemp(prefix="trl-ppo-"),
        per_device_train_batch_size=B,  # local_batch_size = B x grad_accum(1) = rollouts per update
        gradient_accumulation_steps=1,
        num_mini_batches=B // mb,  # -> mini_batch_size rows per optimizer step
        num_ppo_epochs=int(spec["ppo_epochs"]),
        total_episodes=B * total,  # -> num_total_batches = warmup_updates + updates
        local_rollout_forward_batch_size=int(spec.get("rollout_forward_batch_size") or B),
        response_length=int(spec["response_length"]),
        temperature=float(spec["temperature"]),
        kl_coef=float(spec["kl_coef"]),
        cliprange=float(spec["cliprange"]),
        vf_coef=float(spec["vf_coef"]),
        cliprange_value=float(spec["cliprange_value"]),
        gamma=float(spec["gamma"]),
        lam=float(spec["lam"]),
        learning_rate=float(spec["lr"]),
        stop_token=None,
        stop_token_id=None,
        missing_eos_penalty=None,
        num_sample_generations=0,  # no eval sampling inside the loop
        seed=seed,
        eval_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
    )
    for key in ("weight_decay", "optim", "lr_scheduler_type", "kl_estimator", "whiten_rewards"):
        if spec.get(key) is not None:
            kwargs[key] = spec[key]
    if spec.get("adam_betas"):
        kwargs["adam_beta1"], kwargs["adam_beta2"] = map(float, spec["adam_betas"])
    if mode == "fp32":
        kwargs.update(bf16=False, fp16=False)
        ckpt = ("activation_checkpointing" if "activation_checkpointing" in PPOConfig.__dataclass_fields__
                else "gradient_checkpointing")
        kwargs[ckpt] = False
    return PPOConfig(**kwargs)


def hook_phases(trainer: PPOTrainer) -> torch.optim.Optimizer:
    """Time the reference, reward and value forwards and the learning phase of `trainer`; returns
    the optimizer inside the trainer's wrapper."""
    wrapper = trainer.accelerator.unwrap_model(trainer.model)
    inner_opt = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    hook_phase(trainer.ref_model, "ref_forward")
    rm = trainer.reward_model
    hook_phase(getattr(rm, rm.base_model_prefix), "reward_forward")  # what TRL's get_reward() calls
    # get_reward() calls the value backbone directly in the rollout; in learning the
    # PolicyAndValueWrapper calls it too, which is skipped here and counted as learning.
    hook_phase(wrapper.critic_backbone, "value_forward", skip_in_learning=True)
    hook_learning(wrapper, inner_opt)
    return inner_opt


def train_timed(trainer: PPOTrainer, tokenizer, output_dir: str) -> None:
    """`trainer.train()` with TRL's generation, empty_cache and gc.collect timed (patched for the
    run only); `output_dir` is removed afterwards (nothing is saved there)."""
    ppo_mod.batch_generation = make_timed_batch_generation(tokenizer.pad_token_id, tokenizer.eos_token_id)
    ppo_mod.empty_cache = timed_empty_cache
    gc.collect = timed_gc
    try:
        trainer.train()
    finally:
        gc.collect = _real_gc_collect
        ppo_mod.batch_generation = _real_batch_generation
        ppo_mod.empty_cache = _real_empty_cache
        shutil.rmtree(output_dir, ignore_errors=True)  # nothing is saved there


def times_per_update(n: int) -> tuple[list[float], list[float], dict[str, list[float]]]:
    """(wall, CPU, per-phase seconds) of each of the `n` updates, from the global `Timing`."""
    update_times = [T.boundaries[k + 1] - T.boundaries[k] for k in range(n)]
    cpu_times = [T.cpu_boundaries[k + 1] - T.cpu_boundaries[k] for k in range(n)]
    phase = {p: [T.acc[p][k] for k in range(n)] for p in PHASES}
    phase["learning"] = [T.learn_last.get(k, 0.0) - T.learn_first.get(k, 0.0) for k in range(n)]
    phase["policy_forward"] = [0.0] * n  # TRL reuses the generation scores for the rollout log-probs
    outside = ("generation", "ref_forward", "value_forward", "reward_forward", "learning", "gc")
    phase["other"] = [update_times[k] - sum(phase[p][k] for p in outside) for k in range(n)]
    return update_times, cpu_times, phase


def settings_that_ran(trainer: PPOTrainer, policy: torch.nn.Module, args: PPOConfig, inner_opt: torch.optim.Optimizer,
                      mode: str, n: int, warmup: int) -> dict:
    """What really ran: precision, batch arithmetic, generation, optimizer and schedule settings,
    read back from the trainer, its optimizer and the policy (TRL's defaults included)."""
    mp = str(trainer.accelerator.mixed_precision)
    return {
        "mode": mode,
        "config_bf16": bool(args.bf16),
        "config_gradient_checkpointing": bool(args.gradient_checkpointing),
        "autocast": mp,  # PPOTrainer builds its own Accelerator(); config.bf16 does not reach it
        "gradient_checkpointing_active": bool(getattr(policy, "is_activation_checkpointing", None)
                                              if hasattr(policy, "is_activation_checkpointing")
                                              else getattr(policy, "is_gradient_checkpointing", False)),
        "param_dtype": str(next(policy.parameters()).dtype),
        "batch_size": args.batch_size,
        "local_batch_size": args.local_batch_size,
        "mini_batch_size": args.mini_batch_size,
        "num_mini_batches": args.num_mini_batches,
        "per_device_train_batch_size": args.per_device_train_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "num_ppo_epochs": args.num_ppo_epochs,
        "optimizer_steps_per_update": [T.optimizer_steps[k] for k in range(n)][warmup:],
        "local_rollout_forward_batch_size": args.local_rollout_forward_batch_size,
        "num_total_batches": args.num_total_batches,
        "response_length": args.response_length,
        "generated_lengths": T.gen_lengths,
        "rows_with_pad_in_response": T.pad_rows,
        "rows_with_eos_in_response": T.eos_rows,
        "stop_token_id": trainer.stop_token_id,
        "policy_generation_eos_token_id": policy.generation_config.eos_token_id,
        "min_new_tokens": policy.generation_config.min_new_tokens,
        "temperature": args.temperature,
        "kl_estimator": args.kl_estimator,
        "whiten_rewards": args.whiten_rewards,
        "optim": getattr(args.optim, "value", str(args.optim)),
        "optimizer_class": type(inner_opt).__name__,
        "optimizer_fused": inner_opt.defaults.get("fused"),
        "lr_scheduler_type": getattr(args.lr_scheduler_type, "value", str(args.lr_scheduler_type)),
        "weight_decay": args.weight_decay,
        "adam_betas": [args.adam_beta1, args.adam_beta2],
        "grad_clipping": "none (PPOTrainer 1.12 never clips; max_grad_norm is unused)",
        "dataloader": "shuffle=True, seeded with args.seed",
        "torch_threads": torch.get_num_threads(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    spec = json.loads(Path(a.spec).read_text())
    result = run(spec)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    ut = result["update_times_s"]
    print(f"[ppo_trl] {result['impl']}: {len(ut)} updates, "
          f"median {sorted(ut)[len(ut) // 2]:.3f} s" if ut else "[ppo_trl] no timed updates",
          file=sys.stderr)


if __name__ == "__main__":
    main()
