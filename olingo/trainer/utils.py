"""Seeding, RNG snapshots, step arithmetic and the AdamW kernel choice shared by every trainer."""

from __future__ import annotations

import math
import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch once at the start of a run (never inside a loop)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """The global RNG states a checkpoint must hold to continue a run exactly."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def optimizer_steps_per_epoch(num_batches: int, accumulation_steps: int) -> int:
    """Optimizer steps one epoch of `num_batches` micro-batches takes (a short last group
    still steps), the number schedulers must be sized with."""
    if accumulation_steps < 1:
        raise ValueError("accumulation_steps must be >= 1")
    return math.ceil(num_batches / accumulation_steps)


def adam_kernel(params: list[torch.Tensor], implementation: str = "auto") -> dict[str, bool]:
    """torch.optim.AdamW's kernel keywords for `implementation` (`OptimizerConfig.implementation`).
    torch's own default on CPU is the per-tensor loop (foreach is CUDA-only by default), several
    times slower than its fused kernel, which steps every parameter in one call and supports CPU
    and CUDA float tensors (torch >= 2.4): "auto" takes it wherever every parameter is such a
    tensor (FSDP2's DTensors included)."""
    if implementation == "auto":
        fusable = bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
        return {"fused": True} if fusable else {}
    return {"torch": {}, "fused": {"fused": True}, "foreach": {"foreach": True}, "for_loop": {"foreach": False}}[implementation]
