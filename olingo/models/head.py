"""A causal LM's output head taken apart, so log-probs over a large vocabulary never hold the
whole logits (`olingo.rl.logprobs.head_token_stats`, docs/packing.md).

`head_bypassed(model)` makes the model's forward return its head's *input* (the hidden states
after the final norm) in place of the logits, for as long as the context lasts: the forward runs
unchanged otherwise (packing, `logits_to_keep`, DDP's hooks, LoRA adapters), and the caller
applies the head's weight a chunk of tokens at a time.

That is right when what the forward does after the head commutes with it (nothing, or a scale
such as Cohere's logit scale). `chunkable_head(model)` says so from a probe, once per model class:
a model that transforms its logits otherwise (Gemma 2's soft-capping, also read from its config)
gets None and keeps whole logits. So do models whose parameters are sharded DTensors (FSDP2: the
head's weight is whole only inside the forward).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn


def output_head(model: nn.Module) -> nn.Module | None:
    """The (possibly DDP-wrapped or LoRA-wrapped) causal LM's output head, when it is a linear
    layer (a (V, H) `weight`, an optional `bias`); else None."""
    inner = getattr(model, "module", model)
    getter = getattr(inner, "get_output_embeddings", None)
    head = getter() if callable(getter) else None
    weight = getattr(head, "weight", None)
    return head if isinstance(head, nn.Module) and isinstance(weight, torch.Tensor) and weight.dim() == 2 else None


@contextmanager
def head_bypassed(model: nn.Module) -> Iterator[nn.Module]:
    """Within the context the model's `.logits` are its head's inputs, (..., H); yields the head.
    An instance attribute shadows the head's `forward` and is deleted on exit."""
    head = output_head(model)
    if head is None:
        raise ValueError(f"{type(getattr(model, 'module', model)).__name__} has no linear output head to bypass")
    head.forward = _identity
    try:
        yield head
    finally:
        del head.forward


def _identity(hidden: torch.Tensor) -> torch.Tensor:
    return hidden


def chunkable_head(model: nn.Module) -> nn.Module | None:
    """The output head when `head_bypassed` gives its exact input (probed once per model class
    and attention implementation), else None: whole logits for this model."""
    head = output_head(model)
    inner = getattr(model, "module", model)
    softcapped = getattr(getattr(inner, "config", None), "final_logit_softcapping", None)
    if head is None or softcapped or any(type(p).__name__ == "DTensor" for p in model.parameters()):
        return None
    key = (type(inner), getattr(getattr(inner, "config", None), "_attn_implementation", None))
    if key not in _PROBED:
        _PROBED[key] = _head_is_last(model, head)
    return head if _PROBED[key] else None


_PROBED: dict[tuple[type, str | None], bool] = {}


@torch.no_grad()
def _head_is_last(model: nn.Module, head: nn.Module) -> bool:
    """The head applied to the bypassed forward's output equals the model's logits (eval mode)."""
    ids = torch.tensor([[1, 2, 3, 4]], device=head.weight.device)
    was_training = model.training
    model.eval()
    try:
        logits = model(input_ids=ids, use_cache=False).logits.float()
        with head_bypassed(model):
            hidden = model(input_ids=ids, use_cache=False).logits
    finally:
        model.train(was_training)
    if hidden.shape[-1] != head.weight.shape[1]:
        return False
    again = F.linear(hidden, head.weight, head.bias).float()
    # The same matmul on the same inputs: equal up to rounding (float32 near 1e-6 of the scale, bf16 near 1%).
    tolerance = 1e-4 if head.weight.dtype == torch.float32 else 2e-2
    return bool(torch.allclose(again, logits, atol=tolerance * (float(logits.abs().max()) + 1e-6), rtol=0))


__all__ = ["chunkable_head", "head_bypassed", "output_head"]
