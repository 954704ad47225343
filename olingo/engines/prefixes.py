"""Prefix reuse for `HFEngine`: a multi-turn turn continues from the KV cache of the turn before.

Turn k of a multi-turn episode asks the engine to continue `[prompt | turn 1 | reply 1 | ... |
reply k-1]`, and everything up to the last sampled turn was already run through the model by the
previous `generate` call. Without reuse, every turn prefills the whole conversation again (TRL's
`environment_factory` loop does): on a 5-turn episode that is about 40% of generation time.

`HFEngine.keep_prefixes()` keeps the last call's KV cache (transformers `DynamicCache`) with the
ids and mask of its columns. The next call continues from it when every prompt row extends one
kept row's real tokens (same order, each kept row used once); its columns are then

    [kept columns: the kept row's tokens, holes (mask 0) at padding and after its stop | suffix]

where the suffix (the row's tokens the cache does not hold: the environment's reply, and the
last sampled token when the previous call stopped before feeding it) is left-padded to the
longest suffix. `generate` computes position ids as cumsum(attention_mask) - 1, so every real
token gets the position it has in the contiguous conversation, and masked columns are never
attended: the distribution sampled from is the one a full prefill gives, up to kernel rounding
(KV computed one token at a time vs in one pass: ~1e-6 in fp32).

Anything else is a full prefill, and nothing is kept:
- a row that extends no kept row (a new batch, a reordered one, an episode split by its template);
- a cache that is not a plain `DynamicCache` of `DynamicLayer`s (sliding-window or hybrid caches
  count columns, not tokens, so holes would change what a layer sees);
- attention other than `sdpa` or `eager` (both honour an arbitrary 2D mask);
- a kept cache more than twice as wide as its longest row (holes would cost more than prefill).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from olingo.engines.base import left_pad
from olingo.models.utils import honours_holes

MAX_WIDTH_OVER_LONGEST = 2.0


@dataclass
class KeptPrefixes:
    """The KV cache of an engine's last `generate` call and what its columns hold."""

    cache: Any
    """transformers `DynamicCache` over `width` columns of B rows."""
    ids: torch.Tensor
    """(B, width) long: the token id in each cached column (pad in holes)."""
    mask: torch.Tensor
    """(B, width) long: 1 where the column holds one of the row's real tokens, 0 at a hole."""
    tokens: list[list[int]]
    """B lists: each row's real tokens in order (the 1 columns of `mask`)."""


@dataclass
class Continuation:
    """`generate` inputs that continue from a kept cache."""

    input_ids: torch.Tensor
    """(B, width + S) long: kept columns | left-padded suffix."""
    attention_mask: torch.Tensor
    """(B, width + S) long, holes 0."""
    cache: Any
    """The kept cache, its rows selected to match `input_ids`."""


def can_keep(model: Any) -> bool:
    """Whether the model's attention honours holes in a row (see the module doc)."""
    return honours_holes(getattr(model, "config", None))


def match_rows(kept: list[list[int]], contexts: list[list[int]]) -> list[int] | None:
    """For each context, in order, the first unused kept row after the previous match whose
    tokens it extends by at least one token; None when some context extends none."""
    rows, j = [], 0
    for context in contexts:
        while j < len(kept) and not (len(context) > len(kept[j]) and context[: len(kept[j])] == kept[j]):
            j += 1
        if j == len(kept):
            return None
        rows.append(j)
        j += 1
    return rows


def continue_from(kept: KeptPrefixes, input_ids: torch.Tensor, attention_mask: torch.Tensor, pad_token_id: int) -> Continuation | None:
    """The inputs that continue left-padded prompts (B, P) from `kept`, or None (full prefill).
    Selects the matched rows of `kept.cache` in place: the cache is not reusable afterwards."""
    contexts = [row[mask.bool()].tolist() for row, mask in zip(input_ids.cpu(), attention_mask.cpu(), strict=True)]
    rows = match_rows(kept.tokens, contexts)
    if rows is None:
        return None
    suffix_ids, suffix_mask = left_pad([c[len(kept.tokens[j]):] for c, j in zip(contexts, rows, strict=True)], pad_token_id)
    device = kept.ids.device  # the model's, as the prompts' (`generate_continuing` moved them there)
    index = torch.tensor(rows, dtype=torch.long, device=device)
    kept.cache.batch_select_indices(index)
    return Continuation(
        input_ids=torch.cat([kept.ids[index], suffix_ids.to(device)], dim=1),
        attention_mask=torch.cat([kept.mask[index], suffix_mask.to(device)], dim=1),
        cache=kept.cache,
    )


def keep_after(cache: Any, sequences: torch.Tensor, input_mask: torch.Tensor, action_mask: torch.Tensor) -> KeptPrefixes | None:
    """What a `generate` call leaves to continue from: its cache with the ids and mask of the
    columns it covers (the last sampled column is usually not in it: generate never feeds it).

    sequences: (B, W + A) generate's output over inputs of width W; input_mask: (B, W); action_mask:
    (B, A) the response tokens up to each row's stop. None where the cache is not reusable."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    if type(cache) is not DynamicCache or not all(type(layer) is DynamicLayer for layer in cache.layers):
        return None
    width = cache.get_seq_length()
    mask = torch.cat([input_mask.long(), action_mask.long().to(input_mask.device)], dim=1)[:, :width]
    ids = sequences[:, :width]
    tokens = [row[m.bool()].tolist() for row, m in zip(ids.cpu(), mask.cpu(), strict=True)]
    if width > MAX_WIDTH_OVER_LONGEST * max(len(t) for t in tokens):
        return None
    return KeptPrefixes(cache=cache, ids=ids, mask=mask, tokens=tokens)
