"""The AdamW kernel (`OptimizerConfig.implementation`): torch's fused kernel by default where it
applies, torch's own choice on request, with the same updates as the per-tensor loop up to float
rounding."""

from __future__ import annotations

import pytest
import torch

from olingo.recipes.common import OptimizerConfig, build_optimizer


def small_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    return model


def steps(implementation: str, n: int = 3) -> list[torch.Tensor]:
    model = small_model()
    optimizer = build_optimizer(model, 1e-2, 0.1, (0.9, 0.95), implementation)
    torch.manual_seed(1)
    for _ in range(n):
        model(torch.randn(5, 8)).pow(2).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def test_each_kernel_choice_is_honoured_and_the_default_is_the_fused_kernel():
    impls = ("auto", "torch", "fused", "foreach", "for_loop")
    defaults = {impl: build_optimizer(small_model(), 1e-3, 0.0, (0.9, 0.95), impl).defaults for impl in impls}
    assert defaults["auto"]["fused"] is True and defaults["fused"]["fused"] is True
    assert not defaults["torch"]["fused"] and defaults["torch"]["foreach"] is None
    assert (defaults["foreach"]["foreach"], defaults["for_loop"]["foreach"]) == (True, False)
    assert OptimizerConfig().implementation == "auto"
    with pytest.raises(ValueError):
        OptimizerConfig(implementation="apex")


def test_auto_falls_back_to_torchs_choice_where_the_fused_kernel_does_not_apply():
    from olingo.trainer.utils import adam_kernel

    assert adam_kernel([torch.zeros(2, device="meta")], "auto") == {}  # not a CPU or CUDA tensor
    assert adam_kernel([], "auto") == {}  # nothing to train: no kernel to choose (all() of no parameters would say fused)
    assert adam_kernel([torch.zeros(2)], "auto") == {"fused": True}


def test_the_fused_kernel_makes_the_loops_updates():
    """Same maths, another order of float operations: the weights after three steps agree to
    1e-6 (float32 rounding over a few fused multiply-adds, far below the 1e-2 step size)."""
    for fused, loop in zip(steps("fused"), steps("for_loop"), strict=True):
        torch.testing.assert_close(fused, loop, rtol=0, atol=1e-6)
