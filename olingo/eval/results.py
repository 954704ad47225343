"""From samples to numbers: each metric per prompt, its mean over prompts with a bootstrap
interval, and each model's paired difference to the first model with a verdict (docs/eval.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from olingo.eval.metrics import Interval, bootstrap_interval, maj_at_k, paired_bootstrap, pass_at_k, verdict

# +1: higher is better; -1: lower is better; 0: neither (the verdict says higher or lower).
FIXED_DIRECTIONS = {"reward": 1, "accuracy": 1, "response_length": 0, "truncated": -1, "turns": 0, "tool_calls": 0}


def direction(metric: str) -> int:
    """The direction of `metric` (pass@k and maj@k: higher is better)."""
    return FIXED_DIRECTIONS.get(metric, 1)


def per_prompt(rows: Sequence[dict[str, Any]], prompts: int, samples: int, ks: Sequence[int], *, maj_subsets: int = 1000) -> dict[str, np.ndarray]:
    """{metric: (prompts,) values}: each prompt's mean over its samples (reward, accuracy,
    length, truncation, turns, tool calls), its pass@k and its maj@k; NaN where a metric does not
    apply (accuracy of a prompt without a gt_answer). `rows`: one model's samples."""
    by_prompt: list[list[dict[str, Any]]] = [[] for _ in range(prompts)]
    for row in rows:
        by_prompt[row["prompt_index"]].append(row)
    for i, group in enumerate(by_prompt):
        if len(group) != samples:
            raise ValueError(f"prompt {i} has {len(group)} samples, expected {samples}")
        group.sort(key=lambda r: r["sample_index"])
    fields = ["reward", "response_length", "truncated"] + [f for f in ("turns", "tool_calls") if f in rows[0]]
    values = {f: np.array([np.mean([float(r[f]) for r in g]) for g in by_prompt]) for f in fields}
    correct = [[r["correct"] for r in g] for g in by_prompt]
    scored = [all(c is not None for c in flags) for flags in correct]
    values["accuracy"] = np.array([np.mean(flags) if ok else math.nan for flags, ok in zip(correct, scored, strict=True)])
    for k in ks:
        values[f"pass@{k}"] = np.array([pass_at_k(samples, sum(flags), k) if ok else math.nan for flags, ok in zip(correct, scored, strict=True)])
    for k in ks:
        values[f"maj@{k}"] = np.array([
            maj_at_k([r["answer"] for r in g], flags, k, max_subsets=maj_subsets, seed=i) if ok else math.nan
            for i, (g, flags, ok) in enumerate(zip(by_prompt, correct, scored, strict=True))
        ])
    order = ["reward", "accuracy", *(f"pass@{k}" for k in ks), *(f"maj@{k}" for k in ks), "response_length", "truncated", "turns", "tool_calls"]
    return {name: values[name] for name in order if name in values}


def summarize(
    values: dict[str, dict[str, np.ndarray]], *, resamples: int = 1000, confidence: float = 0.95, seed: int = 0,
) -> dict[str, Any]:
    """{"metrics": {model: {metric: interval}}, "comparisons": {model: {metric: difference + verdict}}}.

    `values`: {model: per_prompt(...)}, the first model the baseline. Every interval of one eval
    draws its resamples from the same seed, so a comparison resamples the same prompts for every
    metric."""
    labels = list(values)
    kwargs = {"resamples": resamples, "confidence": confidence, "seed": seed}
    metrics = {label: {name: _interval(bootstrap_interval(v, **kwargs)) for name, v in values[label].items()} for label in labels}
    comparisons: dict[str, dict[str, Any]] = {}
    baseline = values[labels[0]]
    for label in labels[1:]:
        comparisons[label] = {}
        for name, v in values[label].items():
            if name not in baseline:
                continue
            difference = paired_bootstrap(baseline[name], v, **kwargs)
            comparisons[label][name] = {**_interval(difference), "verdict": verdict(difference, direction(name))}
    return {"baseline": labels[0], "metrics": metrics, "comparisons": comparisons}


def _interval(interval: Interval) -> dict[str, Any]:
    """An interval as JSON (NaN as null)."""
    return {key: (None if isinstance(value, float) and math.isnan(value) else value) for key, value in asdict(interval).items()}
