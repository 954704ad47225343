"""Small pure tensor helpers shared by reward models, critics and trainers."""

from __future__ import annotations

import functools
import inspect

import torch

# Attention implementations whose masks honour an arbitrary 2D mask, holes in the middle of a row
# included (a kept KV cache with padding inside it): flash-attention's varlen path is not among them.
HOLE_SAFE_ATTENTION = ("sdpa", "eager")


def honours_holes(config) -> bool:
    """Whether a model config's attention implementation is one of HOLE_SAFE_ATTENTION."""
    return getattr(config, "_attn_implementation", None) in HOLE_SAFE_ATTENTION


def last_attended_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last position whose mask is 1, per row; works for left and right padding.

    attention_mask: (B, L) of 0/1. Returns (B,) long. A row of all zeros returns L - 1 (it
    should never happen: the dataset refuses empty rows).
    """
    length = attention_mask.shape[-1]
    return length - 1 - attention_mask.flip(-1).long().argmax(dim=-1)


def keeps_logits(model: torch.nn.Module) -> bool:
    """Whether the (possibly DDP-wrapped) model's forward takes `logits_to_keep`: the output
    head and the softmax over the vocabulary can then skip the positions nobody scores (a
    real vocabulary of 49k-150k tokens makes them the costliest part of a small model)."""
    return _forward_takes_logits_to_keep(type(getattr(model, "module", model)))


@functools.cache
def _forward_takes_logits_to_keep(model_type: type) -> bool:
    # Read once per model class: inspecting a signature on every forward is needless work.
    return "logits_to_keep" in inspect.signature(model_type.forward).parameters


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over attended tokens only: (B, L) long.

    With left padding, a row's first real token must still be position 0, exactly as with
    right padding, so that a sequence gets the same outputs whichever side it is padded on.
    """
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)
