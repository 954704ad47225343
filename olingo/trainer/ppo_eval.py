"""Held-out evaluation of a policy: sample responses to eval prompts, score them, compare to the
reference model. Used in-loop by `PPOTrainer` and for the demo's before/after table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader

from olingo.experience_maker import GenerationSettings, NaiveExperienceMaker
from olingo.models.functional import kl_estimate
from olingo.models.rlvr import RewardFn


@torch.no_grad()
def evaluate_policy(
    maker: NaiveExperienceMaker | Any,
    loader: DataLoader,
    generation: GenerationSettings,
    *,
    accuracy_fn: RewardFn | None = None,
    seed: int = 0,
    all_reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Metrics over every prompt of `loader` and the per-prompt samples.

    `maker`: anything with `rollout_and_score` (the PPO or the group experience maker).
    Metrics: reward (mean raw score) and reward_std, kl (mean over responses of the summed
    per-token log-ratio to the reference model: the sequence KL estimate; absent when the maker
    has no reference model), response_length,
    truncated (share cut off without a stop) and, when `accuracy_fn` is given and prompts carry
    a gt_answer, accuracy (share with accuracy_fn(...) > 0). Sampling runs under its own seed
    inside `fork_rng`, so every evaluation draws the same noise (before/after comparisons are
    paired) and the training RNG stream is left exactly as it was.
    """
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    totals = torch.zeros(6, dtype=torch.float64)  # n, reward, reward^2, kl, length, truncated
    correct = torch.zeros(2, dtype=torch.float64)  # correct, scored
    samples: list[dict[str, Any]] = []
    has_kl = True
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        for batch in loader:
            scored = maker.rollout_and_score(batch["input_ids"], batch["attention_mask"], batch.get("gt_answer"), generation, batch.get("row_fields"))
            mask = scored.rollout.action_mask
            has_kl = scored.ref_log_probs is not None  # a run without a reference model has no KL to report
            kl = kl_estimate(scored.log_probs, scored.ref_log_probs, "k1", mask).sum(-1) if has_kl else torch.zeros(len(mask))
            reward = scored.raw_score.double().cpu()
            totals += torch.tensor([len(reward), reward.sum(), (reward**2).sum(), kl.sum(), mask.sum(), scored.rollout.truncated.sum()], dtype=torch.float64)
            rows = scored.samples()
            if accuracy_fn is not None:
                for row in rows:
                    if row["gt_answer"] is not None:
                        row["correct"] = accuracy_fn(row["prompt"], row["response"], row["gt_answer"]) > 0
                        correct += torch.tensor([float(row["correct"]), 1.0], dtype=torch.float64)
            samples.extend(rows)
    if all_reduce_sum is not None:
        totals, correct = all_reduce_sum(totals), all_reduce_sum(correct)
    n, reward_sum, reward_sq, kl_sum, length_sum, truncated = totals.tolist()
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
    if correct[1] > 0:
        metrics["accuracy"] = float(correct[0] / correct[1])
    return metrics, samples
