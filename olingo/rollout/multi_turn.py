"""`MultiTurnSource`: episodes of several assistant turns against an `Environment`, trained on
exactly the tokens the engine sampled.

Each of the N = B x n episodes (prompt-major) starts from its row's prompt and a fresh
environment. Every turn is one batched `engine.generate` over the episodes still running; each
sampled turn is appended as the engine returned it (action mask 1), the environment's reply is
appended as the tokens its chat-template delta renders to (action mask 0), and the episode goes
on until the environment says done or a limit ends it:

    sequences  [left-padded prompt | sampled turn 1, env reply 1, sampled turn 2, ... | pad]
    attention  [prompt mask        | 1 on every sampled and environment token          | 0  ]
    action     [                   | 1 on sampled tokens, 0 on environment tokens      | 0  ]

The delta rule: the conversation is never rendered again. The environment's messages are
rendered after a fixed stand-in conversation [user, assistant], and the delta is the text the
template adds to it (the messages and the next assistant header), preceded by whatever the
template writes after the end-of-turn token that closed the sampled turn (ChatML's newline).
That needs a template that renders the stand-in conversation as a prefix of the longer one.

Where it does not (Qwen3's template drops an earlier turn's empty think block once a user turn
follows), the episode is split (`template_splits`): the template renders the whole conversation
again from its messages (the row's prompt messages, each sampled turn as decoded text, the
replies) with the generation prompt, and the episode goes on from that context, in a new segment
of the same row. The segment's tokens carry no loss (action mask 0) and its positions restart at
0 (`Rollout.position_ids`), so a packed forward keeps it apart from the earlier segment: each
sampled turn is scored in exactly the context the engine sampled it from. Without packing
(`split_rows=False`) or without the prompt's messages, a split ends the episode instead.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from jinja2 import TemplateError

from olingo.dataset.chat_tokens import encode_chat, require_chat_template
from olingo.engines import GenerationSettings, Rollout, RolloutEngine
from olingo.engines.base import keeping_prefixes, left_pad
from olingo.engines.settings import resolve_stop_token_ids
from olingo.rewards.registry import one_line
from olingo.rollout.environment import (
    ROW_FIELD,
    EnvFailure,
    Environment,
    EnvironmentReturnError,
    EnvironmentSpecError,
    call_all,
    check_reset,
    check_step,
    environment_name,
    resolve_environment,
)
from olingo.rollout.source import PromptBatch, SampledBatch

# Distinctive stand-in contents: no template alters them, and they are easy to find again.
_USER_STAND_IN = "olingo multi-turn user stand-in"
_ASSISTANT_STAND_IN = "olingo multi-turn assistant stand-in"
logger = logging.getLogger("olingo.rollout")


@dataclass
class EpisodeLimits:
    """How long an episode may run."""

    max_turns: int = 4
    """Assistant turns per episode; the environment still grades the last one (its reply is dropped)."""
    max_new_tokens: int = 256
    """Sampled tokens per turn (also capped by GenerationSettings.max_new_tokens)."""
    max_episode_tokens: int = 1024
    """Response tokens of the whole episode, sampled and environment ones. A turn samples at
    most the budget left (a turn cut there ends the episode, truncated); an environment reply
    that would leave no room for one more sampled token is not appended and ends the episode,
    truncated. Both are counted as `budget_ends`."""

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_new_tokens", "max_episode_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"EpisodeLimits.{name} must be an int >= 1, got {value!r}")


@dataclass
class Episode:
    """One episode while it runs: its trajectory (the response part of its row) and why it ended."""

    row: int
    """The prompt row it answers (in error messages)."""
    env: Any
    prompt: list[int]
    """The row's prompt ids, without padding."""
    index: int = 0
    """Which of the row's n episodes it is (in error messages)."""
    tokens: list[int] = field(default_factory=list)
    """The trajectory: sampled and environment tokens, in order."""
    sampled: list[bool] = field(default_factory=list)
    """Per trajectory token: True where the engine sampled it."""
    log_probs: list[float] = field(default_factory=list)
    """Per trajectory token: the engine's log-prob where sampled, 0 elsewhere."""
    last_turn: list[int] = field(default_factory=list)
    reward: float = 0.0
    step_rewards: list[tuple[int, float]] = field(default_factory=list)
    """(trajectory index of the answered turn's last sampled token, the step's reward), per step."""
    turns: int = 0
    history: list[dict] | None = None
    """The conversation as messages (prompt, turns as decoded text, replies), to render again at a
    template split; None when the prompt row came without its messages."""
    segments: list[int] = field(default_factory=list)
    """Trajectory indices where a new segment starts (template splits), in order."""
    reset_failed: bool = False
    end: str | None = None
    """None while running; then "done", "max_turns", "length", "budget", "env_error" or "template_split"."""
    truncated: bool = False

    def add(self, ids: list[int], sampled: bool, log_probs: list[float] | None = None) -> None:
        self.tokens += ids
        self.sampled += [sampled] * len(ids)
        self.log_probs += log_probs if log_probs is not None else [0.0] * len(ids)

    def finish(self, end: str, truncated: bool = False) -> None:
        self.end, self.truncated = end, truncated

    def context(self) -> list[int]:
        """What the engine continues: prompt and trajectory, or after a split its last segment."""
        return self.tokens[self.segments[-1]:] if self.segments else self.prompt + self.tokens

    def positions(self, start: int) -> list[int]:
        """Position ids of the trajectory: on from `start` (the prompt's length), from 0 at each split."""
        out, current, splits = [], start, set(self.segments)
        for index in range(len(self.tokens)):
            current = 0 if index in splits else current
            out.append(current)
            current += 1
        return out


class EnvDelta:
    """The tokens that follow a sampled turn for an environment reply (the delta rule above)."""

    def __init__(self, tokenizer: Any, stop_ids: list[int]) -> None:
        require_chat_template(tokenizer)
        self.tokenizer = tokenizer
        self.base = [{"role": "user", "content": _USER_STAND_IN}, {"role": "assistant", "content": _ASSISTANT_STAND_IN}]
        self.head = tokenizer.apply_chat_template(self.base, tokenize=False)
        closing = self.head[self.head.rfind(_ASSISTANT_STAND_IN) + len(_ASSISTANT_STAND_IN):]
        # What the template writes after the special stop token that closes a turn ("\n" after
        # "<|im_end|>"); a turn closed otherwise (a stop string, a plain-text stop token) gets
        # the whole closing text, as the template would have written it.
        self.closing, self.after_stop = closing, {}
        special = set(tokenizer.all_special_ids) | {t for t, added in getattr(tokenizer, "added_tokens_decoder", {}).items() if added.special}
        for stop in set(stop_ids) & special:
            text, stripped = tokenizer.decode([stop], skip_special_tokens=False), closing.lstrip()
            if text and stripped.startswith(text):  # Llama-2 writes " </s>": skip the space
                self.after_stop[stop] = stripped[len(text):]

    def text(self, messages: list[dict], last_token: int) -> str | None:
        """The delta text, or None where the template does not keep the stand-in as a prefix."""
        full = self.tokenizer.apply_chat_template(self.base + messages, add_generation_prompt=True, tokenize=False)
        if not full.startswith(self.head):
            return None
        return self.after_stop.get(last_token, self.closing) + full[len(self.head):]

    def ids(self, messages: list[dict], last_token: int) -> list[int] | None:
        """The delta tokenized alone (no special tokens added), or None (see `text`)."""
        text = self.text(messages, last_token)
        return None if text is None else list(self.tokenizer.encode(text, add_special_tokens=False))


class MultiTurnSource:
    """A `RolloutSource` of multi-turn episodes (see the module docstring).

    environment_factory: returns a fresh `Environment`, called once per episode of a row without
    an `environment` field; a row that has one gets its environment from the factory
    `environment_for(name)` returns (default: the class `resolve_environment` names, built
    without arguments), so one batch may mix environments. step_timeout_s
    bounds each reset and step call; one that raises or runs past it ends its episode with
    reward 0 (`env_errors`; the first of each kind per batch is logged: `log_failures`). A step
    that returns anything but a well-formed `EnvStep`, or a reset anything but None, is an
    `EnvironmentReturnError` naming the environment and the row, which stops the run.
    """

    def __init__(
        self, engine: RolloutEngine, tokenizer: Any, environment_factory: Callable[[], Environment], limits: EpisodeLimits,
        pad_token_id: int, step_timeout_s: float = 30.0, environment_for: Callable[[str], Callable[[], Environment]] | None = None,
        *, reward_weight: float = 1.0, split_rows: bool = False,
    ) -> None:
        self.engine, self.tokenizer, self.environment_factory = engine, tokenizer, environment_factory
        self.limits, self.pad_token_id, self.step_timeout_s = limits, pad_token_id, step_timeout_s
        self.reward_weight = reward_weight  # the environment's rewards in the score: weight x their sum
        self.environment_for = environment_for or resolve_environment
        self.split_rows = split_rows  # continue a template split in a new segment (needs packed forwards)

    def sample(self, prompts: PromptBatch, settings: GenerationSettings, n: int = 1) -> SampledBatch:
        """n episodes for each of the B prompts: (N, P + A) rows, prompt-major."""
        delta = EnvDelta(self.tokenizer, resolve_stop_token_ids(settings, self.tokenizer))
        clock: dict[str, Any] = {"env_seconds": 0.0, "generation_seconds": 0.0, "log_probs": True, "failures": []}
        episodes = self._start(prompts, n, clock)
        with keeping_prefixes(self.engine):  # turn k continues from turn k-1's KV cache where the engine can
            while live := [e for e in episodes if e.end is None]:
                self._sample_turn(live, settings, prompts.input_ids.device, clock)
                self._step(live, delta, clock)
        log_failures(clock["failures"], len(episodes), self.step_timeout_s)
        return self._assemble(prompts, n, episodes, clock)

    def _start(self, prompts: PromptBatch, n: int, clock: dict) -> list[Episode]:
        """One fresh environment per episode, reset concurrently with its row's fields. A reset
        that fails still lets the first turn be sampled (its context is the row's prompt alone),
        then ends the episode as an environment error, so every row holds sampled tokens."""
        fields = prompts.row_fields or {}
        rows = [
            {"gt_answer": prompts.gt_answers[i] if prompts.gt_answers is not None else None, **{k: v[i] for k, v in fields.items()}}
            for i in range(prompts.size)
        ]
        mask, factories = prompts.attention_mask.bool(), self._row_factories(fields.get(ROW_FIELD), prompts.size)
        messages = prompts.messages or [None] * prompts.size
        episodes = [
            Episode(row=i, env=factories[i](), prompt=prompts.input_ids[i][mask[i]].tolist(), index=k, history=list(messages[i]) if messages[i] else None)
            for i in range(prompts.size) for k in range(n)
        ]
        started = time.perf_counter()
        results = call_all([(e.env.reset, (dict(rows[e.row]),)) for e in episodes], self.step_timeout_s)
        clock["env_seconds"] += time.perf_counter() - started
        for episode, result in zip(episodes, results, strict=True):
            episode.reset_failed = isinstance(result, EnvFailure)
            if episode.reset_failed:
                clock["failures"].append(("reset", episode, result.error))
            else:
                check_reset(result, episode.env, episode.row)
        return episodes

    def _row_factories(self, names: list[Any] | None, size: int) -> list[Callable[[], Environment]]:
        """Each row's environment factory: the one its `environment` field names, else the default.
        A name that names no environment is a one-line EnvironmentSpecError naming the row."""
        factories: dict[str, Callable[[], Environment]] = {}
        chosen = []
        for i, name in enumerate(names or [None] * size):
            if name is None:
                chosen.append(self.environment_factory)
                continue
            if not isinstance(name, str):
                raise EnvironmentSpecError(f"prompt row {i} of the batch, field '{ROW_FIELD}': expected an environment name, got {type(name).__name__}")
            if name not in factories:
                try:
                    factories[name] = self.environment_for(name)
                except EnvironmentSpecError as err:
                    raise EnvironmentSpecError(f"prompt row {i} of the batch, field '{ROW_FIELD}': {err}") from None
            chosen.append(factories[name])
        return chosen

    def _sample_turn(self, live: list[Episode], settings: GenerationSettings, device: torch.device, clock: dict) -> None:
        """Batched engine calls over the running episodes, one per turn length; each keeps the ids it was given.

        An episode samples at most min(max_new_tokens, its budget left); episodes whose budget is
        below the turn's cap get a call of their own at that length, so no row asks the engine for
        more than its episode holds (vLLM refuses a context plus max_new_tokens past max_model_len)."""
        turn_cap = min(self.limits.max_new_tokens, settings.max_new_tokens)
        caps = [min(turn_cap, self.limits.max_episode_tokens - len(e.tokens)) for e in live]
        for cap in sorted(set(caps), reverse=True):
            self._sample_group([e for e, c in zip(live, caps, strict=True) if c == cap], dataclasses.replace(settings, max_new_tokens=cap), device, clock)

    def _sample_group(self, live: list[Episode], settings: GenerationSettings, device: torch.device, clock: dict) -> None:
        """One engine call over `live` at `settings.max_new_tokens`; each episode appends its sampled ids."""
        ids, mask = left_pad([e.context() for e in live], self.pad_token_id)
        started = time.perf_counter()
        rollout = self.engine.generate(ids.to(device), mask.to(device), settings, n=1)
        clock["generation_seconds"] += time.perf_counter() - started
        clock["log_probs"] &= rollout.log_probs is not None
        for j, episode in enumerate(live):
            new, log_probs, stopped = sampled_turn(rollout, j)
            episode.add(new, sampled=True, log_probs=log_probs)
            episode.last_turn, episode.turns = new, episode.turns + 1
            if not stopped:  # cut off mid-answer: nothing for the environment to answer
                out_of_budget = len(episode.tokens) >= self.limits.max_episode_tokens
                episode.finish("budget" if out_of_budget else "length", truncated=True)

    def _step(self, live: list[Episode], delta: EnvDelta, clock: dict) -> None:
        """The environments answer the turns that ended with a stop, concurrently."""
        stepping = [e for e in live if e.end is None and not e.reset_failed]
        for episode in live:
            if episode.reset_failed:  # after its first turn, however that ended
                episode.reward, episode.step_rewards = 0.0, []
                episode.finish("env_error", truncated=episode.truncated)
        texts = [self.tokenizer.decode(e.last_turn, skip_special_tokens=True) for e in stepping]
        started = time.perf_counter()
        results = call_all([(e.env.step, (text,)) for e, text in zip(stepping, texts, strict=True)], self.step_timeout_s)
        clock["env_seconds"] += time.perf_counter() - started
        for episode, result, text in zip(stepping, results, texts, strict=True):
            if episode.history is not None:
                episode.history.append({"role": "assistant", "content": text})
            if isinstance(result, EnvFailure):
                clock["failures"].append(("step", episode, result.error))
                episode.reward, episode.step_rewards = 0.0, []
                episode.finish("env_error")
                continue
            step = check_step(result, episode.env, episode.row)
            episode.reward += float(step.reward)
            episode.step_rewards.append((len(episode.tokens) - 1, float(step.reward)))
            if step.done:
                episode.finish("done")
            elif episode.turns >= self.limits.max_turns:
                episode.finish("max_turns")
            else:
                self._append_reply(episode, step.messages, delta)

    def _append_reply(self, episode: Episode, messages: list[dict], delta: EnvDelta) -> None:
        """Append the reply's delta tokens (action mask 0), or end the episode where the template
        splits or the reply would leave no room for another sampled token."""
        try:
            ids = delta.ids(messages, episode.last_turn[-1])
        except (TemplateError, ValueError, TypeError, KeyError) as err:
            roles = sorted({str(m.get("role")) for m in messages})
            hint = "; a template without a 'tool' role takes tool results as role 'user' (the tools environment: result_role: user)" if "tool" in roles else ""
            raise EnvironmentReturnError(
                f"environment {environment_name(episode.env)} (row {episode.row}): the chat template cannot render its reply "
                f"(roles {', '.join(roles)}): {' '.join(str(err).split())}{hint}"
            ) from err
        if episode.history is not None:
            episode.history.extend(messages)
        if ids is None:
            self._split(episode)
        elif len(ids) + 1 > self.limits.max_episode_tokens - len(episode.tokens):
            episode.finish("budget", truncated=True)
        else:
            episode.add(ids, sampled=False)

    def _split(self, episode: Episode) -> None:
        """Go on in a new segment holding the whole conversation rendered again (module docstring),
        or end the episode where that cannot be done or would leave no room for a sampled token."""
        if not self.split_rows or episode.history is None:
            episode.finish("template_split")
            return
        try:
            ids = encode_chat(self.tokenizer, episode.history, add_generation_prompt=True)
        except (TemplateError, ValueError, TypeError, KeyError) as err:
            where = f"environment {environment_name(episode.env)} (row {episode.row})"
            raise EnvironmentReturnError(f"{where}: the chat template cannot render the conversation: {' '.join(str(err).split())}") from err
        if len(ids) + 1 > self.limits.max_episode_tokens - len(episode.tokens):
            episode.finish("budget", truncated=True)
            return
        episode.segments.append(len(episode.tokens))
        episode.add(ids, sampled=False)

    def _assemble(self, prompts: PromptBatch, n: int, episodes: list[Episode], clock: dict) -> SampledBatch:
        """The episodes in the shared layout, with their rewards and metrics."""
        device = prompts.input_ids.device
        width = max(1, max(len(e.tokens) for e in episodes))
        sequences = torch.full((len(episodes), width), self.pad_token_id, dtype=torch.long)
        real = torch.zeros(len(episodes), width, dtype=torch.long)
        action_mask = torch.zeros(len(episodes), width, dtype=torch.bool)
        log_probs = torch.zeros(len(episodes), width, dtype=torch.float32)
        turn_rewards = torch.zeros(len(episodes), width, dtype=torch.float32)
        for k, e in enumerate(episodes):
            length = len(e.tokens)
            sequences[k, :length], real[k, :length] = torch.tensor(e.tokens, dtype=torch.long), 1
            action_mask[k, :length], log_probs[k, :length] = torch.tensor(e.sampled), torch.tensor(e.log_probs)
            for position, reward in e.step_rewards:
                turn_rewards[k, position] += reward
        repeated = prompts.repeated(n)
        positions = segment_positions(repeated.attention_mask, episodes, width) if any(e.segments for e in episodes) else None
        truncated = torch.tensor([e.truncated for e in episodes], dtype=torch.bool)
        rollout = Rollout(
            sequences=torch.cat([repeated.input_ids, sequences.to(device)], dim=1),
            attention_mask=torch.cat([repeated.attention_mask.long(), real.to(device)], dim=1),
            action_mask=action_mask.to(device), truncated=truncated.to(device), num_prompt_tokens=prompts.input_ids.shape[1],
            log_probs=log_probs.to(device) if clock["log_probs"] else None,
            finish_reasons=["length" if e.truncated else "stop" for e in episodes],
            position_ids=positions.to(device) if positions is not None else None,
        )
        rewards = self.reward_weight * torch.tensor([e.reward for e in episodes], dtype=torch.float32, device=device)
        turn_rewards = self.reward_weight * turn_rewards.to(device)
        return SampledBatch(rollout, repeated, env_rewards=rewards, turn_rewards=turn_rewards, info=episode_metrics(episodes, clock))


def sampled_turn(rollout: Rollout, row: int) -> tuple[list[int], list[float] | None, bool]:
    """Row `row`'s sampled ids (the action-masked part of its response), their log-probs (or
    None) and whether a stop ended them."""
    length = int(rollout.action_mask[row].sum())
    start = rollout.num_prompt_tokens
    ids = rollout.sequences[row, start : start + length].tolist()
    log_probs = rollout.log_probs[row, :length].tolist() if rollout.log_probs is not None else None
    reasons = rollout.finish_reasons
    stopped = reasons[row] == "stop" if reasons else not bool(rollout.truncated[row])
    return ids, log_probs, stopped


def segment_positions(prompt_mask: torch.Tensor, episodes: list[Episode], width: int) -> torch.Tensor:
    """(N, P + width) position ids: the prompt's counted over its attended tokens, then each
    trajectory's (`Episode.positions`), 0 on padding."""
    prompt_positions = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0).cpu()
    trajectory = torch.zeros(len(episodes), width, dtype=torch.long)
    for k, e in enumerate(episodes):
        trajectory[k, : len(e.tokens)] = torch.tensor(e.positions(len(e.prompt)), dtype=torch.long)
    return torch.cat([prompt_positions, trajectory], dim=1)


def episode_metrics(episodes: list[Episode], clock: dict) -> dict[str, float]:
    """Per-batch episode metrics: means per episode, counts of each way an episode ended, and
    the seconds spent in the environments vs in generation."""
    count = len(episodes)
    ends = [e.end for e in episodes]
    sampled = sum(sum(e.sampled) for e in episodes)
    return {
        "turns_per_episode": sum(e.turns for e in episodes) / count,
        "sampled_tokens_per_episode": sampled / count,
        "env_tokens_per_episode": (sum(len(e.tokens) for e in episodes) - sampled) / count,
        "env_reward": sum(e.reward for e in episodes) / count,
        "done_episodes": float(ends.count("done")),
        "max_turns_ends": float(ends.count("max_turns")),
        "env_errors": float(ends.count("env_error")),
        "template_splits": float(ends.count("template_split") + sum(len(e.segments) for e in episodes)),
        "budget_ends": float(ends.count("budget")),
        "truncated_episodes": float(sum(e.truncated for e in episodes)),
        "env_seconds": clock["env_seconds"],
        "generation_seconds": clock["generation_seconds"],
        **environment_counters(episodes),
    }


def log_failures(failures: list[tuple[str, Episode, BaseException]], total: int, timeout_s: float) -> None:
    """One warning per environment class, method (reset, step) and kind of error (exception class)
    among a batch's failed calls, `(method, episode, error)` in the order they came: how many of
    the `total` episodes it ended, and the first one's row, episode and message, so an environment
    that always raises does not pass for a policy that earns reward 0."""
    groups: dict[tuple[str, str, str], list[tuple[Episode, BaseException]]] = {}
    for method, episode, error in failures:
        groups.setdefault((environment_name(episode.env), method, type(error).__name__), []).append((episode, error))
    for (name, method, kind), failed in groups.items():
        first, error = failed[0]
        what = f"timed out after {timeout_s:g}s (environment.step_timeout_s)" if isinstance(error, TimeoutError) and not str(error) else one_line(error)
        logger.warning(
            "environment %s: %s failed with %s in %d of %d episodes (each ends with reward 0, counted in rollout/env_errors); "
            "the first, prompt %d of the batch, episode %d: %s%s", name, method, kind, len(failed), total, first.row, first.index, what, _origin(error),
        )


def _origin(error: BaseException) -> str:
    """' (at file.py:12, in step)': where the error was raised, or '' when it has no traceback."""
    frames = traceback.extract_tb(error.__traceback__) if error.__traceback__ is not None else []
    if not frames:
        return ""
    frame = frames[-1]
    return f" (at {os.path.basename(frame.filename)}:{frame.lineno}, in {frame.name})"


def environment_counters(episodes: list[Episode]) -> dict[str, float]:
    """The environments' own counters summed over the batch (a `ToolEnvironment`'s tool_calls,
    tool_errors, tool_parse_errors, tool_timeouts), for environments that have `metrics()`."""
    totals: dict[str, float] = {}
    for episode in episodes:
        for name, value in (episode.env.metrics() if callable(getattr(episode.env, "metrics", None)) else {}).items():
            totals[name] = totals.get(name, 0.0) + float(value)
    return totals
