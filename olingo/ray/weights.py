"""Weight sync between the trainer and the experience makers: what is sent and how it is loaded.

coati's sync loaded with `strict=False`, so a key-prefix mismatch (a DDP `module.` prefix, a
wrapper's attribute name) silently loaded nothing and the makers kept generating with the initial
weights. Here a sync whose keys do not match the maker's model is an error naming the keys.

With LoRA the frozen base never changes and every maker loaded it itself, so a sync carries only
the trainable tensors (adapters and value heads): megabytes instead of the whole model.
"""

from __future__ import annotations

import torch
from torch import nn

from olingo.models.lora import has_lora, trainable_state


def sync_keys(model: nn.Module) -> set[str]:
    """The keys a sync of `model` carries: its trainable tensors under LoRA, else its whole state."""
    return set(trainable_state(model)) if has_lora(model) else set(model.state_dict())


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
    """Load `state` into `model`; raises ValueError unless the keys match. Returns tensors loaded.

    fully_update: the state must hold every key a sync carries (`sync_keys`; a partial update,
    e.g. only some layers, may leave keys out, but may never bring keys the model does not have).
    """
    expected = sync_keys(model)
    unexpected = sorted(set(state) - expected)
    missing = sorted(expected - set(state)) if fully_update else []
    if unexpected or missing or not state:
        raise ValueError(
            f"weight sync for the {what}: the sent weights do not match the maker's model "
            f"({len(missing)} missing keys, e.g. {missing[:3]}; {len(unexpected)} unexpected, e.g. {unexpected[:3]}); "
            "the trainer and the maker must build the same architecture and LoRA settings "
            "(and unwrap DDP/compile wrappers before sending)"
        )
    # Under LoRA the state is the trainable part only: the checks above are the strict ones.
    model.load_state_dict(state, strict=fully_update and not has_lora(model))  # shape mismatches raise here
    return len(state)
