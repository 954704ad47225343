"""The estimators of `olingo eval`, as pure functions of numbers (no model, no torch, no I/O).

- `pass_at_k`: the unbiased pass@k of Chen et al. 2021, "Evaluating Large Language Models Trained
  on Code" (the Codex paper), eq. 1, computed as a product (never a ratio of huge binomials).
- `majority_vote`, `maj_at_k`: self-consistency (Wang et al. 2023, "Self-Consistency Improves
  Chain of Thought Reasoning in Language Models"): the most common extracted answer of k samples.
- `bootstrap_interval`, `paired_bootstrap`, `verdict`: percentile bootstrap intervals over prompts
  (Efron & Tibshirani 1993, "An Introduction to the Bootstrap", ch. 13), paired for comparisons
  (the per-prompt difference is resampled, so what two models share about a prompt cancels;
  Dror et al. 2018, "The Hitchhiker's Guide to Testing Statistical Significance in NLP").

Prompts are the unit of resampling: the samples of one prompt are correlated (an easy prompt is
easy for all of them), so resampling samples would make intervals too narrow.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

BOOTSTRAP_CHUNK = 256  # resamples drawn at a time: bounds memory at 256 x prompts indices


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k samples drawn without replacement from n is correct), c of n correct.

    Chen et al. 2021, eq. 1: pass@k = 1 - C(n-c, k) / C(n, k), unbiased for the pass@k of the
    model. Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which is the same ratio without
    factorials (their numpy snippet), stable for any n."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def majority_vote(answers: Sequence[str | None]) -> int | None:
    """The index of the sample whose answer wins the vote, or None when no sample has an answer.

    Samples without an answer (None) do not vote. Ties between equally common answers go to the
    answer that occurs first in `answers` (the lowest sample index), so the vote is deterministic;
    the returned index is that answer's first occurrence."""
    counts: dict[str, int] = {}
    first: dict[str, int] = {}
    for index, answer in enumerate(answers):
        if answer is not None:
            counts[answer] = counts.get(answer, 0) + 1
            first.setdefault(answer, index)
    if not counts:
        return None
    best = max(counts.values())
    return min(first[a] for a, count in counts.items() if count == best)


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool], k: int, *, max_subsets: int = 1000, seed: int = 0) -> float:
    """The expected correctness of the majority vote (`majority_vote`) over k of the n samples.

    Averaged over every k-subset of the n samples (in sample order) when there are at most
    `max_subsets` of them, which is exact; else over `max_subsets` subsets drawn uniformly with
    `random.Random(seed)` (deterministic). A vote is correct when the winning sample is
    (`correct[index]`); a subset where no sample has an answer counts as wrong. With k = n it
    is the plain majority vote of all samples."""
    n = len(answers)
    if len(correct) != n or not 1 <= k <= n:
        raise ValueError(f"maj@k needs answers and correct of one length n and 1 <= k <= n, got {n}, {len(correct)}, k={k}")
    if math.comb(n, k) <= max_subsets:
        subsets: Sequence[Sequence[int]] = list(itertools.combinations(range(n), k))
    else:
        rng = random.Random(seed)
        subsets = [sorted(rng.sample(range(n), k)) for _ in range(max_subsets)]
    right = 0
    for subset in subsets:
        winner = majority_vote([answers[i] for i in subset])
        right += winner is not None and bool(correct[subset[winner]])
    return right / len(subsets)


@dataclass(frozen=True)
class Interval:
    """A mean over prompts with its bootstrap interval."""

    value: float
    low: float
    high: float
    prompts: int

    def covers(self, x: float) -> bool:
        return self.low <= x <= self.high


def bootstrap_interval(values: Sequence[float] | np.ndarray, *, resamples: int = 1000, confidence: float = 0.95, seed: int = 0) -> Interval:
    """The mean of `values` (one per prompt) and its percentile bootstrap interval.

    `resamples` means of len(values) values drawn with replacement, by `np.random.default_rng(seed)`
    (a fixed seed gives the same interval every time); the interval is their (1-confidence)/2 and
    (1+confidence)/2 quantiles (numpy's linear interpolation). NaN values (a prompt the metric does
    not apply to) are left out first. No values: NaN throughout."""
    data = np.asarray(values, dtype=np.float64)
    data = data[~np.isnan(data)]
    if data.size == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    means = _resampled_means(data, resamples, seed)
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return Interval(float(data.mean()), float(low), float(high), int(data.size))


def _resampled_means(data: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """`resamples` bootstrap means of `data`, drawn a chunk at a time."""
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for start in range(0, resamples, BOOTSTRAP_CHUNK):
        count = min(BOOTSTRAP_CHUNK, resamples - start)
        means[start : start + count] = data[rng.integers(0, data.size, size=(count, data.size))].mean(axis=1)
    return means


def paired_bootstrap(
    baseline: Sequence[float] | np.ndarray, other: Sequence[float] | np.ndarray, *, resamples: int = 1000, confidence: float = 0.95, seed: int = 0,
) -> Interval:
    """The mean difference `other - baseline` over the prompts both have a value for, with its
    paired bootstrap interval: the per-prompt differences are resampled together (a prompt drawn
    is drawn for both models), as `bootstrap_interval` does for one model."""
    a, b = np.asarray(baseline, dtype=np.float64), np.asarray(other, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"a paired comparison needs the same prompts: {a.shape} vs {b.shape} values")
    return bootstrap_interval(b - a, resamples=resamples, confidence=confidence, seed=seed)


BETTER, WORSE, HIGHER, LOWER, NOISE = "better", "worse", "higher", "lower", "within noise"


def verdict(difference: Interval, direction: int) -> str:
    """What a difference interval says: "within noise" when it covers 0 (or is undefined); else
    "better"/"worse" for a metric with a direction (+1: higher is better, -1: lower is better),
    "higher"/"lower" for one without (0: response length, turns)."""
    if math.isnan(difference.low) or difference.covers(0.0):
        return NOISE
    up = difference.low > 0
    if direction == 0:
        return HIGHER if up else LOWER
    return BETTER if up == (direction > 0) else WORSE
