"""Weight sync between the trainer and the experience makers: what is sent and how it is loaded.

A sync loaded with `strict=False` would let a key-prefix mismatch (a DDP `module.` prefix, a
wrapper's attribute name) silently loaded nothing and the makers kept generating with the initial
weights. Here a sync whose keys do not match the maker's model is an error naming the keys.

With LoRA the frozen base never changes and every maker loaded it itself, so a sync carries only
the trainable tensors (adapters and value heads): megabytes instead of the whole model.
"""

from __future__ import annotations

import torch
from torch import nn

from olingo.models.lora import has_lora, trainable_state
from olingo.models.weights import load_named_tensors


def state_dict_for_sync(model: nn.Module) -> dict[str, torch.Tensor]:
    """The weights to send as detached CPU tensors (what goes into the object store): the whole
    state, or under LoRA only the adapters and heads."""
    state = trainable_state(model) if has_lora(model) else model.state_dict()
    return {name: tensor.detach().to("cpu", copy=True) for name, tensor in state.items()}


def state_dict_nbytes(state: dict[str, torch.Tensor]) -> int:
    """Bytes of the distinct tensors in `state` (tied weights counted once)."""
    seen: dict[int, int] = {}
    for tensor in state.values():
        seen[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
    return sum(seen.values())


def load_synced_state(model: nn.Module, state: dict[str, torch.Tensor], what: str, fully_update: bool = True) -> int:
    """Load a sync into a maker's `model` strictly (see `olingo.models.weights.load_named_tensors`)."""
    return load_named_tensors(model, state, what, full=fully_update)
