"""The reward monitor's detection rules (docs/monitor.md): pure functions over evaluation curves.

Reward over-optimisation (Gao et al. 2023, "Scaling laws for reward model overoptimization"):
the proxy (the training reward, scored on held-out prompts) keeps rising while a held-out gold
score falls. Both rules read one value per evaluation, in step order, and say at which
evaluation a flag is first raised; the callback `reward_monitor` calls them after each one.

`overoptimisation`: let b be the evaluation with the best gold so far (the first, on ties).
Evaluation t is *hacked* when
    gold[t] < gold[b] - tolerance      (gold fell by more than the tolerance from its best) and
    proxy[t] > proxy[b] + proxy_margin (the proxy stands above its value at the best gold).
The flag is raised at the first t ending `patience` hacked evaluations in a row. Gold noise
within `tolerance` is never hacked, whatever the proxy does; a gold that falls while the proxy
falls too is not over-optimisation (the policy got worse on both).

`length_hacking`: the share of the proxy's gain that response length explains. Over the
evaluations 0..t, fit proxy = a + slope * length by least squares; the share is
    share[t] = slope * (length[t] - length[0]) / (proxy[t] - proxy[0]),
the gain the fitted line predicts from the change in length alone over the gain observed
(clipped to [0, 1]). It is taken only when the proxy gained more than `min_gain`, the length
grew, and at least `min_evals` evaluations exist (a line through two points explains anything).
The flag is raised at the first t ending `patience` evaluations in a row with share >= `threshold`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

FlagKind = Literal["overoptimisation", "length_hacking"]


@dataclass(frozen=True)
class Flag:
    """A raised flag: its kind, the evaluation step it was raised at, and the numbers behind it."""

    kind: FlagKind
    step: int
    message: str
    evidence: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def best_index(gold: Sequence[float]) -> int:
    """Index of the first maximum of `gold` (NaN never counts as best); 0 when all are NaN."""
    best = 0
    for i, value in enumerate(gold):
        if math.isfinite(value) and (not math.isfinite(gold[best]) or value > gold[best]):
            best = i
    return best


def hacked(proxy: Sequence[float], gold: Sequence[float], t: int, tolerance: float, proxy_margin: float = 0.0) -> bool:
    """Whether evaluation `t` is hacked against the best gold of evaluations 0..t (module doc)."""
    b = best_index(gold[: t + 1])
    return gold[t] < gold[b] - tolerance and proxy[t] > proxy[b] + proxy_margin


def overoptimisation(
    steps: Sequence[int], proxy: Sequence[float], gold: Sequence[float], *, tolerance: float, patience: int, proxy_margin: float = 0.0,
) -> Flag | None:
    """The over-optimisation flag of these curves (module doc), or None. All three sequences
    hold one value per evaluation in step order."""
    if not len(steps) == len(proxy) == len(gold):
        raise ValueError(f"monitor: steps, proxy and gold differ in length ({len(steps)}, {len(proxy)}, {len(gold)})")
    streak = 0
    for t in range(len(steps)):
        streak = streak + 1 if hacked(proxy, gold, t, tolerance, proxy_margin) else 0
        if streak >= patience:
            b = best_index(gold[: t + 1])
            evidence = {"best_gold": gold[b], "best_gold_step": steps[b], "proxy_at_best_gold": proxy[b], "gold": gold[t], "proxy": proxy[t]}
            message = (
                f"over-optimisation at step {steps[t]}: gold {gold[t]:.4g} fell more than {tolerance:g} below its best "
                f"{gold[b]:.4g} (step {steps[b]}) while the proxy rose from {proxy[b]:.4g} to {proxy[t]:.4g}, "
                f"{patience} evaluation(s) in a row"
            )
            return Flag("overoptimisation", int(steps[t]), message, evidence)
    return None


def length_share(proxy: Sequence[float], length: Sequence[float], *, min_gain: float = 0.0) -> float | None:
    """Share of the proxy's gain from the first to the last evaluation explained by response
    length (module doc), in [0, 1]; None when it is not defined (no gain, no growth in length,
    fewer than three points or a constant length)."""
    n = len(proxy)
    gain, growth = (proxy[-1] - proxy[0], length[-1] - length[0]) if n else (0.0, 0.0)
    if n < 3 or gain <= min_gain or growth <= 0:
        return None
    mean_x, mean_y = sum(length) / n, sum(proxy) / n
    var_x = sum((x - mean_x) ** 2 for x in length)
    if var_x <= 0:
        return None
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(length, proxy, strict=True)) / var_x
    return min(max(slope * growth / gain, 0.0), 1.0)


def length_hacking(
    steps: Sequence[int], proxy: Sequence[float], length: Sequence[float], *, threshold: float, patience: int, min_gain: float = 0.0,
    min_evals: int = 3,
) -> Flag | None:
    """The length-hacking flag of these curves (module doc), or None."""
    if not len(steps) == len(proxy) == len(length):
        raise ValueError(f"monitor: steps, proxy and length differ in length ({len(steps)}, {len(proxy)}, {len(length)})")
    streak = 0
    for t in range(len(steps)):
        share = length_share(proxy[: t + 1], length[: t + 1], min_gain=min_gain) if t + 1 >= max(min_evals, 3) else None
        streak = streak + 1 if share is not None and share >= threshold else 0
        if streak >= patience:
            evidence = {"share": share, "proxy_gain": proxy[t] - proxy[0], "length_from": length[0], "length_to": length[t]}
            message = (
                f"length hacking at step {steps[t]}: {share:.0%} of the proxy's gain ({proxy[0]:.4g} -> {proxy[t]:.4g}) is explained "
                f"by response length ({length[0]:.4g} -> {length[t]:.4g} tokens), >= {threshold:.0%} for {patience} evaluation(s) in a row"
            )
            return Flag("length_hacking", int(steps[t]), message, evidence)
    return None


def moments(x: Sequence[float], y: Sequence[float]) -> list[float]:
    """[n, sum x, sum y, sum x^2, sum y^2, sum xy]: sums that add over shards (ranks)."""
    return [float(len(x)), sum(x), sum(y), sum(a * a for a in x), sum(b * b for b in y), sum(a * b for a, b in zip(x, y, strict=True))]


def pearson(sums: Sequence[float]) -> float | None:
    """Pearson correlation from `moments` (summed over ranks); None when n < 2 or either
    variable is constant."""
    n, sx, sy, sxx, syy, sxy = sums
    if n < 2:
        return None
    var_x, var_y = sxx - sx * sx / n, syy - sy * sy / n
    # Relative floor: a constant variable leaves rounding residue, not variance.
    if var_x <= 1e-12 * max(sxx, 1.0) or var_y <= 1e-12 * max(syy, 1.0):
        return None
    return (sxy - sx * sy / n) / math.sqrt(var_x * var_y)
