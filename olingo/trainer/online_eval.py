"""Held-out evaluation of a policy: sample responses to eval prompts, score them, compare to the
reference model. Used in-loop by `OnlineTrainer` (PPO, the GRPO family), by Ray makers and for the demo's before/after table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader

from olingo.experience_maker import GenerationSettings, PPOExperienceMaker
from olingo.rewards.functions import RewardFunction, reward_function
from olingo.rl.kl import kl_estimate


@torch.no_grad()
def evaluate_policy(
    maker: PPOExperienceMaker | Any,
    loader: DataLoader,
    generation: GenerationSettings,
    *,
    accuracy_fn: RewardFunction | Callable[..., Any] | str | None = None,
    seed: int = 0,
    all_reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Metrics over every prompt of `loader` and the per-prompt samples.

    `maker`: anything with `rollout_and_score` (the PPO or the group experience maker).
    Metrics: reward (mean raw score) and reward_std, kl (mean over responses of the summed
    per-token log-ratio to the reference model: the sequence KL estimate; absent when the maker
    has no reference model), teacher_kl (the same estimate against a distillation teacher, only
    with one: `model.teacher`, docs/algorithms.md), response_length,
    truncated (share cut off without a stop) and, when `accuracy_fn` is given and prompts carry
    a gt_answer, accuracy (share of those rows where it is > 0). `accuracy_fn` is a reward
    function (a callable, a registered name or an import path) and is called as training calls
    reward functions: single-row or batched, with the row fields it names (see
    `olingo.rewards`). Sampling runs under its own seed
    inside `fork_rng`, so every evaluation draws the same noise (before/after comparisons are
    paired) and the training RNG stream is left exactly as it was.
    """
    accuracy = reward_function(accuracy_fn) if accuracy_fn is not None else None
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    totals = torch.zeros(7, dtype=torch.float64)  # n, reward, reward^2, kl, length, truncated, teacher kl
    correct = torch.zeros(2, dtype=torch.float64)  # correct, scored
    samples: list[dict[str, Any]] = []
    has_kl = has_teacher = True
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for batch in loader:
            scored = maker.rollout_and_score(
                batch["input_ids"], batch["attention_mask"], batch.get("gt_answer"), generation, batch.get("row_fields"), messages=batch.get("messages"),
            )
            mask = scored.rollout.action_mask
            has_kl = scored.ref_log_probs is not None  # a run without a reference model has no KL to report
            kl = kl_estimate(scored.log_probs, scored.ref_log_probs, "k1", mask).sum(-1) if has_kl else torch.zeros(len(mask))
            has_teacher = getattr(scored, "teacher_log_probs", None) is not None  # only a distillation run has a teacher
            teacher_kl = kl_estimate(scored.log_probs, scored.teacher_log_probs, "k1", mask).sum(-1) if has_teacher else torch.zeros(len(mask))
            reward = scored.raw_score.double().cpu()
            totals += torch.tensor(
                [len(reward), reward.sum(), (reward**2).sum(), kl.sum(), mask.sum(), scored.rollout.truncated.sum(), teacher_kl.sum()], dtype=torch.float64,
            )
            rows = scored.samples()
            if accuracy is not None:
                correct += mark_correct(accuracy, rows, batch.get("row_fields"))
            samples.extend(rows)
    if all_reduce_sum is not None:
        totals, correct = all_reduce_sum(totals), all_reduce_sum(correct)
    n, reward_sum, reward_sq, kl_sum, length_sum, truncated, teacher_kl_sum = totals.tolist()
    mean = reward_sum / n
    metrics = {
        "reward": mean,
        "reward_std": max(reward_sq / n - mean**2, 0.0) ** 0.5,
        "kl": kl_sum / n,
        "response_length": length_sum / n,
        "truncated": truncated / n,
    }
    if not has_kl:
        del metrics["kl"]
    if has_teacher:
        metrics["teacher_kl"] = teacher_kl_sum / n
    if correct[1] > 0:
        metrics["accuracy"] = float(correct[0] / correct[1])
    return metrics, samples


def mark_correct(accuracy: RewardFunction, rows: list[dict[str, Any]], row_fields: dict[str, list[Any]] | None) -> torch.Tensor:
    """Set `correct` (value > 0) on the `rows` (one evaluation batch's samples) that have a
    gt_answer, scoring them in one `accuracy.values` call, the call training makes: batched
    functions get the whole batch, and each row its own row fields (a prompt answered n times
    repeats its fields n times, as the group maker does). Returns [correct, scored] (float64)."""
    fields = row_fields or {}
    per_prompt = len(rows) // len(next(iter(fields.values()))) if fields else 1
    scored = [i for i, row in enumerate(rows) if row["gt_answer"] is not None]
    if not scored:
        return torch.zeros(2, dtype=torch.float64)
    values = accuracy.values(
        [rows[i]["prompt"] for i in scored], [rows[i]["response"] for i in scored], [rows[i]["gt_answer"] for i in scored],
        {name: [column[i // per_prompt] for i in scored] for name, column in fields.items()},
    )
    for i, value in zip(scored, values.tolist(), strict=True):
        rows[i]["correct"] = value > 0
    return torch.tensor([float((values > 0).sum()), float(len(scored))], dtype=torch.float64)
