"""TRL's DPOTrainer (latest, 1.16) on the benchmark's DPO pairs, timed per optimizer step.

Runs under the ``trl-latest`` venv (``bench/trl/env.py --which dpo``)::

    bench/.venvs/trl-latest/bin/python bench/trl/dpo_trl.py --spec SPEC.json --out RESULT.json

The same DPO step as ``bench/dpo_run.py`` (see its docstring): one forward of the 2B chosen+rejected
rows, summed log-probs of the response tokens, the reference's of the same rows (live, or
precomputed before training with ``precompute_ref_log_probs=True``), the sigmoid loss with beta,
AdamW, clipping, cosine schedule. TRL 1.16's DPOTrainer takes text only (its ``_prepare_dataset``
always tokenizes ``prompt``/``chosen``/``rejected`` and appends eos to responses that do not end
with it), so the file's token ids are decoded with the char tokenizer, whose ``decode(encode(s)) ==
s``; the responses already end with eos, so TRL appends nothing; the script checks that TRL's
tokenized ``prompt_ids``/``chosen_ids``/``rejected_ids`` are exactly the file's ids. Rows are handed
over in the order olingo's sampler draws them (``torch.randperm`` seeded with ``seed``) and read
sequentially, so every implementation trains on the same batches. Nothing here imports olingo.
See README.md.
"""

from __future__ import annotations

import argparse
import json
import math
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

import torch  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
import trl.trainer.dpo_trainer as dpo_module  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer, TrainerCallback  # noqa: E402
from trl import DPOConfig, DPOTrainer  # noqa: E402


class StepClock(TrainerCallback):
    """End of every optimizer step (on_step_end): wall clock and process CPU time. A step runs from
    one on_step_end to the next: the batch fetch and the previous step's log are inside it."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def mark(self) -> None:
        self.wall.append(time.perf_counter())
        self.cpu.append(time.process_time())

    def on_train_begin(self, args, state, control, **kwargs):
        self.mark()

    def on_step_end(self, args, state, control, **kwargs):
        self.mark()


class TimedDPOTrainer(DPOTrainer):
    """DPOTrainer that keeps each step's (detached) loss and times its reference precompute pass
    (`_precompute_ref_logps`, called from __init__); nothing else changes."""

    precompute_s = 0.0

    def _precompute_ref_logps(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return super()._precompute_ref_logps(*args, **kwargs)
        finally:
            TimedDPOTrainer.precompute_s += time.perf_counter() - start

    def training_step(self, *args, **kwargs):
        loss = super().training_step(*args, **kwargs)
        self.step_losses.append(loss)
        return loss


def timed_hash_module(real):
    """TRL hashes the reference weights for its precompute cache in __init__, before the pass:
    counted in precompute_s like olingo's fingerprint."""

    def hash_module(module):
        start = time.perf_counter()
        try:
            return real(module)
        finally:
            TimedDPOTrainer.precompute_s += time.perf_counter() - start

    return hash_module


def load_pairs(path: str, tokenizer, count: int, seed: int) -> tuple[Dataset, list[dict]]:
    """The first `count` rows as text, in olingo's epoch-0 order; and the rows' ids in that order."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()][:count]
    if len(rows) < count:
        raise ValueError(f"{path} has {len(rows)} pairs, {count} needed")
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed)).tolist()  # = ResumableSampler's
    rows = [rows[i] for i in order]
    def text(ids):
        return tokenizer.decode(ids, skip_special_tokens=False)
    data = Dataset.from_dict({"prompt": [text(r["prompt_ids"]) for r in rows], "chosen": [text(r["chosen_ids"]) for r in rows],
                              "rejected": [text(r["rejected_ids"]) for r in rows]})
    return data, rows


def check_tokens(dataset: Dataset, rows: list[dict]) -> None:
    """TRL's tokenized columns must be exactly the file's ids (no eos added, nothing merged or cut)."""
    for name in ("prompt_ids", "chosen_ids", "rejected_ids"):
        got = dataset[name]
        for i, (mine, theirs) in enumerate(zip(got, rows, strict=True)):
            if list(mine) != theirs[name]:
                raise RuntimeError(f"row {i}: TRL's {name} {list(mine)[:12]}... differ from the file's {theirs[name][:12]}...")


def run(spec: dict) -> dict:
    """Train TRL's DPOTrainer as the spec says: step times, losses and the settings that ran."""
    mode = spec.get("mode", "fp32")
    if mode not in ("fp32", "fp32+precompute"):
        raise ValueError(f"mode must be 'fp32' or 'fp32+precompute', got {mode!r}")
    precompute = mode.endswith("+precompute")
    B = int(spec["batch_size"])
    warmup, steps = int(spec["warmup_steps"]), int(spec["steps"])
    total = warmup + steps
    seed = int(spec["seed"])
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    tokenizer = AutoTokenizer.from_pretrained(spec["policy_dir"])
    data, rows = load_pairs(spec["data"], tokenizer, total * B, seed)
    args = dpo_config(spec, B, total, seed, precompute)

    dpo_module.hash_module = timed_hash_module(dpo_module.hash_module)
    clock = StepClock()
    trainer = TimedDPOTrainer(
        model=spec["policy_dir"],  # loaded as users do (AutoModelForCausalLM, model_init_kwargs); the reference is its copy
        args=args,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[clock],
    )
    trainer.step_losses = []
    check_tokens(trainer.train_dataset, rows)
    model = trainer.model
    try:
        trainer.train()
    finally:
        shutil.rmtree(args.output_dir, ignore_errors=True)  # nothing is saved there

    wall = [b - a for a, b in zip(clock.wall, clock.wall[1:], strict=False)]
    cpu = [b - a for a, b in zip(clock.cpu, clock.cpu[1:], strict=False)]
    if len(wall) != total:
        raise RuntimeError(f"{len(wall)} optimizer steps, expected {total}")
    losses = [float(x) for x in trainer.step_losses]
    settings = settings_that_ran(trainer, model, args, mode, total)
    return {
        "impl": f"trl-{mode}",
        "trl_version": trl.__version__, "transformers_version": transformers.__version__, "torch_version": torch.__version__,
        "step_times_s": wall[warmup:], "cpu_times_s": cpu[warmup:], "warmup_step_times_s": wall[:warmup],
        "precompute_s": TimedDPOTrainer.precompute_s if precompute else None,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "losses": losses, "final_loss": losses[-1] if losses else math.nan, "settings": settings,
    }


def dpo_config(spec: dict, B: int, total: int, seed: int, precompute: bool) -> DPOConfig:
    """The `DPOConfig` the spec describes, in fp32 without activation checkpointing
    (bench/trl/README.md says how each field maps)."""
    kwargs = dict(
        output_dir=tempfile.mkdtemp(prefix="trl-dpo-"),
        per_device_train_batch_size=B,
        gradient_accumulation_steps=1,
        num_train_epochs=1,
        max_steps=total,
        learning_rate=float(spec["lr"]),
        weight_decay=float(spec["weight_decay"]),
        adam_beta1=float(spec["adam_betas"][0]),
        adam_beta2=float(spec["adam_betas"][1]),
        max_grad_norm=float(spec["max_grad_norm"]),
        # olingo's and the minimal loop's warm-up, round(ratio * steps) optimizer steps, given as an int (a float < 1
        # would be a ratio, and transformers rounds it up: 1 step instead of 0 at 0.025 x 8 steps)
        warmup_steps=int(round(float(spec["warmup_ratio"]) * total)),
        lr_scheduler_type="cosine_with_min_lr",
        lr_scheduler_kwargs={"min_lr_rate": float(spec["min_lr_ratio"])},
        seed=seed,
        data_seed=seed,
        train_sampling_strategy="sequential",  # rows already in olingo's shuffled order
        beta=float(spec["beta"]),
        loss_type=["sigmoid"],
        max_length=None,  # no truncation, no row dropped
        precompute_ref_log_probs=precompute,
        model_init_kwargs={"dtype": "float32"},
        bf16=False,
        fp16=False,
        eval_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
    )
    # transformers 5.23 renamed gradient_checkpointing -> activation_checkpointing (old name aliased)
    kwargs["activation_checkpointing" if "activation_checkpointing" in DPOConfig.__dataclass_fields__ else "gradient_checkpointing"] = False
    if spec.get("optim"):  # optional override; default is Trainer's (adamw_torch_fused on torch >= 2.8)
        kwargs["optim"] = spec["optim"]
    return DPOConfig(**kwargs)


def settings_that_ran(trainer: DPOTrainer, model: torch.nn.Module, args: DPOConfig, mode: str, total: int) -> dict:
    """What really ran: precision, reference handling, loss, optimizer, schedule and data settings,
    read back from the trainer, its optimizer and the model (TRL's defaults included)."""
    optimizer = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    return {
        "mode": mode, "bf16": bool(args.bf16), "fp16": bool(args.fp16),
        "autocast": str(getattr(trainer.accelerator, "mixed_precision", None)),
        "param_dtype": str(next(model.parameters()).dtype),
        "gradient_checkpointing": bool(args.gradient_checkpointing),
        "gradient_checkpointing_active": bool(getattr(model, "is_gradient_checkpointing", False)),
        "precompute_ref_log_probs": args.precompute_ref_log_probs,
        "precompute_ref_batch_size": args.precompute_ref_batch_size or args.per_device_train_batch_size,
        "ref_model_loaded": trainer.ref_model is not None,
        "loss_type": args.loss_type, "beta": args.beta, "label_smoothing": args.label_smoothing, "ld_alpha": args.ld_alpha,
        "f_divergence_type": args.f_divergence_type, "use_weighting": args.use_weighting,
        "max_length": args.max_length, "truncation_mode": args.truncation_mode, "pad_to_multiple_of": args.pad_to_multiple_of,
        "padding_free": args.padding_free, "disable_dropout": args.disable_dropout,
        "optim": getattr(args.optim, "value", str(args.optim)), "optimizer_class": type(optimizer).__name__,
        "optimizer_fused": optimizer.defaults.get("fused"), "adam_betas": list(optimizer.defaults.get("betas", ())),
        "weight_decay": sorted({g["weight_decay"] for g in optimizer.param_groups}), "max_grad_norm": args.max_grad_norm,
        "lr_scheduler_type": getattr(args.lr_scheduler_type, "value", str(args.lr_scheduler_type)),
        "lr_scheduler_kwargs": args.lr_scheduler_kwargs, "warmup_steps_effective": args.get_warmup_steps(total),
        "train_sampling_strategy": args.train_sampling_strategy, "logging_steps": args.logging_steps,
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
    print(f"[dpo_trl] {result['impl']}: {len(steps)} steps, median {1e3 * statistics.median(steps):.1f} ms, "
          f"loss {result['losses'][0]:.4f} -> {result['final_loss']:.4f}", file=sys.stderr)


if __name__ == "__main__":
    main()
