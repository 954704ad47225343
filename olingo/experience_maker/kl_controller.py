"""The coefficient of the KL penalty in PPO's shaped reward: fixed, or adapted towards a target.

Both controllers share one interface (`value`, `update`, `state_dict`, `load_state_dict`) so a
trainer holds a `KLController` and never asks which kind it has. State is a plain python float,
JSON-safe, so a resumed run continues with exactly the coefficient it stopped with.
"""

from __future__ import annotations


class FixedKLController:
    """A constant KL coefficient; `update` does nothing. kl_coef must be >= 0."""

    def __init__(self, kl_coef: float) -> None:
        if kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient is fixed."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Proportional control of the KL coefficient (Ziegler et al. 2019, "Fine-Tuning Language
    Models from Human Preferences", eq. 2).

    e = clip(KL / target - 1, -0.2, 0.2); value *= 1 + e * n_steps / horizon. The coefficient
    rises while the measured KL is above `target` and falls while below; the clip bounds one
    update's factor to 1 +- 0.2 * n_steps / horizon, so one outlier batch cannot swing it.
    Ziegler (and trlx) measure `current_kl` as the mean per-sequence KL (summed over tokens)
    and pass the batch size as `n_steps`; `target` must be in the same units as `current_kl`.
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: int) -> None:
        if init_kl_coef <= 0:
            # The update is multiplicative: a coefficient of 0 could never move.
            raise ValueError(f"init_kl_coef must be > 0, got {init_kl_coef}")
        if target <= 0:
            raise ValueError(f"target KL must be > 0, got {target}")
        if horizon <= 0:
            raise ValueError(f"horizon must be > 0, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move `value` towards the coefficient that keeps KL at the target."""
        error = min(max(float(current_kl) / self.target - 1, -0.2), 0.2)
        self.value *= 1 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


KLController = FixedKLController | AdaptiveKLController
