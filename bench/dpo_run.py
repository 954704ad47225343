"""One DPO training run, timed step by step: `--impl olingo|olingo+precompute|minimal|minimal+precompute`.

    python bench/dpo_run.py --spec SPEC.json --out RESULT.json

Every implementation trains the same causal LM on the same pairs (`workload.write_dpo_pairs`: a
prompt of P tokens, chosen and rejected responses of R tokens each, no padding anywhere), in the same
order: the permutation olingo's `ResumableSampler` draws for epoch 0 (`torch.randperm` with a generator
seeded with `seed`). One optimizer step = ONE policy forward of the 2B chosen+rejected rows, the
summed log-probs of each row's response tokens, the reference's summed log-probs of the same rows,
the sigmoid DPO loss -log sigmoid(beta ((pi_c - ref_c) - (pi_r - ref_r))) averaged over the B pairs,
backward, clipping at `max_grad_norm`, AdamW (no decay on 1-D tensors) and a cosine schedule with a
floor after warmup. The reference is either live (a frozen copy of the initial policy, forward under
no_grad every step) or precomputed (`+precompute`: one pass over all rows before training, timed
apart as `precompute_s`; it is outside every step).
- `olingo`, `olingo+precompute`: `DPOTrainer` as a user builds it (Booster, `PreferenceDataset`,
  `PreferenceCollator`, `plugin.prepare_dataloader(..., shuffle=True, seed=seed)`, metrics.jsonl and
  TensorBoard in a run directory); `+precompute` sets `precompute_ref_log_probs=True` (the timed
  precompute is `DPOTrainer._precompute_reference`: fingerprint, the pass, the cache file).
- `minimal`, `minimal+precompute`: the smallest loop doing the same (`run_minimal`).
A step's time is the wall time between the ends of two consecutive optimizer steps (batch fetch and
logging included); `cpu_times_s` is the process CPU time (user + system, all threads) over the same
interval.
"""

from __future__ import annotations

import math
import tempfile
import time

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from bench.common import Marks, peak_rss_mb, runner_main
from bench.workload import read_jsonl


def total_steps(spec: dict) -> int:
    return spec["warmup_steps"] + spec["steps"]


def load_pairs(spec: dict) -> list[dict]:
    """The first (warmup + steps) x B rows of the file: {prompt_ids, chosen_ids, rejected_ids}."""
    rows = read_jsonl(spec["data"])[: total_steps(spec) * spec["batch_size"]]
    if len(rows) < total_steps(spec) * spec["batch_size"]:
        raise ValueError(f"{spec['data']} has {len(rows)} pairs; {total_steps(spec)} steps x {spec['batch_size']} need more")
    return rows


def training_order(count: int, seed: int) -> list[int]:
    """The order olingo's ResumableSampler(shuffle=True, seed=seed) draws in epoch 0."""
    return torch.randperm(count, generator=torch.Generator().manual_seed(seed)).tolist()


# ---- olingo ---------------------------------------------------------------------------------
def run_olingo(spec: dict, precompute: bool) -> dict:
    from olingo.booster import Booster, SingleProcessPlugin
    from olingo.dataset import PreferenceCollator
    from olingo.dataset.preference_dataset import PreferenceDataset
    from olingo.models import load_causal_lm
    from olingo.recipes.common import OptimizerConfig, optimizer_and_schedule
    from olingo.trainer.callbacks import Callback
    from olingo.trainer.dpo import DPOTrainer

    marks, losses = Marks(), []
    precompute_s: list[float] = []

    class StepClock(Callback):
        def on_step_end(self, state, step_idx, batch, metrics) -> None:
            marks.mark()
            losses.append(metrics["train/loss"])

    P = spec["prompt_length"]
    items = []
    for row in load_pairs(spec):
        if len(row["prompt_ids"]) != P:
            raise ValueError(f"prompt of {len(row['prompt_ids'])} tokens, expected {P}")
        items.append({
            "chosen_input_ids": row["prompt_ids"] + row["chosen_ids"], "chosen_loss_mask": [0] * P + [1] * len(row["chosen_ids"]),
            "rejected_input_ids": row["prompt_ids"] + row["rejected_ids"], "rejected_loss_mask": [0] * P + [1] * len(row["rejected_ids"]),
        })
    actor = load_causal_lm(spec["policy_dir"])
    reference = load_causal_lm(spec["policy_dir"]).eval().requires_grad_(False)  # what the recipe loads
    tokenizer = AutoTokenizer.from_pretrained(spec["policy_dir"])
    plugin = SingleProcessPlugin(max_norm=spec["max_grad_norm"])
    booster = Booster(plugin=plugin)
    cfg = OptimizerConfig(lr=spec["lr"], weight_decay=spec["weight_decay"], adam_betas=tuple(spec["adam_betas"]),
                          warmup_ratio=spec["warmup_ratio"], min_lr_ratio=spec["min_lr_ratio"], max_grad_norm=spec["max_grad_norm"])
    optimizer, scheduler = optimizer_and_schedule(actor, cfg, total_steps(spec))
    actor, optimizer, *_ = booster.boost(actor, optimizer)
    collate = PreferenceCollator(tokenizer.pad_token_id, padding_side="right")  # the recipe's collator
    loader = plugin.prepare_dataloader(PreferenceDataset(items), spec["batch_size"], shuffle=True, seed=spec["seed"], collate_fn=collate)
    trainer = DPOTrainer(actor, reference, booster, optimizer, plugin, scheduler, tokenizer, max_epochs=1, beta=spec["beta"],
                         loss_type="sigmoid", precompute_ref_log_probs=precompute, callbacks=[StepClock()])
    del reference  # the trainer owns it (and frees it after precomputing), as in the recipe

    real_precompute = trainer._precompute_reference

    def timed_precompute(log_dir):
        start = time.perf_counter()
        real_precompute(log_dir)
        precompute_s.append(time.perf_counter() - start)

    trainer._precompute_reference = timed_precompute
    with tempfile.TemporaryDirectory() as run_dir:
        marks.mark()  # fit starts: the first step (excluded from the timed ones) runs from here
        trainer.fit(loader, None, log_dir=run_dir)
    return {"marks": marks, "losses": losses, "precompute_s": precompute_s[0] if precompute_s else None}


# ---- the minimal DPO step ---------------------------------------------------------------------
def response_logps(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int) -> torch.Tensor:
    """Summed log-probs (rows,) of the tokens after the prompt (every row has the same lengths)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, prompt_length - 1 : -1]
    return logits.log_softmax(-1).gather(-1, input_ids[:, prompt_length:, None]).squeeze(-1).sum(-1)


def run_minimal(spec: dict, precompute: bool) -> dict:
    """The smallest loop doing the same work: policy forward of 2B rows, reference log-probs,
    sigmoid DPO loss, backward, clip, step, schedule."""
    from transformers import get_cosine_with_min_lr_schedule_with_warmup

    P, B, beta = spec["prompt_length"], spec["batch_size"], spec["beta"]
    rows = load_pairs(spec)
    chosen = torch.tensor([r["prompt_ids"] + r["chosen_ids"] for r in rows])
    rejected = torch.tensor([r["prompt_ids"] + r["rejected_ids"] for r in rows])
    ones = torch.ones(2 * B, chosen.shape[1], dtype=torch.long)
    policy = AutoModelForCausalLM.from_pretrained(spec["policy_dir"])
    reference = AutoModelForCausalLM.from_pretrained(spec["policy_dir"]).eval().requires_grad_(False)
    params = [p for p in policy.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": spec["weight_decay"]},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=spec["lr"], betas=tuple(spec["adam_betas"]))
    steps = total_steps(spec)
    scheduler = get_cosine_with_min_lr_schedule_with_warmup(optimizer, int(round(spec["warmup_ratio"] * steps)), steps, min_lr_rate=spec["min_lr_ratio"])
    precompute_s = None
    if precompute:  # reference log-probs of every row, once, B pairs a batch; then the reference is freed
        start = time.perf_counter()
        table = torch.empty(len(rows), 2)
        with torch.no_grad():
            for i in range(0, len(rows), B):
                ids = torch.cat([chosen[i : i + B], rejected[i : i + B]])
                table[i : i + B] = torch.stack(response_logps(reference, ids, torch.ones_like(ids), P).chunk(2), dim=1)
        del reference
        precompute_s = time.perf_counter() - start
    order = torch.tensor(training_order(len(rows), spec["seed"]))
    policy.train()
    marks, losses = Marks(), []
    marks.mark()
    for step in range(steps):
        index = order[step * B : (step + 1) * B]
        ids = torch.cat([chosen[index], rejected[index]])
        pi_chosen, pi_rejected = response_logps(policy, ids, ones, P).chunk(2)
        if precompute:
            ref_chosen, ref_rejected = table[index].unbind(1)
        else:
            with torch.no_grad():
                ref_chosen, ref_rejected = response_logps(reference, ids, ones, P).chunk(2)
        loss = -F.logsigmoid(beta * ((pi_chosen - ref_chosen) - (pi_rejected - ref_rejected))).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, spec["max_grad_norm"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        losses.append(loss.detach().item())
        marks.mark()
    return {"marks": marks, "losses": losses, "precompute_s": precompute_s}


def run(impl):
    precompute = impl.endswith("+precompute")
    runner = run_olingo if impl.startswith("olingo") else run_minimal
    return lambda spec: runner(spec, precompute)


def finish(spec: dict, output: dict) -> dict:
    """Step k's time runs from the end of step k-1 to the end of step k; the first `warmup_steps`
    steps are left out (marks[0] is the start, so step 1 is the first interval)."""
    marks, warm = output["marks"], spec["warmup_steps"]
    wall = [b - a for a, b in zip(marks.wall, marks.wall[1:], strict=False)]
    cpu = [b - a for a, b in zip(marks.cpu, marks.cpu[1:], strict=False)]
    if len(wall) != total_steps(spec):
        raise RuntimeError(f"{spec['impl']}: {len(wall)} optimizer steps, expected {total_steps(spec)}")
    losses = output["losses"]
    return {"impl": spec["impl"], "step_times_s": wall[warm:], "cpu_times_s": cpu[warm:], "warmup_step_times_s": wall[:warm],
            "precompute_s": output["precompute_s"], "peak_rss_mb": peak_rss_mb(), "losses": losses,
            "final_loss": losses[-1] if losses else math.nan}


if __name__ == "__main__":
    impls = ("olingo", "olingo+precompute", "minimal", "minimal+precompute")
    runner_main(__doc__, {impl: run(impl) for impl in impls}, finish)
