"""Padding-free forwards: the attended tokens of a padded (B, L) batch, packed into fewer rows.

A micro-batch of uneven rows padded to its longest row wastes every padded position of every
layer. `pack_batch` instead places the rows, first-fit-decreasing, into packed rows of at most
`capacity` tokens (never less than the longest row), each row's tokens with their own position
ids 0..n-1. transformers then keeps the packed rows apart: given `position_ids` and no
`attention_mask`, its mask builder reads a new sequence wherever the positions do not step by
one (`masking_utils.find_packed_sequence_indices`), a block-diagonal causal mask for sdpa and
eager, and the varlen kernels of flash-attention on GPU. No kernel here is ours.

The window of packing is the micro-batch itself: which rows train together, in which order, and
every loss normalisation stay exactly as padded, so packing changes speed, never the gradient
(up to float rounding of differently shaped matmuls, ~1e-6). `packed_logits` returns logits in
the padded layout, so a caller's log-prob, NLL and mask code is unchanged.

A model whose attention ignores packed position ids (old remote code, a custom attention) would
mix rows silently; `check_packing` runs two short rows packed and alone once per model class
and attention implementation, and stops with the reason when they differ.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from olingo.errors import OlingoError
from olingo.models.utils import keeps_logits, position_ids_from_mask

PACKING_DESCRIPTION = (
    "pack each micro-batch's rows into padding-free rows (first-fit-decreasing, position ids restarting per row) "
    "for every forward of the trained model, reference and critic: faster on uneven lengths, the same gradient (docs/packing.md)"
)


class PackingUnsupported(OlingoError, ValueError):
    """The model's attention does not keep packed rows apart."""


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins of row indices, each bin's lengths summing to at most `capacity`.

    Rows go longest first (ties: lower index first) into the first bin with room, a new bin when
    none has; within a bin, rows keep that order. Deterministic, so a resumed run packs the same
    micro-batch the same way. A row longer than `capacity` is an error: callers size `capacity`
    to at least the longest row, so no row is ever truncated or dropped.
    """
    if any(n > capacity for n in lengths):
        raise ValueError(f"a row of {max(lengths)} tokens does not fit a packed row of {capacity}")
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(capacity - lengths[i])
    return bins


@dataclass(frozen=True)
class PackedBatch:
    """A padded (B, L) batch's attended tokens, packed into (R, C).

    input_ids, position_ids: (R, C) long. Each padded row's attended tokens, in order, occupy one
    contiguous run of a packed row with positions 0..n-1; the tail of a packed row is filler
    (token 0, positions 0, 1, .., a sequence of its own that nothing reads).
    source: (N,) long, the flat index b * L + t of each packed token in the padded batch;
    target: (N,) long, its flat index r * C + c in the packed batch (N = attended tokens).
    batch_shape: (B, L).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    source: torch.Tensor
    target: torch.Tensor
    batch_shape: tuple[int, int]

    @property
    def padding_fraction(self) -> float:
        """Share of the packed batch that is filler (0 when the rows fill it exactly)."""
        return 1.0 - self.source.numel() / max(1, self.input_ids.numel())


def pack_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor, capacity: int = 0, position_ids: torch.Tensor | None = None) -> PackedBatch:
    """Pack the attended tokens of (B, L) `input_ids` into rows of at most max(capacity, longest row).

    attention_mask: (B, L) of 0/1, left, right or both-side padding. Position ids count attended
    tokens, as `position_ids_from_mask` does for the padded forward, so both see the same inputs;
    or they are the given (B, L) `position_ids`, where a row may restart at 0 to hold several
    segments that do not see each other (a multi-turn row split by its chat template).
    """
    batch, length = input_ids.shape
    keep = attention_mask.bool()
    lengths = keep.sum(1).tolist()
    bins = first_fit_decreasing(lengths, max(capacity, max(lengths, default=0), 1))
    width = max(sum(lengths[i] for i in b) for b in bins)
    columns = [row.nonzero().squeeze(1) for row in keep.cpu()]
    given = position_ids.cpu() if position_ids is not None else None
    positions = torch.arange(width)
    packed_positions = torch.zeros(len(bins), width, dtype=torch.long)
    sources, targets = [], []
    for r, rows in enumerate(bins):
        offset = 0
        for i in rows:
            n = lengths[i]
            sources.append(i * length + columns[i])
            targets.append(r * width + offset + positions[:n])
            packed_positions[r, offset : offset + n] = positions[:n] if given is None else given[i, columns[i]]
            offset += n
        packed_positions[r, offset:] = positions[: width - offset]
    device = input_ids.device
    source, target = torch.cat(sources).to(device), torch.cat(targets).to(device)
    packed_ids = input_ids.new_zeros(len(bins) * width)
    packed_ids[target] = input_ids.flatten()[source]
    return PackedBatch(packed_ids.view(len(bins), width), packed_positions.to(device), source, target, (batch, length))


def unpack(values: torch.Tensor, packed: PackedBatch, fill: float = 0.0) -> torch.Tensor:
    """Per-token `values` (R, C, *rest) of a packed batch back in the padded layout (B, L, *rest).

    Positions that were padding hold `fill`. Differentiable with respect to `values`.
    """
    batch, length = packed.batch_shape
    flat = values.flatten(0, 1).index_select(0, packed.target)
    out = values.new_full((batch * length, *values.shape[2:]), fill)
    return out.index_copy(0, packed.source, flat).view(batch, length, *values.shape[2:])


def packed_logits(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, capacity: int = 0, last: int = 0, position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """A causal LM's logits for a padded batch, computed padding-free: (B, L, V), or (B, last, V)
    for the last `last` positions (0: all).

    The same logits as `model(input_ids, attention_mask, position_ids=position_ids_from_mask(...))`
    at attended positions (float rounding aside), zeros at padding. Where the model takes
    `logits_to_keep`, the output head runs on the attended tokens among the kept positions only.
    """
    check_packing(model)
    packed = pack_batch(input_ids, attention_mask, capacity, position_ids)
    batch, length = packed.batch_shape
    last = last or length
    wanted = packed.source % length >= length - last
    source, target = packed.source[wanted], packed.target[wanted]
    if keeps_logits(model):
        keep = torch.zeros(packed.input_ids.numel(), dtype=torch.bool, device=target.device)
        keep[target] = True
        logits = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False, logits_to_keep=keep.view_as(packed.input_ids)).logits
        # A boolean logits_to_keep yields the kept positions flattened in row-major order: `target` sorted.
        order = target.argsort()
        rows, source = logits.reshape(-1, logits.shape[-1]), source[order]
    else:
        logits = model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False).logits
        rows = logits.flatten(0, 1).index_select(0, target)
    destination = (source // length) * last + source % length - (length - last)
    return rows.new_zeros(batch * last, rows.shape[-1]).index_copy(0, destination, rows).view(batch, last, rows.shape[-1])


def lm_logits(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, packing: bool, last: int = 0, position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """A causal LM's logits for a padded (B, L) batch: (B, L, V), or (B, last, V) for the last
    `last` positions (0: all); packed (`packed_logits`, zeros at padding) or padded as asked.

    The padded forward counts positions over attended tokens (`position_ids_from_mask`) and, where
    the model takes `logits_to_keep`, skips the output head outside the kept positions. Rows with
    several segments (`position_ids` restarting inside a row, see `pack_batch`) need packing: a
    padded row cannot keep them apart.
    """
    if packing:
        return packed_logits(model, input_ids, attention_mask, last=last, position_ids=position_ids)
    if position_ids is not None and bool((position_ids != position_ids_from_mask(attention_mask))[attention_mask.bool()].any()):
        raise ValueError("rows holding several segments (restarting position ids) need model.packing: true")
    keep = {"logits_to_keep": last} if last and keeps_logits(model) else {}
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask), use_cache=False, **keep).logits
    return logits[:, -last:] if last else logits


def packed_shape(lengths: Sequence[int], capacity: int = 0) -> tuple[int, int]:
    """(rows, width) of the packed batch `pack_batch` builds for rows of these lengths."""
    bins = first_fit_decreasing(lengths, max(capacity, max(lengths, default=0), 1))
    return len(bins), max(sum(lengths[i] for i in b) for b in bins)


def check_packing(model: nn.Module, forward: Callable[..., torch.Tensor] | None = None) -> None:
    """Stop with the reason when `model` mixes packed rows (see the module docstring).

    forward(input_ids, position_ids) -> (1, T, D) per-token outputs; default the causal LM's logits.
    Probed once per model class and attention implementation.
    """
    inner = getattr(model, "module", model)
    config = getattr(inner, "config", None)
    attention = getattr(config, "_attn_implementation", None)
    key = (type(inner), attention)
    if key not in _PROBED:
        _PROBED[key] = _probe(model, forward or (lambda ids, pos: model(input_ids=ids, position_ids=pos, use_cache=False).logits))
    if not _PROBED[key]:
        raise PackingUnsupported(
            f"model.packing: {type(inner).__name__} with attention {attention!r} does not keep packed rows apart "
            "(its outputs differ from the rows run alone); set model.packing: false"
        )


_PROBED: dict[tuple[type, str | None], bool] = {}


@torch.no_grad()
def _probe(model: nn.Module, forward: Callable[..., torch.Tensor]) -> bool:
    """Two short rows packed into one agree with each run alone (eval mode: no dropout)."""
    device = next(model.parameters()).device
    rows = [torch.tensor([[1, 2, 3]], device=device), torch.tensor([[4, 5]], device=device)]
    was_training = model.training
    model.eval()
    try:
        alone = [forward(r, torch.arange(r.shape[1], device=device)[None])[0].float() for r in rows]
        together = forward(torch.cat(rows, dim=1), torch.tensor([[0, 1, 2, 0, 1]], device=device))[0].float()
    finally:
        model.train(was_training)
    scale = max(float(a.abs().max()) for a in alone) + 1e-6
    # Rows mixed by the attention differ by a large share of the outputs' scale; bf16 rounding by ~1%.
    return bool(torch.allclose(together, torch.cat(alone), atol=2e-2 * scale, rtol=0))
