"""The off-policy fields of the `loss:` sections of `olingo ppo` and `olingo grpo` (docs/async.md).

Both sections declare the same fields with these factories, so `--help` shows each next to the
section's other settings, and both check them with `check_offpolicy_fields`. `tis_cap` is the
switch: without it no correction runs, and every other field here needs it.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field

from olingo.rl.offpolicy import OffPolicyCorrection


def tis_cap_field() -> Any:
    return Field(
        None, gt=0,
        description="truncated importance sampling: each token's policy loss x min(pi_old / pi_behaviour, tis_cap), pi_behaviour "
        "as behaviour_log_probs says (null: off; about 2 in Yao et al. 2025)",
    )


def behaviour_log_probs_field() -> Any:
    return Field(
        "engine",
        description="pi_behaviour, the policy that sampled, for tis_cap and offpolicy_mask: engine (a separate engine's (vllm) own "
        "log-probs; pi_old is the trainer's rollout-time forward) or experience (what the experience recorded of its sampler, "
        "for experience older than the learner; pi_old is then the learner's current weights: decoupled PPO, exact when each "
        "batch is learnt in one optimizer step; needs tis_cap; docs/async.md)",
    )


def offpolicy_mask_field() -> Any:
    return Field(
        "none",
        description="drop what is too far off-policy, by w = pi_old / pi_behaviour: none; token (tokens whose w is outside "
        "[offpolicy_mask_low, offpolicy_mask_high]); sequence (responses whose prod_t w is outside); geometric (responses whose "
        "exp(mean_t log w) is outside); needs tis_cap; logged as train/offpolicy_masked_frac (docs/async.md)",
    )


def offpolicy_mask_low_field() -> Any:
    return Field(
        None, ge=0, lt=1,
        description="offpolicy_mask: lowest kept ratio (0: no lower bound; verl's presets: 0.5 for sequence, 0.999 for geometric)",
    )


def offpolicy_mask_high_field() -> Any:
    return Field(
        None, gt=1, description="offpolicy_mask: highest kept ratio (verl's presets: 2 for sequence, 1.001 for geometric)",
    )


def check_offpolicy_fields(loss: Any) -> None:
    """Refuse off-policy settings that would do nothing, or lack what they need (ValueError)."""
    bounds = loss.offpolicy_mask_low is not None or loss.offpolicy_mask_high is not None
    if loss.offpolicy_mask == "none" and bounds:
        raise ValueError("loss.offpolicy_mask_low/high bound loss.offpolicy_mask, which is none: set offpolicy_mask or drop the bounds")
    if loss.tis_cap is None:
        if loss.behaviour_log_probs == "experience":
            raise ValueError("loss.behaviour_log_probs=experience weights tokens by pi_old / pi_behaviour: it needs loss.tis_cap (about 2)")
        if loss.offpolicy_mask != "none":
            raise ValueError(
                f"loss.offpolicy_mask={loss.offpolicy_mask} drops tokens by their importance weight, which loss.tis_cap turns on: "
                "set tis_cap (to offpolicy_mask_high to leave the kept weights untruncated)"
            )
    if loss.offpolicy_mask != "none" and loss.offpolicy_mask_low is None and loss.offpolicy_mask_high is None:
        raise ValueError(f"loss.offpolicy_mask={loss.offpolicy_mask} needs offpolicy_mask_low and/or offpolicy_mask_high (the kept band)")


def offpolicy_settings(loss: Any) -> OffPolicyCorrection:
    """The learner's `OffPolicyCorrection` from a checked `loss:` section; a bound left unset is open."""
    low = loss.offpolicy_mask_low if loss.offpolicy_mask_low is not None else 0.0
    high = loss.offpolicy_mask_high if loss.offpolicy_mask_high is not None else math.inf
    return OffPolicyCorrection(loss.tis_cap, loss.behaviour_log_probs, loss.offpolicy_mask, low, high)


def check_one_step_per_episode(loss: Any, steps_per_episode: int) -> None:
    """`behaviour_log_probs: experience` takes the proximal policy from the learner's current
    weights, which is the rollout-time policy only at an episode's first optimizer step: refuse it
    where an episode takes more (the clip would never bind after the first)."""
    from olingo.config import ConfigError

    if loss.behaviour_log_probs == "experience" and steps_per_episode > 1:
        raise ConfigError(
            f"loss.behaviour_log_probs: experience needs one optimizer step per episode (this loop takes {steps_per_episode}): "
            "set loop.update_steps=1 and one train batch per rollout, or use behaviour_log_probs: engine"
        )
