"""Loading weights by name, strictly: a sync or engine update that matches nothing is an error.

A sync loaded with `strict=False` would let a key-prefix mismatch (a DDP `module.` prefix,
a wrapper's attribute name) silently loaded nothing and rollouts kept coming from the initial
weights. Here the names must match the model's. Under LoRA the frozen base never changes, so an
update carries only the trainable tensors (adapters and value heads).
"""

from __future__ import annotations

import torch
from torch import nn

from olingo.models.lora import has_lora, trainable_state


def sync_keys(model: nn.Module) -> set[str]:
    """The keys an update of `model` carries: its trainable tensors under LoRA, else its whole state."""
    return set(trainable_state(model)) if has_lora(model) else set(model.state_dict())


def load_named_tensors(model: nn.Module, state: dict[str, torch.Tensor], what: str, full: bool = True) -> int:
    """Load `state` into `model`; raises ValueError unless the names match. Returns tensors loaded.

    full: the state must hold every key an update carries (`sync_keys`); a partial update may
    leave keys out, but may never bring a key the model does not have.
    """
    expected = sync_keys(model)
    unexpected = sorted(set(state) - expected)
    missing = sorted(expected - set(state)) if full else []
    if unexpected or missing or not state:
        raise ValueError(
            f"weight update for the {what}: the sent weights do not match the model "
            f"({len(missing)} missing keys, e.g. {missing[:3]}; {len(unexpected)} unexpected, e.g. {unexpected[:3]}); "
            "sender and receiver must build the same architecture and LoRA settings "
            "(and unwrap DDP/compile wrappers before sending)"
        )
    # Under LoRA the state is the trainable part only: the checks above are the strict ones.
    model.load_state_dict(state, strict=full and not has_lora(model))  # shape mismatches raise here
    return len(state)
