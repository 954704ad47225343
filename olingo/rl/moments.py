"""Running statistics of a stream of scalars (reward normalisation)."""

from __future__ import annotations

import math

import torch

from olingo.rl.masked import AllReduceSum, local_sum


class RunningMoments:
    """Running mean and population std of all scalars seen so far, merged batch by batch with
    the parallel algorithm of Chan, Golub and LeVeque (1979), in float64.

    Before any update mean is 0.0 and std 1.0, so normalising by them is a no-op. `std` is at
    least `eps`. State is plain python numbers (JSON-safe) and round-trips exactly.
    """

    def __init__(self, eps: float = 1e-8) -> None:
        self.eps = eps
        self.mean = 0.0
        self.var = 1.0
        self.count = 0

    @property
    def std(self) -> float:
        return max(math.sqrt(self.var), self.eps)

    def update(self, x: torch.Tensor, all_reduce_sum: AllReduceSum | None = None) -> tuple[float, float]:
        """Fold in every element of `x` (any shape, non-empty); returns the batch's mean and
        population std. With `all_reduce_sum` the batch is every rank's `x` together, so the
        statistics stay identical on all ranks (and equal one process's on the whole batch)."""
        if x.numel() == 0:
            raise ValueError("RunningMoments.update needs at least one value")
        reduce = all_reduce_sum or local_sum
        x = x.detach().double().flatten()
        n = int(reduce(torch.tensor(float(x.numel()), dtype=torch.float64, device=x.device)).item())
        batch_mean = (reduce(x.sum()) / n).item()
        batch_var = (reduce(((x - batch_mean) ** 2).sum()) / n).item()
        total = self.count + n
        delta = batch_mean - self.mean
        # Chan et al.: M2 = M2_a + M2_b + delta^2 * n_a * n_b / n; the prior var has weight 0
        # while count is 0, so its initial 1.0 never leaks into the statistics.
        m2 = self.var * self.count + batch_var * n + delta**2 * self.count * n / total
        self.mean += delta * n / total
        self.var = m2 / total
        self.count = total
        return batch_mean, math.sqrt(batch_var)

    def state_dict(self) -> dict[str, float | int]:
        return {"mean": self.mean, "var": self.var, "count": self.count}

    def load_state_dict(self, state: dict[str, float | int]) -> None:
        self.mean = float(state["mean"])
        self.var = float(state["var"])
        self.count = int(state["count"])
