"""TRL's RewardTrainer on a pre-tokenized pairwise dataset, timed per optimizer step.

Runs under the ``trl-latest`` venv (``bench/trl/env.py --which rm``)::

    bench/.venvs/trl-latest/bin/python bench/trl/rm_trl.py --spec SPEC.json --out RESULT.json

See ``bench/trl/README.md`` for the spec and result formats.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_DISABLED", "true")

import torch  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer, TrainerCallback  # noqa: E402
from trl import RewardConfig, RewardTrainer  # noqa: E402


class StepTimer(TrainerCallback):
    """Wall time of each optimizer step: on_step_begin -> on_step_end (perf_counter).

    ``periods`` is on_step_end -> next on_step_end: the whole loop iteration, which also holds
    fetching/collating the batch and Trainer's logging between steps; ``cpu_periods`` is the
    process CPU time (user + system, all threads) over the same intervals.
    """

    def __init__(self) -> None:
        self.steps: list[float] = []
        self.periods: list[float] = []
        self.cpu_periods: list[float] = []
        self._t0 = 0.0
        self._last_end: tuple[float, float] | None = None

    def on_step_begin(self, args, state, control, **kwargs):
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        t, cpu = time.perf_counter(), time.process_time()
        self.steps.append(t - self._t0)
        if self._last_end is not None:
            self.periods.append(t - self._last_end[0])
            self.cpu_periods.append(cpu - self._last_end[1])
        self._last_end = (t, cpu)


class LossRecordingRewardTrainer(RewardTrainer):
    """RewardTrainer that keeps each step's (already detached) loss tensor; read after training."""

    def training_step(self, *args, **kwargs):
        loss = super().training_step(*args, **kwargs)
        self.step_losses.append(loss)
        return loss


def load_pairs(path: str) -> Dataset:
    chosen, rejected = [], []
    with open(path) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                chosen.append(row["chosen_input_ids"])
                rejected.append(row["rejected_input_ids"])
    # TRL >= 1.x names pre-tokenized columns chosen_ids / rejected_ids (the *_input_ids names still
    # work but are deprecated); either way _prepare_dataset skips tokenization.
    return Dataset.from_dict({"chosen_ids": chosen, "rejected_ids": rejected})


def run(spec: dict) -> dict:
    """Train TRL's RewardTrainer as the spec says: step times, losses and the settings that ran."""
    mode = spec.get("mode", "defaults")
    if mode not in ("defaults", "fp32"):
        raise ValueError(f"mode must be 'defaults' or 'fp32', got {mode!r}")
    B = int(spec["batch_size"])
    warmup, steps = int(spec["warmup_steps"]), int(spec["steps"])
    total = warmup + steps
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    data = load_pairs(spec["data"])
    need = total * B
    if len(data) < need:
        raise ValueError(f"{spec['data']} has {len(data)} pairs; {total} steps x {B} need {need}")
    data = data.select(range(need))  # exactly one pass of warmup_steps + steps batches

    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    if tokenizer.pad_token_id is None or tokenizer.pad_token_id == tokenizer.eos_token_id:
        warnings.warn("pad token missing or equal to eos; TRL falls back to eos for padding", stacklevel=1)
    args = reward_config(spec, mode, B, total)

    timer = StepTimer()
    trainer = LossRecordingRewardTrainer(
        model=spec["model_dir"],  # TRL loads it as users do (AutoModelForSequenceClassification)
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[timer],
    )
    trainer.step_losses = []
    model = trainer.model
    trainer.train()
    shutil.rmtree(args.output_dir, ignore_errors=True)  # nothing is saved there

    losses = [float(x) for x in trainer.step_losses]
    settings = settings_that_ran(trainer, model, args, mode, total)
    return {
        "impl": f"trl-{mode}",
        "trl_version": trl.__version__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "step_times_s": timer.steps[warmup:],
        "warmup_step_times_s": timer.steps[:warmup],
        # on_step_end -> on_step_end, for timed steps after the first (includes batch fetch + logging)
        "iter_times_s": timer.periods[max(warmup - 1, 0):] if warmup else timer.periods,
        "iter_cpu_times_s": timer.cpu_periods[max(warmup - 1, 0):] if warmup else timer.cpu_periods,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "final_loss": losses[-1] if losses else math.nan,
        "losses": losses,
        "settings": settings,
    }


def reward_config(spec: dict, mode: str, B: int, total: int) -> RewardConfig:
    """The `RewardConfig` the spec describes (bench/trl/README.md says how each field maps);
    `fp32` mode turns mixed precision and activation checkpointing off."""
    kwargs = dict(
        output_dir=tempfile.mkdtemp(prefix="trl-rm-"),
        per_device_train_batch_size=B,
        gradient_accumulation_steps=1,
        num_train_epochs=1,
        max_steps=total,
        learning_rate=float(spec["lr"]),
        weight_decay=float(spec["weight_decay"]),
        adam_beta1=float(spec["adam_betas"][0]),
        adam_beta2=float(spec["adam_betas"][1]),
        max_grad_norm=float(spec["max_grad_norm"]),
        # transformers 5: a float warmup_steps < 1 is a ratio, ceil(ratio * max_steps) steps.
        warmup_steps=float(spec["warmup_ratio"]),
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": float(spec["min_lr_ratio"])},
        seed=int(spec["seed"]),
        data_seed=int(spec["seed"]),
        train_sampling_strategy="sequential",  # rows in file order; no shuffling
        center_rewards_coefficient=None,  # plain -logsigmoid(r_c - r_r).mean()
        eval_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        max_length=None,  # all rows are kept (no length filter)
    )
    if mode == "fp32":
        kwargs.update(bf16=False, fp16=False)
        # transformers 5.23 renamed gradient_checkpointing -> activation_checkpointing (old name aliased)
        ckpt = ("activation_checkpointing" if "activation_checkpointing" in RewardConfig.__dataclass_fields__
                else "gradient_checkpointing")
        kwargs[ckpt] = False
    if spec.get("optim"):  # optional override; default is Trainer's (adamw_torch_fused on torch>=2.8)
        kwargs["optim"] = spec["optim"]
    args = RewardConfig(**kwargs)
    if mode == "fp32":
        args_model = {"dtype": "float32"}
        args.model_init_kwargs = args_model
    return args


def settings_that_ran(trainer: RewardTrainer, model: torch.nn.Module, args: RewardConfig, mode: str, total: int) -> dict:
    """What really ran: precision, checkpointing, optimizer, schedule and data settings, read
    back from the trainer, its optimizer and the model (TRL's defaults included)."""
    gc_on = bool(getattr(model, "is_activation_checkpointing", None)
                 if hasattr(model, "is_activation_checkpointing")
                 else getattr(model, "is_gradient_checkpointing", False))
    opt = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    return {
        "mode": mode,
        "bf16": bool(args.bf16),
        "fp16": bool(args.fp16),
        "autocast": str(getattr(trainer.accelerator, "mixed_precision", None)),
        "model_param_dtype": str(next(model.parameters()).dtype),
        "gradient_checkpointing": bool(args.gradient_checkpointing),
        "activation_checkpointing": getattr(args, "activation_checkpointing", None),
        "gradient_checkpointing_active": gc_on,
        "gradient_checkpointing_kwargs": args.gradient_checkpointing_kwargs,
        "optim": getattr(args.optim, "value", str(args.optim)),
        "optimizer_class": type(opt).__name__,
        "optimizer_fused": opt.defaults.get("fused"),
        "adam_betas": list(opt.defaults.get("betas", ())),
        "weight_decay": opt.defaults.get("weight_decay"),
        "max_grad_norm": args.max_grad_norm,
        "lr_scheduler_type": getattr(args.lr_scheduler_type, "value", str(args.lr_scheduler_type)),
        "lr_scheduler_kwargs": args.lr_scheduler_kwargs,
        "warmup_steps_effective": args.get_warmup_steps(total),
        "max_steps": total,
        "train_sampling_strategy": args.train_sampling_strategy,
        "center_rewards_coefficient": args.center_rewards_coefficient,
        "disable_dropout": args.disable_dropout,
        "max_length": args.max_length,
        "pad_to_multiple_of": args.pad_to_multiple_of,
        "logging_steps": args.logging_steps,
        "dataloader_num_workers": args.dataloader_num_workers,
        "torch_threads": torch.get_num_threads(),
        "padding_free": "not an option of RewardTrainer in this version",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    spec = json.loads(Path(a.spec).read_text())
    result = run(spec)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"[rm_trl] {result['impl']}: {len(result['step_times_s'])} steps, median "
          f"{sorted(result['step_times_s'])[len(result['step_times_s']) // 2] * 1e3:.1f} ms, "
          f"loss {result['losses'][0]:.4f} -> {result['final_loss']:.4f}", file=sys.stderr)


if __name__ == "__main__":
    main()
