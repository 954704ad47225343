"""One reward-model training run, timed step by step: `--impl olingo` or `--impl minimal`.

    python bench/rm_run.py --spec SPEC.json --out RESULT.json

Both implementations train the same `LlamaForSequenceClassification` on the same batches of
pairs (no shuffling, chosen and rejected rows concatenated into one forward of 2B rows), with
loss -log sigmoid(r_c - r_r), AdamW (no decay on 1-D tensors), cosine-with-floor schedule
after warmup, and gradient clipping. A step's time is the wall time between the ends of two
consecutive optimizer steps: it includes fetching the batch and everything the loop does
(olingo's metrics rows and TensorBoard included); `cpu_times_s` is the process CPU time (user +
system, all threads) over the same intervals.
"""

from __future__ import annotations

import tempfile

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from bench.common import Marks, peak_rss_mb, runner_main
from bench.workload import read_jsonl


def pair_tensors(path: str) -> list[dict[str, torch.Tensor]]:
    rows = read_jsonl(path)
    out = []
    for row in rows:
        chosen, rejected = torch.tensor(row["chosen_input_ids"]), torch.tensor(row["rejected_input_ids"])
        out.append({"chosen_input_ids": chosen, "chosen_attention_mask": torch.ones_like(chosen),
                    "rejected_input_ids": rejected, "rejected_attention_mask": torch.ones_like(rejected)})
    return out


def collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.stack([row[key] for row in rows]) for key in rows[0]}


def total_steps(spec: dict) -> int:
    return spec["warmup_steps"] + spec["steps"]


def run_olingo(spec: dict) -> tuple[Marks, float]:
    from olingo.booster import Booster, SingleProcessPlugin
    from olingo.models import RewardModel
    from olingo.recipes.common import OptimizerConfig, optimizer_and_schedule
    from olingo.trainer.callbacks import Callback
    from olingo.trainer.rm import RewardModelTrainer

    ends = Marks()
    losses: list[float] = []

    class StepClock(Callback):
        def on_step_end(self, state, step_idx, batch, metrics) -> None:
            ends.mark()
            losses.append(metrics["train/loss"])

    model = RewardModel.from_pretrained(spec["model_dir"])
    tokenizer = AutoTokenizer.from_pretrained(spec["model_dir"])
    plugin = SingleProcessPlugin(max_norm=spec["max_grad_norm"])
    booster = Booster(plugin=plugin)
    cfg = OptimizerConfig(lr=spec["lr"], weight_decay=spec["weight_decay"], adam_betas=tuple(spec["adam_betas"]),
                          warmup_ratio=spec["warmup_ratio"], min_lr_ratio=spec["min_lr_ratio"], max_grad_norm=spec["max_grad_norm"])
    optimizer, scheduler = optimizer_and_schedule(model, cfg, total_steps(spec))
    model, optimizer, *_ = booster.boost(model, optimizer)
    rows = pair_tensors(spec["data"])[: total_steps(spec) * spec["batch_size"]]
    loader = plugin.prepare_dataloader(rows, spec["batch_size"], shuffle=False, collate_fn=collate)
    trainer = RewardModelTrainer(model, booster, optimizer, plugin, scheduler, tokenizer, max_epochs=1, beta=1.0, callbacks=[StepClock()])
    with tempfile.TemporaryDirectory() as run_dir:
        trainer.fit(loader, None, log_dir=run_dir)
    return ends, losses[-1]


def run_minimal(spec: dict) -> tuple[Marks, float]:
    """The smallest loop doing the same work: forward, loss, backward, clip, step, schedule."""
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    model = AutoModelForSequenceClassification.from_pretrained(spec["model_dir"], num_labels=1)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": spec["weight_decay"]},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=spec["lr"], betas=tuple(spec["adam_betas"]))
    steps = total_steps(spec)
    scheduler = get_cosine_with_min_lr_schedule_with_warmup(optimizer, int(round(spec["warmup_ratio"] * steps)), steps, min_lr_rate=spec["min_lr_ratio"])
    rows = pair_tensors(spec["data"])[: steps * spec["batch_size"]]
    loader = DataLoader(rows, batch_size=spec["batch_size"], shuffle=False, collate_fn=collate)
    model.train()
    ends = Marks()
    for batch in loader:
        input_ids = torch.cat([batch["chosen_input_ids"], batch["rejected_input_ids"]])
        mask = torch.cat([batch["chosen_attention_mask"], batch["rejected_attention_mask"]])
        chosen, rejected = model(input_ids=input_ids, attention_mask=mask).logits.squeeze(-1).chunk(2)
        loss = -F.logsigmoid(chosen - rejected).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, spec["max_grad_norm"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        ends.mark()
    return ends, float(loss)


def finish(spec: dict, output: tuple[Marks, float]) -> dict:
    ends, final_loss = output
    wall, cpu = (ends.intervals(series)[spec["warmup_steps"] - 1 :] for series in (ends.wall, ends.cpu))
    return {"impl": spec["impl"], "step_times_s": wall, "cpu_times_s": cpu, "peak_rss_mb": peak_rss_mb(), "final_loss": final_loss}


if __name__ == "__main__":
    runner_main(__doc__, {"olingo": run_olingo, "minimal": run_minimal}, finish)
