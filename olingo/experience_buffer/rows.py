"""`PaddedRows`: every rollout of a buffer in one padded batch, and minibatches cut from it.

A minibatch is exactly what `make_experience_batch` gives for the same rows split into
`BufferItem`s: prompts left-padded and responses right-padded, both trimmed to the minibatch's
own longest, the pad id in `sequences`, 0 in the masks and in every per-token field outside
the response. Here that padding is written once per buffer (`merge_batches`), and a minibatch
is one `index_select` per field, instead of a split into items and a row-by-row re-pad.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from olingo.experience_maker.experience import (
    PER_TOKEN,
    Experience,
    make_experience_batch,
    split_experience_batch,
)

MIXED_FIELDS = (
    "make_experience_batch: items with different per-token fields (with and without critic values, "
    "reference or old log-probs) cannot share a batch"
)


@dataclass
class PaddedRows:
    """N rollouts in one batch with canonical padding (see the module docstring).

    Attributes:
        batch: (N, P + A) `Experience`: P the widest prompt, A the longest response of all rows.
        prompt_lengths, response_lengths: N ints, each row's real prompt and response tokens.
        versions: N ints, the `policy_version` of the batch each row came from.
    """

    batch: Experience
    prompt_lengths: list[int]
    response_lengths: list[int]
    versions: list[int]

    def __len__(self) -> int:
        return len(self.versions)

    def select(self, indices: Sequence[int]) -> Experience:
        """Rows `indices`, in that order, as `make_experience_batch` of their items would be:
        columns trimmed to their longest prompt and response, `policy_version` the oldest."""
        if not indices:
            raise ValueError("make_experience_batch needs at least one item")
        batch, width = self.batch, self.batch.num_prompt_tokens
        p = max(self.prompt_lengths[i] for i in indices)
        a = max(self.response_lengths[i] for i in indices)
        index = torch.as_tensor(indices, dtype=torch.long, device=batch.sequences.device)

        def rows(t: torch.Tensor | None, start: int | None = None, stop: int | None = None) -> torch.Tensor | None:
            # Columns first: index_select then copies only the kept ones, into a contiguous tensor.
            return None if t is None else (t if start is None else t[:, start:stop]).index_select(0, index)

        return Experience(
            sequences=rows(batch.sequences, width - p, width + a),
            attention_mask=rows(batch.attention_mask, width - p, width + a),
            action_mask=rows(batch.action_mask, 0, a),
            score=rows(batch.score), raw_score=rows(batch.raw_score), truncated=rows(batch.truncated),
            policy_version=min(self.versions[i] for i in indices),
            position_ids=rows(batch.position_ids, width - p, width + a),
            **{name: rows(getattr(batch, name), 0, a) for name in PER_TOKEN},
        )


def merge_batches(batches: Sequence[Experience], pad_token_id: int, limit: int = 0) -> PaddedRows:
    """The rows of `batches`, in order (the newest `limit` of them when limit > 0), as one
    `PaddedRows`. Every batch must carry the same per-token fields (with or without a critic,
    a reference, old log-probs), as rows sharing a minibatch must."""
    if not batches:
        raise ValueError("merge_batches needs at least one batch")
    if any(b.per_token_fields != batches[0].per_token_fields for b in batches):
        raise ValueError(MIXED_FIELDS)
    batches = [_contiguous_prompts(b, pad_token_id) for b in batches]
    width = max(b.num_prompt_tokens for b in batches)
    actions = max(b.num_actions for b in batches)
    prompt_lengths = _cat([b.attention_mask[:, : b.num_prompt_tokens].bool().sum(-1) for b in batches])
    response_lengths = _cat([_sampled_span(b.action_mask) for b in batches])
    sampled = _cat([_widen(b.action_mask, 0, actions - b.num_actions, False) for b in batches])
    sequences = _cat([_widen(b.sequences, width - b.num_prompt_tokens, actions - b.num_actions, pad_token_id) for b in batches])
    per_token = {name: _cat([_widen(getattr(b, name), 0, actions - b.num_actions, 0) for b in batches]) for name in batches[0].per_token_fields}
    keep = slice(-limit if 0 < limit < sequences.shape[0] else None, None)
    prompt_lengths, response_lengths = prompt_lengths[keep], response_lengths[keep]
    attention = _span_mask(width - prompt_lengths, width + response_lengths, width + actions)
    # Inside each response only the tokens the policy sampled are actions: a multi-turn
    # episode's environment tokens stay attended (context) and never become trained tokens.
    action = _span_mask(torch.zeros_like(response_lengths), response_lengths, actions) & sampled[keep]
    merged = Experience(
        sequences=torch.where(attention, sequences[keep], pad_token_id),
        attention_mask=attention.long(),
        action_mask=action,
        score=_cat([b.score for b in batches])[keep],
        raw_score=_cat([b.raw_score for b in batches])[keep],
        truncated=_cat([b.truncated for b in batches])[keep],
        position_ids=_merged_positions(batches, width, actions, keep, attention),
        **{name: torch.where(action, values[keep], values.new_zeros(())) for name, values in per_token.items()},
        **{name: None for name in PER_TOKEN if name not in per_token},
    )
    versions = [b.policy_version for b in batches for _ in range(b.batch_size)][keep]
    return PaddedRows(merged, prompt_lengths.tolist(), response_lengths.tolist(), versions)


def _merged_positions(batches: Sequence[Experience], width: int, actions: int, keep: slice, attention: torch.Tensor) -> torch.Tensor | None:
    """The rows' position ids in the merged layout, when any batch holds rows of several segments
    (a batch without counts its attended tokens); 0 on padding. None when no batch has them."""
    if all(b.position_ids is None for b in batches):
        return None
    parts = []
    for b in batches:
        positions = b.position_ids if b.position_ids is not None else (b.attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        parts.append(_widen(positions, width - b.num_prompt_tokens, actions - b.num_actions, 0))
    return torch.where(attention, _cat(parts)[keep], 0)


def _sampled_span(action_mask: torch.Tensor) -> torch.Tensor:
    """(N, A) bool -> (N,) long: one past each row's last sampled token (its response length)."""
    columns = torch.arange(1, action_mask.shape[1] + 1, device=action_mask.device)
    return (action_mask * columns).amax(-1)


def _cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat, without the copy when there is one tensor (one collect step per episode)."""
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)


def _widen(t: torch.Tensor, left: int, right: int, value: int) -> torch.Tensor:
    """(N, W) -> (N, left + W + right), `value` in the new columns (the values there are
    overwritten by the canonical padding anyway)."""
    return F.pad(t, (left, right), value=value) if left or right else t


def _span_mask(start: torch.Tensor, stop: torch.Tensor, width: int) -> torch.Tensor:
    """(N, width) bool: True in columns start[i] <= j < stop[i]."""
    columns = torch.arange(width, device=start.device)
    return (columns >= start.unsqueeze(-1)) & (columns < stop.unsqueeze(-1))


def _contiguous_prompts(batch: Experience, pad_token_id: int) -> Experience:
    """`batch` itself when every prompt is the suffix of its prompt block (left padding), as
    prompts are; else the batch its items re-pad to, which keeps only the attended prompt
    tokens, exactly as splitting into items does."""
    width = batch.num_prompt_tokens
    mask = batch.attention_mask[:, :width].bool()
    suffix = _span_mask(width - mask.sum(-1), torch.full_like(mask[:, 0], width, dtype=torch.long), width)
    if bool((suffix == mask).all()):
        return batch
    return make_experience_batch(split_experience_batch(batch), pad_token_id)
