"""A preference pair's shared opening, run once: the prompt of a chosen and a rejected row.

A reward model scores the chosen and the rejected row of a pair, and both start with the same
tokens (the prompt, and the chat template's assistant header). In a causal model those tokens'
keys and values do not depend on what follows, so the forward can run them once per pair:

    1. the B pairs' shared openings, left-padded: (B, P), with the KV cache kept (and its gradient);
    2. the cache, each row taken twice (chosen rows, then rejected rows: the batch's own order);
    3. the 2B rows' own tokens, right-padded: (2B, S), attending to the cache and to themselves,
       positions continuing from each opening's length.

Each token sees the same tokens at the same positions as in the row's full forward, so scores and
gradients are equal up to float rounding (the same sums in another order: a relative ~1e-7,
`tests/test_pair_prefix.py`). The work drops from 2B rows of L tokens to B x P + 2B x S token slots:
on pairs whose prompt is half their length, a quarter less (`bench/README.md`, RM).

The opening of a pair is its rows' longest common run of attended tokens, capped so each row keeps
at least one token of its own (its score is read there). `share_pairs` says where it pays and where
it is exact: attention that honours a padded 2D mask (`sdpa`, `eager`), a model without
sliding-window layers (a window counts columns, and the left padding of step 1 would shift it),
no gradient checkpointing (transformers turns the cache off there), and fewer token slots than the
forward it replaces (packed: the attended tokens; padded: 2B x L) by at least `MIN_SAVING`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from olingo.dataset.collator import length_mask, pad_rows
from olingo.models.utils import honours_holes

MIN_SAVING = 0.1  # share only when it saves at least a tenth of the token slots


@dataclass
class PairLayout:
    """The two forwards of a batch of B pairs (rows i and B + i of the (2B, L) input)."""

    opening_ids: torch.Tensor
    """(B, P) long: each pair's shared opening, left-padded."""
    opening_mask: torch.Tensor
    """(B, P) long."""
    own_ids: torch.Tensor
    """(2B, S) long: each row's tokens after its pair's opening, right-padded, in the input's row order."""
    own_mask: torch.Tensor
    """(2B, S) long."""
    own_positions: torch.Tensor
    """(2B, S) long: opening length + 0, 1, ... (padding continues the count; it is never attended)."""


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share, capped at min(len) - 1 (each keeps one of its own)."""
    limit, n = min(len(a), len(b)) - 1, 0
    while n < limit and a[n] == b[n]:
        n += 1
    return max(n, 0)


def pair_layout(input_ids: torch.Tensor, attention_mask: torch.Tensor, pad_token_id: int) -> PairLayout:
    """Split (2B, L) rows, row i paired with row B + i, into shared openings and own tokens."""
    rows = [ids[m.bool()].tolist() for ids, m in zip(input_ids.cpu(), attention_mask.cpu(), strict=True)]
    half = len(rows) // 2
    opening = [common_prefix_length(rows[i], rows[half + i]) for i in range(half)]
    openings = [rows[i][: opening[i]] for i in range(half)]
    own = [row[opening[i % half]:] for i, row in enumerate(rows)]
    shared, width = max(opening), max(len(r) for r in own)
    opening_ids, opening_mask = pad_rows(openings, shared, pad_token_id, "left"), length_mask(opening, shared, "left")
    own_ids, own_mask = pad_rows(own, width, pad_token_id), length_mask([len(r) for r in own], width)
    starts = torch.tensor(opening, dtype=torch.long).repeat(2)
    device = input_ids.device
    return PairLayout(
        opening_ids=opening_ids.to(device), opening_mask=opening_mask.to(device), own_ids=own_ids.to(device),
        own_mask=own_mask.to(device), own_positions=(starts[:, None] + torch.arange(width)).to(device),
    )


def can_share(model_config, gradient_checkpointing: bool) -> bool:
    """Whether the model's forward over a kept cache is the full forward's (module doc)."""
    if gradient_checkpointing or not honours_holes(model_config):
        return False
    if getattr(model_config, "sliding_window", None) is not None and getattr(model_config, "use_sliding_window", True):
        return False
    return all(kind == "full_attention" for kind in getattr(model_config, "layer_types", None) or ["full_attention"])


def worth_sharing(layout: PairLayout, attention_mask: torch.Tensor, packing: bool) -> bool:
    """Whether the shared layout fills fewer token slots than the forward it replaces, by MIN_SAVING."""
    shared = layout.opening_ids.numel() + layout.own_ids.numel()
    plain = int(attention_mask.sum()) if packing else attention_mask.numel()
    return layout.opening_ids.shape[1] > 0 and shared <= (1 - MIN_SAVING) * plain
