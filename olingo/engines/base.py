"""The rollout-engine interface: prompts in, responses in the shared sequence layout out.

Every generation backend (transformers `generate` today; vLLM next) implements `RolloutEngine`:

    generate(input_ids, attention_mask, settings, n=1) -> Rollout
        input_ids, attention_mask: (B, P) left-padded prompt token ids. Returns B * n rows,
        prompt-major (row i * n + k is sample k of prompt i), laid out as docs/engines.md says:
        `sequences = [left-padded prompt | response, right-padded]`, an action mask over the
        response up to and including its stop token, each row's finish reason ("stop" or
        "length"), and optionally the per-token log-probs of the sampled tokens.
    update_weights(named_tensors) -> int
        Load new policy weights (name -> tensor, the names of the policy's state dict), strictly:
        a key the engine's model lacks, or a full update that misses one, is an error. Returns
        the number of tensors loaded.
    sleep(), wake()
        Free the engine's accelerator memory while the trainer trains, and take it back before
        the next sync or rollout; no-ops where `can_sleep` is False.
    close()
        Free what the engine holds (processes, accelerator memory).

and the attributes

    shares_weights
        True when the engine generates from the trained module itself (`HFEngine`): nothing to
        sync. False when it holds its own copy (`VLLMEngine`): the trainer streams the policy in
        after each update (`olingo.engines.sync.sync_engine`).
    can_sleep
        Whether `sleep` frees anything.

and optionally

    keep_prefixes()
        A context manager: inside it, a `generate` call whose prompts extend the previous call's
        rows continues from that call's KV cache instead of prefilling them again (`HFEngine`;
        olingo/engines/prefixes.py). A multi-turn source runs its turns inside it
        (`keeping_prefixes`).

A trainer never calls `generate` on a model; it asks its engine. `tests/test_engines.py` holds
every engine to the layout contract.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

import torch

from olingo.dataset.collator import length_mask, pad_rows
from olingo.engines.settings import GenerationSettings, Rollout


@runtime_checkable
class RolloutEngine(Protocol):
    """What the experience makers and evaluation need from a generation backend."""

    shares_weights: bool
    """True: generates from the trained module itself; False: holds a copy to sync."""

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, settings: GenerationSettings, n: int = 1) -> Rollout:
        """B left-padded prompts -> B * n responses in the shared layout (see the module doc)."""
        ...

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, full: bool = True) -> int:
        """Load policy weights by name, strictly; `full=False` allows a subset of the keys."""
        ...

    def sleep(self) -> None:
        """Free accelerator memory until `wake`; a no-op where `can_sleep` is False."""
        ...

    def wake(self) -> None:
        """Take back what `sleep` freed; a no-op when not asleep."""
        ...

    def close(self) -> None:
        """Release the engine's resources; it is not used afterwards."""
        ...


@runtime_checkable
class ScoringEngine(Protocol):
    """An engine that scores given token ids instead of sampling them (`VLLMEngine.score`): what
    a teacher of on-policy distillation served on its own engine provides (`model.teacher_engine`)."""

    def score(self, sequences: torch.Tensor, attention_mask: torch.Tensor, num_actions: int, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """log p(token | the row's tokens before it) at temperature 1 for the last `num_actions`
        columns of rollout rows in the shared layout: (B, num_actions) float, 0 at padding and at
        the first token of a segment (`position_ids` restart at 0 there)."""
        ...

    def close(self) -> None:
        """Release the engine's resources."""
        ...


def repeat_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each prompt row `n` times in a row (prompt-major order), for `n` samples per prompt."""
    if n < 1:
        raise ValueError(f"n (samples per prompt) must be >= 1, got {n}")
    if n == 1:
        return input_ids, attention_mask
    return input_ids.repeat_interleave(n, dim=0), attention_mask.repeat_interleave(n, dim=0)


def left_pad(rows: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (ids, attention_mask), both (len(rows), longest) long, padded on the left."""
    width = max(len(r) for r in rows)
    return pad_rows(rows, width, pad_token_id, "left"), length_mask([len(r) for r in rows], width, "left")


def keeping_prefixes(engine: Any) -> contextlib.AbstractContextManager:
    """`engine.keep_prefixes()` where the engine offers it (`HFEngine`: consecutive calls in the
    block continue from the previous call's KV cache), else a block that changes nothing (vLLM
    caches prefixes itself)."""
    keep = getattr(engine, "keep_prefixes", None)
    return keep() if callable(keep) else contextlib.nullcontext()
