"""The types every rollout engine shares: how to sample (`GenerationSettings`) and what comes back
(`Rollout`, the sequence layout of docs/engines.md), plus the one rule for where a response ends.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from olingo.config_errors import did_you_mean
from olingo.dataset.chat_tokens import turn_stop_ids


@dataclass
class GenerationSettings:
    """How rollouts are sampled. Values are checked on construction."""

    max_new_tokens: int = 64
    """Most response tokens per prompt (A <= max_new_tokens)."""
    do_sample: bool = True
    """Sample from the policy; False decodes greedily."""
    temperature: float = 1.0
    """Softmax temperature when sampling (> 0)."""
    top_k: int = 0
    """Keep the k most likely tokens when sampling; 0 = off."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]; 1.0 = off."""
    stop_token_ids: list[int] | None = None
    """Token ids that end a response (included in it); None -> [tokenizer.eos_token_id];
    [] -> no stop token: every response runs to max_new_tokens (unless a stop string ends it)."""
    stop_strings: list[str] | None = None
    """Strings that end a response at the token completing them (included in it)."""

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int):
            raise TypeError(f"max_new_tokens must be an int, got {self.max_new_tokens!r}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (1.0 = off), got {self.top_p}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if self.stop_token_ids is not None:
            self.stop_token_ids = _check_list(self.stop_token_ids, int, "stop_token_ids", allow_empty=True)
        if self.stop_strings is not None:
            self.stop_strings = _check_list(self.stop_strings, str, "stop_strings")
            if not all(self.stop_strings):
                raise ValueError("stop_strings must not contain the empty string")

    @property
    def log_prob_temperature(self) -> float:
        """The temperature log-probs of the sampled tokens are taken at: the sampling one, or 1
        for greedy decoding (no distribution was sampled from)."""
        return self.temperature if self.do_sample else 1.0

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> GenerationSettings:
        """Settings from keyword arguments; an unknown key is a TypeError with a did-you-mean."""
        known = [field.name for field in dataclasses.fields(cls)]
        for key in kwargs:
            if key not in known:
                raise TypeError(
                    f"unknown generation setting '{key}'{did_you_mean(key, known)}; "
                    f"known settings: {', '.join(known)}"
                )
        return cls(**kwargs)


def _check_list(values: Any, kind: type, name: str, allow_empty: bool = False) -> list:
    """`values` as a list of `kind` (non-empty unless `allow_empty`); a bare string or int is
    refused, not split."""
    if isinstance(values, (str, int)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a list of {kind.__name__}, got {values!r}")
    values = list(values)
    if not values and not allow_empty:
        raise ValueError(f"{name} must not be empty; leave it None for the default")
    if not all(isinstance(v, kind) and not isinstance(v, bool) for v in values):
        raise TypeError(f"{name} must be a list of {kind.__name__}, got {values!r}")
    return values


@dataclass
class Rollout:
    """One batch of generated responses in the shared sequence layout (docs/engines.md)."""

    sequences: torch.Tensor
    """(B, P + A) long: [left-padded prompt | response, right-padded with the pad id]."""
    attention_mask: torch.Tensor
    """(B, P + A) long: prompt attention mask | action mask."""
    action_mask: torch.Tensor
    """(B, A) bool: response tokens up to and including the stop token, nothing after."""
    truncated: torch.Tensor
    """(B,) bool: the response used all A columns without a stop token or stop string."""
    num_prompt_tokens: int
    """P, the width of the left-padded prompt block."""
    log_probs: torch.Tensor | None = None
    """(B, A) float: log-probs of the sampled tokens under the sampling distribution, as the
    engine computed them while sampling (`HFEngine(with_log_probs=True)`); else None."""
    finish_reasons: list[str] = dataclasses.field(default_factory=list)
    """B entries: "stop" (a stop token or string ended the response) or "length" (it ran to
    max_new_tokens; `truncated` when a stop was expected)."""
    position_ids: torch.Tensor | None = None
    """(B, P + A) long, only for rows holding several segments (a multi-turn episode continued in
    a new segment where its chat template is not append-only: positions restart at 0 there, and
    a packed forward keeps the segments apart); None: positions count attended tokens."""

    @property
    def num_actions(self) -> int:
        """A, the width of the response block."""
        return self.action_mask.shape[1]



def concat_rollouts(rollouts: Sequence[Rollout], pad_token_id: int) -> Rollout:
    """Rollouts of prompts padded to the same width P, one after the other: (sum B, P + max A).

    Engines are called on bounded chunks of a batch (`inference_batch_size`); each chunk's
    responses are as wide as its own longest, so shorter ones are right-padded here (pad id in
    `sequences`, 0/False in the masks, 0 in `log_probs`), which keeps that layout.
    """
    if not rollouts:
        raise ValueError("concat_rollouts needs at least one rollout")
    if len(rollouts) == 1:
        return rollouts[0]
    if any(r.position_ids is not None for r in rollouts):
        raise ValueError("concat_rollouts: rows with segments (position_ids) come from one multi-turn batch and are not concatenated")
    prompt_width = rollouts[0].num_prompt_tokens
    if any(r.num_prompt_tokens != prompt_width for r in rollouts):
        raise ValueError("concat_rollouts: rollouts of prompts padded to different widths")
    width = max(r.num_actions for r in rollouts)

    def widen(x: torch.Tensor, extra: int, value: Any) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, extra), value=value) if extra else x

    parts: dict[str, list[torch.Tensor]] = {"sequences": [], "attention_mask": [], "action_mask": [], "log_probs": []}
    for r in rollouts:
        extra = width - r.num_actions
        parts["sequences"].append(widen(r.sequences, extra, pad_token_id))
        parts["attention_mask"].append(widen(r.attention_mask, extra, 0))
        parts["action_mask"].append(widen(r.action_mask, extra, False))
        if r.log_probs is not None:
            parts["log_probs"].append(widen(r.log_probs, extra, 0.0))
    has_log_probs = all(r.log_probs is not None for r in rollouts)
    return Rollout(
        sequences=torch.cat(parts["sequences"]), attention_mask=torch.cat(parts["attention_mask"]),
        action_mask=torch.cat(parts["action_mask"]), truncated=torch.cat([r.truncated for r in rollouts]),
        num_prompt_tokens=prompt_width, log_probs=torch.cat(parts["log_probs"]) if has_log_probs else None,
        finish_reasons=[reason for r in rollouts for reason in r.finish_reasons],
    )

def resolve_stop_token_ids(settings: GenerationSettings, tokenizer: Any) -> list[int]:
    """The stop ids: `settings.stop_token_ids`, or the tokenizer's eos id and its chat
    template's end-of-turn token (`olingo.dataset.chat_tokens.turn_stop_ids`)."""
    if settings.stop_token_ids is not None:
        return list(settings.stop_token_ids)
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no eos token; set GenerationSettings.stop_token_ids")
    return turn_stop_ids(tokenizer)


def rollout_from_responses(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, responses: torch.Tensor, tokenizer: Any,
    settings: GenerationSettings, log_probs: torch.Tensor | None = None,
) -> Rollout:
    """Lay generated responses out as the shared `Rollout`: the one place every engine ends.

    input_ids, attention_mask: (B, P) left-padded prompts; responses: (B, A) token ids as the
    backend produced them (anything after a stop is overwritten with pad); log_probs: (B, A)
    of the sampled tokens, or None. Where each response ends follows `action_mask_from_responses`.
    """
    stop_ids = resolve_stop_token_ids(settings, tokenizer)
    action_mask, truncated = action_mask_from_responses(responses, stop_ids, settings.stop_strings, tokenizer)
    responses = responses.masked_fill(~action_mask, tokenizer.pad_token_id)
    stops = bool(stop_ids or settings.stop_strings)
    return Rollout(
        sequences=torch.cat([input_ids, responses], dim=1),
        attention_mask=torch.cat([attention_mask.long(), action_mask.long()], dim=1),
        action_mask=action_mask,
        truncated=truncated,
        num_prompt_tokens=input_ids.shape[1],
        log_probs=log_probs,
        finish_reasons=["stop" if stops and not cut else "length" for cut in truncated.tolist()],
    )


def action_mask_from_responses(
    responses: torch.Tensor,
    stop_token_ids: Sequence[int],
    stop_strings: Sequence[str] | None = None,
    tokenizer: Any = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Where each response ends: (action_mask (B, A) bool, truncated (B,) bool).

    responses: (B, A) token ids. A row ends at its first stop token id (inclusive). With
    stop strings, a row whose stop id does not come first ends at the first token k such that
    `tokenizer.decode(row[:k+1], skip_special_tokens=False)` contains a stop string
    (inclusive). A row with neither is truncated and its mask covers all A columns; with no stop
    ids and no stop strings every row simply runs to A columns, and none counts as truncated.
    """
    batch, width = responses.shape
    if not stop_token_ids and not stop_strings:
        return torch.ones_like(responses, dtype=torch.bool), torch.zeros(batch, dtype=torch.bool, device=responses.device)
    is_stop = torch.isin(responses, torch.as_tensor(list(stop_token_ids), dtype=responses.dtype, device=responses.device))
    # argmax returns the first maximal index, i.e. the first stop column.
    ends = torch.where(is_stop.any(dim=1), is_stop.int().argmax(dim=1), width)
    if stop_strings:
        if tokenizer is None:
            raise ValueError("stop_strings need a tokenizer to decode the responses")
        rows = responses.tolist()
        string_ends = [
            _first_stop_string_end(row[:end], stop_strings, tokenizer)
            for row, end in zip(rows, ends.tolist(), strict=True)
        ]
        found = [end if end is not None else width for end in string_ends]
        ends = torch.minimum(ends, torch.tensor(found, device=responses.device))
    columns = torch.arange(width, device=responses.device).expand(batch, width)
    action_mask = columns <= ends.unsqueeze(1)
    return action_mask, ends == width


def _first_stop_string_end(
    ids: list[int], stop_strings: Sequence[str], tokenizer: Any
) -> int | None:
    """The first k whose decoded prefix ids[:k+1] contains a stop string, or None.

    Binary search: log2(A) decodes per row instead of A. It relies on a longer prefix
    decoding to a text that extends the shorter one, which holds for ordinary tokenizers.
    """

    def contains_stop(k: int) -> bool:
        text = tokenizer.decode(ids[: k + 1], skip_special_tokens=False)
        return any(stop in text for stop in stop_strings)

    if not ids or not contains_stop(len(ids) - 1):
        return None
    low, high = 0, len(ids) - 1
    while low < high:
        middle = (low + high) // 2
        if contains_stop(middle):
            high = middle
        else:
            low = middle + 1
    return low
