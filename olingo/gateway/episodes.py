"""An agent episode's requests turned into one training row, token for token.

Every request's prompt ids, sampled ids and log-probs are recorded. A request whose prompt ids
extend the episode's context (the previous prompt and the ids sampled for it) token for token adds
only the new ids, with action mask 0, then its sampled ids, with action mask 1: the row stays one
sequence. A request that does not extend it (an agent that rewrote, truncated or forked its
history, or sent two requests at once) starts a new segment of the same row: its whole prompt
(mask 0) and its sampled ids, with position ids restarting at 0, so a packed forward scores each
sampled token in exactly the context the engine sampled it from (`Episode.segments`, as a
template split in docs/agents.md). Without packed forwards (`split_rows=False`) such a request is
still answered, but neither it nor any later request of the episode is trained on
(`untrained_requests`). Both are counted.

The row's prompt is the first request's prompt; the response part is everything after it.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

import torch

from olingo.engines import Rollout
from olingo.engines.base import left_pad
from olingo.gateway.protocol import RequestError
from olingo.rollout.multi_turn import Episode, segment_positions
from olingo.rollout.source import PromptBatch, SampledBatch

FAILURES = {
    "error": "agent_errors", "timeout": "agent_timeouts", "no_requests": "agent_silent", "bad_request": "agent_bad_requests", "bad_return": "agent_bad_returns",
}
"""Why an episode is dropped from the batch, and the metric counting it (rollout/<metric>)."""


@dataclass
class EpisodeState:
    """One agent episode while it runs: its key, its task, its row so far, and what went wrong."""

    index: int
    """Its row in the batch (prompt-major)."""
    task: dict[str, Any]
    key: str = field(default_factory=lambda: f"olingo-ep-{secrets.token_urlsafe(24)}")
    trace: Episode = field(default_factory=lambda: Episode(row=0, env=None, prompt=[]))
    tip_messages: list[dict] | None = None
    """The last chat request's messages and the assistant message answered to it."""
    tip_tools: list[dict] | None = None
    tip_text: str | None = None
    """The last text request's prompt and its completion."""
    tip_ids: list[int] | None = None
    """The last request's prompt ids and its sampled ids."""
    in_flight: int = 0
    recording: bool = True
    """False once a request could not be recorded without packing: nothing later is trained."""
    request_ends: dict[str, int] = field(default_factory=dict)
    """Request id -> trajectory index of its last sampled token (where its reward is placed)."""
    requests: int = 0
    splits: int = 0
    untrained: int = 0
    bad_requests: int = 0
    budget_refusals: int = 0
    context_refusals: int = 0
    failure: str | None = None
    """None, or one of FAILURES."""
    error: str = ""
    error_class: str = ""
    """What failed, for the log: the exception's class, `returned str`, `HTTP 400`."""
    origin: str = ""
    """Where the agent's exception was raised (' (at agent.py:12, in run)'), for the log."""
    reward: float = 0.0
    request_rewards: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    finished: bool = False

    def fail(self, reason: str, error: str = "", error_class: str = "", origin: str = "") -> None:
        if self.failure is None:
            self.failure, self.error, self.error_class, self.origin = reason, error, error_class, origin


class Recorder:
    """Prompt ids for the next request of an episode, and the request's record in its row."""

    def __init__(self, max_episode_tokens: int, split_rows: bool) -> None:
        self.max_episode_tokens, self.split_rows = max_episode_tokens, split_rows

    def room(self, state: EpisodeState, prompt_ids: list[int]) -> int | None:
        """Sampled tokens the request may add to the row within the episode's budget (None: not
        recorded, no budget applies). A `RequestError` (400) where nothing fits."""
        trace = state.trace
        if not state.recording:
            return None
        if not trace.prompt:
            return self.max_episode_tokens
        context = trace.context()
        extends = _extends(prompt_ids, context)
        if not extends and not self.split_rows:
            return None
        growth = len(prompt_ids) - len(context) if extends else len(prompt_ids)
        room = self.max_episode_tokens - len(trace.tokens) - growth
        if room < 1:
            state.budget_refusals += 1
            trace.truncated = True
            raise RequestError(400, f"this episode's token budget ({self.max_episode_tokens}, agent.max_episode_tokens) is spent", "context_length_exceeded")
        return room

    def record(self, state: EpisodeState, request_id: str, prompt_ids: list[int], sampled: list[int], log_probs: list[float], stopped: bool) -> None:
        """Add the request to the episode's row (module docstring)."""
        trace, state.requests = state.trace, state.requests + 1
        state.tip_ids = prompt_ids + sampled
        if not state.recording:
            state.untrained += 1
            return
        context = trace.context() if trace.prompt else None
        if context is None:
            trace.prompt = list(prompt_ids)
        elif _extends(prompt_ids, context):
            trace.add(prompt_ids[len(context):], sampled=False)
        elif self.split_rows:
            state.splits += 1
            trace.segments.append(len(trace.tokens))
            trace.add(list(prompt_ids), sampled=False)
        else:
            state.splits, state.untrained, state.recording = state.splits + 1, state.untrained + 1, False
            return
        trace.add(sampled, sampled=True, log_probs=log_probs)
        trace.turns += 1
        trace.truncated = not stopped
        state.request_ends[request_id] = len(trace.tokens) - 1


def _extends(prompt_ids: list[int], context: list[int]) -> bool:
    return len(prompt_ids) >= len(context) and prompt_ids[: len(context)] == context


def assemble(states: list[EpisodeState], prompts: PromptBatch, pad_token_id: int, reward_weight: float) -> SampledBatch:
    """The episodes in the shared row layout (prompt: the first request's; an episode that made
    none keeps its task's prompt and an empty response), with the agents' rewards and the failed
    episodes marked `dropped` (the experience makers drop them with their groups)."""
    device = prompts.input_ids.device
    mask = prompts.attention_mask.bool()
    traces = [s.trace for s in states]
    for k, trace in enumerate(traces):
        if not trace.prompt:
            trace.prompt = prompts.input_ids[k][mask[k]].tolist()
    prompt_ids, prompt_mask = left_pad([t.prompt for t in traces], pad_token_id)
    width = max(1, max(len(t.tokens) for t in traces))
    rows = torch.full((len(states), width), pad_token_id, dtype=torch.long)
    real = torch.zeros(len(states), width, dtype=torch.long)
    action_mask = torch.zeros(len(states), width, dtype=torch.bool)
    log_probs = torch.zeros(len(states), width)
    turn_rewards = torch.zeros(len(states), width)
    for k, (state, trace) in enumerate(zip(states, traces, strict=True)):
        length = len(trace.tokens)
        rows[k, :length], real[k, :length] = torch.tensor(trace.tokens, dtype=torch.long), 1
        action_mask[k, :length], log_probs[k, :length] = torch.tensor(trace.sampled, dtype=torch.bool), torch.tensor(trace.log_probs)
        if state.failure is None and length:
            for request_id, reward in state.request_rewards.items():
                turn_rewards[k, state.request_ends[request_id]] += reward
            turn_rewards[k, max(state.request_ends.values(), default=length - 1)] += state.reward  # the last sampled token
    positions = segment_positions(prompt_mask, traces, width) if any(t.segments for t in traces) else None
    rollout = Rollout(
        sequences=torch.cat([prompt_ids, rows], dim=1).to(device), attention_mask=torch.cat([prompt_mask, real], dim=1).to(device),
        action_mask=action_mask.to(device), truncated=torch.tensor([t.truncated for t in traces], device=device), num_prompt_tokens=prompt_ids.shape[1],
        log_probs=log_probs.to(device), finish_reasons=["length" if t.truncated else "stop" for t in traces],
        position_ids=positions.to(device) if positions is not None else None,
    )
    rows_prompts = PromptBatch(prompt_ids.to(device), prompt_mask.to(device), prompts.gt_answers, prompts.row_fields, prompts.messages)
    turn_rewards = reward_weight * turn_rewards.to(device)
    dropped = torch.tensor([s.failure is not None for s in states], dtype=torch.bool, device=device)
    return SampledBatch(rollout, rows_prompts, env_rewards=turn_rewards.sum(-1), turn_rewards=turn_rewards, reward_term="agent", dropped=dropped)


def episode_metrics(states: list[EpisodeState], seconds: dict[str, float]) -> dict[str, float]:
    """Per-batch metrics: means per episode, counts of each failure and of the row's events, and
    the agents' own numeric metrics (means over the episodes that returned them)."""
    count = len(states)
    sampled = sum(sum(s.trace.sampled) for s in states)
    info = {
        "requests_per_episode": sum(s.requests for s in states) / count,
        "sampled_tokens_per_episode": sampled / count,
        "context_tokens_per_episode": (sum(len(s.trace.tokens) for s in states) - sampled) / count,
        "agent_reward": sum(s.reward + sum(s.request_rewards.values()) for s in states if s.failure is None) / max(1, sum(s.failure is None for s in states)),
        "failed_episodes": float(sum(s.failure is not None for s in states)),
        "history_rewrites": float(sum(s.splits for s in states)),
        "untrained_requests": float(sum(s.untrained for s in states)),
        "bad_requests": float(sum(s.bad_requests for s in states)),
        "budget_refusals": float(sum(s.budget_refusals for s in states)),
        "context_refusals": float(sum(s.context_refusals for s in states)),
        "truncated_episodes": float(sum(s.trace.truncated for s in states)),
        **{metric: float(sum(s.failure == reason for s in states)) for reason, metric in FAILURES.items()},
        **seconds,
    }
    names = sorted({name for s in states for name in s.metrics})
    for name in names:
        values = [s.metrics[name] for s in states if name in s.metrics]
        info[f"agent/{name}"] = sum(values) / len(values)
    return info
