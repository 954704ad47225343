"""`GatewaySource`: a `RolloutSource` whose episodes are runs of the user's own agent program,
talking to the policy through an OpenAI-compatible endpoint the source serves while it samples.

    async def run(task: dict, client: openai.AsyncOpenAI) -> float | dict

For each of the N = B x n episodes (prompt-major: n per task) the source makes a key, starts the
agent with a client bound to the endpoint and that key, answers the requests that key signs
(`/v1/chat/completions`, `/v1/completions`, `/v1/models`) from the rollout engine, and records
every request's prompt ids, sampled ids and log-probs into the episode's row
(`olingo.gateway.episodes`). The agent's return value is the episode's reward. The endpoint is
up for one `sample` call: it is bound when the rollout starts and closed, with every agent task,
before `sample` returns or raises.

Which client the agent gets follows its signature: `client` (an `openai.AsyncOpenAI` for an
`async def`, an `openai.OpenAI` for a plain function, which runs in a daemon thread of its own:
one past `timeout_s` is abandoned, and neither holds the rollout nor the process's exit), or
`base_url` and `api_key` for a program that builds its own client.

A request whose rendered prompt, plus the tokens it may sample, does not fit the model's context
(`context_limit`) gets a 400 `context_length_exceeded` naming both lengths.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import logging
import math
import os
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from olingo.dataset.chat_tokens import ChatTemplateError
from olingo.engines import GenerationSettings, RolloutEngine
from olingo.engines.base import keeping_prefixes, left_pad
from olingo.engines.settings import resolve_stop_token_ids
from olingo.errors import OlingoError
from olingo.gateway.config import check_host, is_loopback
from olingo.gateway.episodes import FAILURES, EpisodeState, Recorder, assemble, episode_metrics
from olingo.gateway.protocol import (
    RequestError,
    Sampled,
    Sampling,
    chat_response,
    completion_response,
    models_response,
    new_id,
    parse_chat,
    parse_completion,
)
from olingo.gateway.render import PROBE_TOOL, ChatRenderer, resolve_result_role, same_message, tool_block_tokens
from olingo.gateway.server import Dispatcher, HttpServer, Job, LoopThread, error_response, read_json
from olingo.rewards.registry import one_line
from olingo.rollout.multi_turn import sampled_turn
from olingo.rollout.source import PromptBatch, SampledBatch
from olingo.rollout.tools import template_supports_tools

logger = logging.getLogger(__name__)

MAX_SYNC_AGENTS = 64
"""Plain-function agents running at once (each on a thread of its own); the others wait their turn."""


class AgentFailureRate(OlingoError, RuntimeError):
    """More of a batch's agent episodes failed than `agent.max_failure_rate` allows."""


@dataclasses.dataclass
class GatewayLimits:
    """What the source allows its agents (the `agent:` section's values)."""

    timeout_s: float = 300.0
    max_new_tokens: int = 256
    max_episode_tokens: int = 1024
    max_failure_rate: float = 0.25
    lockstep: bool = True
    batch_window_s: float = 0.05
    host: str = "127.0.0.1"
    port: int = 0
    max_body_bytes: int = 4 * 2**20
    model_name: str = "policy"
    reward_weight: float = 1.0
    result_role: str = "auto"
    """tool, user or auto: the role the agent's tool messages are rendered as (`render.resolve_result_role`)."""
    allow_remote: bool = False


class GatewaySource:
    """A `RolloutSource` of agent episodes through the gateway (module docstring)."""

    def __init__(self, engine: RolloutEngine, tokenizer: Any, agent: Callable, limits: GatewayLimits, *, split_rows: bool = False) -> None:
        self.engine, self.tokenizer, self.agent, self.limits = engine, tokenizer, agent, limits
        self.recorder = Recorder(limits.max_episode_tokens, split_rows)
        for name in ("httpx", "httpx2"):  # the agents' clients would log every request at INFO
            logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger(name).level))
        self.base_url: str | None = None  # while an endpoint is up (tests read it)
        check_host(limits.host, limits.allow_remote)
        if not is_loopback(limits.host):
            logger.warning("agent.host=%s (agent.allow_remote): the gateway endpoint is open to other machines; its only guard is the "
                           "per-episode keys, sent over plain HTTP: bind it to a trusted network only", limits.host)
        self.result_role = resolve_result_role(tokenizer, limits.result_role)
        if limits.result_role == "auto" and self.result_role == "user":
            logger.info("agent.result_role=auto: the policy's chat template has no tool role, so the agent's tool results are rendered as user messages")
        self.context = context_limit(engine, tokenizer)
        self._tool_sets_checked: set[str] = set()
        if self.context is not None and getattr(tokenizer, "chat_template", None) is not None:
            self.check_tool_block([PROBE_TOOL], template_supports_tools(tokenizer), "the tool prompt of a single empty tool")

    def check_tool_block(self, tools: list[dict], native_tools: bool, what: str | None = None) -> None:
        """Warn, once per set of tools, when the tools' description alone (an empty conversation)
        does not fit the model's context: every request offering them will be refused."""
        key = json.dumps(tools, sort_keys=True, default=str)
        if self.context is None or key in self._tool_sets_checked:
            return
        self._tool_sets_checked.add(key)
        tokens = tool_block_tokens(self.tokenizer, tools, native_tools, self.result_role)
        if tokens is not None and tokens >= self.context:
            names = ", ".join(str(t.get("function", {}).get("name")) for t in tools)
            logger.warning(
                "agent: %s renders to %d tokens with an empty conversation, more than the model's context of %d tokens: every chat request "
                "offering %s will be refused (400 context_length_exceeded); use a model with a longer context or fewer, shorter tools",
                what or f"the tools [{names}]", tokens, self.context, "tools" if what else "them",
            )

    # ---- one rollout ---------------------------------------------------------------------------
    def sample(self, prompts: PromptBatch, settings: GenerationSettings, n: int = 1) -> SampledBatch:
        """n agent episodes per task, (N, P + A) rows prompt-major; see the module docstring."""
        repeated = prompts.repeated(n)
        states = [EpisodeState(index=k, task=task_of(repeated, k)) for k in range(repeated.size)]
        gateway = Gateway(self, states, settings)
        seconds = {"generation_seconds": 0.0, "agent_seconds": 0.0}
        started = time.perf_counter()
        with gateway.serving() as dispatcher, keeping_prefixes(self.engine):  # a request continues from its turn before
            while (jobs := dispatcher.next_batch()) is not None:
                began = time.perf_counter()
                self._serve(jobs, settings, repeated.input_ids.device, gateway)
                seconds["generation_seconds"] += time.perf_counter() - began
        seconds["agent_seconds"] = time.perf_counter() - started - seconds["generation_seconds"]
        self._check_failures(states, n)
        batch = assemble(states, repeated, self.tokenizer.pad_token_id, self.limits.reward_weight)
        if not gateway.engine_log_probs:
            batch.rollout.log_probs = None
        batch.info = episode_metrics(states, seconds)
        return batch

    def _serve(self, jobs: list[Job], settings: GenerationSettings, device: torch.device, gateway: Gateway) -> None:
        """One engine call per (token cap, stop strings) among `jobs`, in the order of their first episode."""
        groups: dict[tuple, list[Job]] = {}
        for job in jobs:
            groups.setdefault((job.max_new_tokens, job.stop), []).append(job)
        for (cap, stop), group in groups.items():
            stops = list(dict.fromkeys([*(settings.stop_strings or []), *stop])) or None
            ids, mask = left_pad([j.prompt_ids for j in group], self.tokenizer.pad_token_id)
            try:
                rollout = self.engine.generate(ids.to(device), mask.to(device), dataclasses.replace(settings, max_new_tokens=cap, stop_strings=stops), n=1)
            except BaseException as err:
                for job in group:
                    job.settle(RequestError(500, f"the rollout engine failed: {one_line(err)}", "server_error"))
                raise
            for j, job in enumerate(group):
                sampled, log_probs, stopped = sampled_turn(rollout, j)
                gateway.engine_log_probs &= log_probs is not None
                job.settle((sampled, log_probs or [0.0] * len(sampled), stopped))

    def _check_failures(self, states: list[EpisodeState], n: int) -> None:
        """Warn of each kind of failure; an `AgentFailureRate` past `max_failure_rate`."""
        failed = [s for s in states if s.failure is not None]
        log_failures(self.agent, failed, len(states), n)
        if failed and len(failed) / len(states) > self.limits.max_failure_rate:
            counts = ", ".join(f"{reason} {sum(s.failure == reason for s in failed)}" for reason in FAILURES if any(s.failure == reason for s in failed))
            first = next(s for s in failed)
            raise AgentFailureRate(
                f"{len(failed)} of {len(states)} agent episodes failed ({counts}), more than agent.max_failure_rate={self.limits.max_failure_rate}; "
                f"the first: episode {first.index}, {first.failure}{': ' + first.error if first.error else ''}"
            )


def log_failures(agent: Callable, failed: list[EpisodeState], total: int, n: int) -> None:
    """One warning per kind of failure (reason and class) among a rollout's failed episodes: how
    many it dropped, and the first one's prompt, episode and message, as environments' are logged."""
    groups: dict[tuple[str, str], list[EpisodeState]] = {}
    for state in failed:
        groups.setdefault((state.failure or "", state.error_class), []).append(state)
    name = f"{getattr(agent, '__module__', '?')}:{getattr(agent, '__qualname__', type(agent).__name__)}"
    for (reason, kind), group in groups.items():
        first = group[0]
        logger.warning(
            "agent %s: %s in %d of %d episodes (dropped with their groups, counted in rollout/%s); the first, prompt %d of the batch, episode %d: %s%s",
            name, FAILURE_WORDS[reason].format(kind=kind), len(group), total, FAILURES[reason], first.index // n, first.index, first.error, first.origin,
        )


FAILURE_WORDS = {
    "error": "failed with {kind}", "timeout": "timed out", "no_requests": "returned without calling the model",
    "bad_request": "sent a request refused with {kind}", "bad_return": "{kind}",
}
"""How each reason in FAILURES reads in the log; kind: the `EpisodeState.error_class`."""


def raised_at(error: BaseException) -> str:
    """' (at file.py:12, in run)': where `error` was raised, or '' without a traceback."""
    frames = traceback.extract_tb(error.__traceback__) if error.__traceback__ is not None else []
    return f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}, in {frames[-1].name})" if frames else ""


def context_limit(engine: Any, tokenizer: Any) -> int | None:
    """The model's context in tokens: the engine's (vLLM's max_model_len), else the policy's
    max_position_embeddings, else the tokenizer's model_max_length; None where none is known."""
    for value in (getattr(engine, "_max_model_len", None), getattr(engine, "max_model_len", None)):
        if isinstance(value, int) and value > 0:
            return value
    model = getattr(engine, "model", None)
    model = getattr(model, "module", model)  # a DDP wrapper
    value = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if isinstance(value, int) and value > 0:
        return value
    value = getattr(tokenizer, "model_max_length", None)
    return value if isinstance(value, int) and 0 < value < 10**8 else None  # transformers' "no limit" is 1e30


def task_of(prompts: PromptBatch, k: int) -> dict[str, Any]:
    """What the agent is given for row k: the prompt row's messages, its last user message's text
    as `prompt`, its reference answer and its other fields."""
    messages = [dict(m) for m in prompts.messages[k]] if prompts.messages is not None and prompts.messages[k] else []
    users = [m["content"] for m in messages if m.get("role") == "user" and isinstance(m.get("content"), str)]
    fields = {name: values[k] for name, values in (prompts.row_fields or {}).items()}
    answer = prompts.gt_answers[k] if prompts.gt_answers is not None else None
    return {"messages": messages, "prompt": users[-1] if users else "", "gt_answer": answer, **fields}


class Gateway:
    """The endpoint of one rollout: its episodes by key, its handlers and its agent tasks."""

    def __init__(self, source: GatewaySource, states: list[EpisodeState], settings: GenerationSettings) -> None:
        self.source, self.states, self.limits = source, states, source.limits
        self.by_key = {s.key: s for s in states}
        self.sampling = Sampling(settings.temperature, settings.top_p)
        self.stop_ids = resolve_stop_token_ids(settings, source.tokenizer)
        self._renderer: ChatRenderer | None = None
        self.dispatcher = Dispatcher(self.limits.lockstep, self.limits.batch_window_s)
        self.engine_log_probs = True
        self.cap = min(settings.max_new_tokens, self.limits.max_new_tokens)

    @property
    def renderer(self) -> ChatRenderer:
        """Made at the first chat request: text completions need no chat template."""
        if self._renderer is None:
            try:
                self._renderer = ChatRenderer(self.source.tokenizer, self.stop_ids, self.source.result_role)
            except ChatTemplateError as err:
                raise RequestError(400, f"chat completions need a chat template: {err}") from None
        return self._renderer

    # ---- lifecycle -----------------------------------------------------------------------------
    def serving(self) -> _Serving:
        return _Serving(self)

    async def run_agents(self, base_url: str) -> None:
        slots = asyncio.Semaphore(MAX_SYNC_AGENTS)
        await asyncio.gather(*(self._episode(state, base_url, slots) for state in self.states))

    async def _episode(self, state: EpisodeState, base_url: str, slots: asyncio.Semaphore) -> None:
        """Run the agent on one episode's task, bounded by `timeout_s`; record its reward or why it failed."""
        try:
            result = await asyncio.wait_for(call_agent(self.source.agent, state.task, base_url, state.key, self.limits.timeout_s, slots), self.limits.timeout_s)
            if state.failure is None:
                take_result(state, result)
        except TimeoutError:
            state.fail("timeout", f"no result within agent.timeout_s={self.limits.timeout_s} s", "TimeoutError")
        except asyncio.CancelledError:
            state.fail("error", "cancelled", "CancelledError")
            raise
        except Exception as err:  # the agent's own error: its episode is dropped, the run goes on
            state.fail("error", one_line(err), type(err).__name__, raised_at(err))
        finally:
            state.finished = True
            self.dispatcher.finished(state.index)
        if state.failure is None and state.requests == 0:
            state.fail("no_requests", "the agent returned without calling the model", "no request")

    # ---- handlers ------------------------------------------------------------------------------
    def routes(self) -> list[tuple[str, str, Any]]:
        return [("POST", "/v1/chat/completions", self.chat), ("POST", "/v1/completions", self.completions), ("GET", "/v1/models", self.models)]

    def _episode_of(self, request: Any) -> EpisodeState:
        header = request.headers.get("Authorization", "")
        state = self.by_key.get(header.removeprefix("Bearer ").strip()) if header.startswith("Bearer ") else None
        if state is None or state.finished:
            raise RequestError(401, "unknown or finished episode key: each episode's client carries its own key", "invalid_api_key")
        return state

    async def models(self, request: Any) -> Any:
        from aiohttp import web

        try:
            self._episode_of(request)
        except RequestError as err:
            return error_response(err)
        return web.json_response(models_response(self.limits.model_name))

    async def chat(self, request: Any) -> Any:
        return await self._answer(request, self._chat)

    async def completions(self, request: Any) -> Any:
        return await self._answer(request, self._completion)

    async def _answer(self, request: Any, handle: Callable) -> Any:
        """Every error becomes an OpenAI error body with its status; a 4xx other than a spent
        budget marks the episode failed (`bad_request`)."""
        from aiohttp import web

        try:
            state = self._episode_of(request)
        except RequestError as err:
            return error_response(err)
        try:
            return web.json_response(await handle(state, await read_json(request, self.limits.max_body_bytes)))
        except RequestError as err:
            if err.status < 500 and err.code != "context_length_exceeded":
                state.bad_requests += 1
                state.fail("bad_request", err.message, f"HTTP {err.status}")
            return error_response(err)

    async def _chat(self, state: EpisodeState, body: Any) -> dict:
        request = parse_chat(body, self.sampling)
        if request.tools:
            self.source.check_tool_block(request.tools, self.renderer.native_tools)
        prompt_ids = self._chat_prompt(state, request.messages, request.tools)
        request_id, sampled = await self._generate(state, prompt_ids, request.max_tokens, request.stop, request.logprobs, "chatcmpl")
        text = self._text(sampled.ids, request.stop)
        message = self.renderer.assistant_message(text, request.tools)
        state.tip_messages, state.tip_tools, state.tip_text = [*request.messages, message], request.tools, None
        return chat_response(request_id, self.limits.model_name, message, sampled.sampled, request.logprobs)

    async def _completion(self, state: EpisodeState, body: Any) -> dict:
        request = parse_completion(body, self.sampling)
        prompt_ids = self._text_prompt(state, request.prompt)
        request_id, sampled = await self._generate(state, prompt_ids, request.max_tokens, request.stop, request.logprobs, "cmpl")
        text = self._text(sampled.ids, request.stop)
        state.tip_text, state.tip_messages = (request.prompt + text) if isinstance(request.prompt, str) else None, None
        return completion_response(request_id, self.limits.model_name, text, sampled.sampled, request.logprobs)

    def _chat_prompt(self, state: EpisodeState, messages: list[dict], tools: list[dict] | None) -> list[int]:
        """The prompt ids: the episode's context and the new messages' delta where the request
        extends the last one (render.py), else the conversation rendered whole."""
        tip = state.tip_messages
        if (
            tip is not None and state.in_flight == 0 and state.tip_ids and tools == state.tip_tools and len(messages) > len(tip)
            and all(same_message(sent, known) for sent, known in zip(messages, tip, strict=False))
        ):
            delta = self.renderer.extension(messages[len(tip):], state.tip_ids[-1])
            if delta is not None:
                return state.tip_ids + delta
        return self.renderer.full(messages, tools)

    def _text_prompt(self, state: EpisodeState, prompt: str | list[int]) -> list[int]:
        """Token ids as given; a text that starts with the last prompt and its completion: the
        episode's context and the rest tokenized; any other text tokenized whole."""
        if isinstance(prompt, list):
            return list(prompt)
        tip = state.tip_text
        if tip is not None and state.in_flight == 0 and state.tip_ids and prompt.startswith(tip):
            return state.tip_ids + list(self.source.tokenizer.encode(prompt[len(tip):], add_special_tokens=False))
        return list(self.source.tokenizer.encode(prompt, add_special_tokens=False))

    async def _generate(
        self, state: EpisodeState, prompt_ids: list[int], max_tokens: int | None, stop: list[str], logprobs: bool, kind: str,
    ) -> tuple[str, _Generated]:
        """Queue the prompt for the engine, wait for its turn, record it in the episode's row."""
        cap = min(self.cap, max_tokens or math.inf, self._context_room(state, prompt_ids, max_tokens))
        room = self.source.recorder.room(state, prompt_ids)
        cap = min(cap, room or math.inf)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        state.in_flight += 1
        try:
            self.dispatcher.submit(Job(state.index, prompt_ids, int(cap), tuple(stop), future, loop))
            ids, log_probs, stopped = await future
        finally:
            state.in_flight -= 1
        if logprobs and not self.engine_log_probs:
            raise RequestError(400, "'logprobs': this run's rollout engine does not report log-probs")
        request_id = new_id(kind)
        self.source.recorder.record(state, request_id, prompt_ids, ids, log_probs, stopped)
        pieces = [self.source.tokenizer.decode([t]) for t in ids] if logprobs else [""] * len(ids)
        return request_id, _Generated(ids, Sampled(len(prompt_ids), pieces, log_probs if logprobs else None, "stop" if stopped else "length"))

    def _context_room(self, state: EpisodeState, prompt_ids: list[int], max_tokens: int | None) -> float:
        """Tokens the model's context leaves after the prompt (inf where unknown); a 400
        `context_length_exceeded` where the prompt and the tokens the request asks for (its
        max_tokens within the run's caps; 1 when it names none) do not fit."""
        limit = self.source.context
        if limit is None:
            return math.inf
        wanted = min(self.cap, max_tokens) if max_tokens else 1
        if len(prompt_ids) + wanted > limit:
            state.context_refusals += 1
            capped = ", capped by agent.max_new_tokens and generation.max_new_tokens" if max_tokens and wanted < max_tokens else ""
            asked = f" and {wanted} to sample (max_tokens{capped})" if max_tokens else " and at least 1 to sample"
            raise RequestError(
                400, f"this model's maximum context length is {limit} tokens, but the request needs {len(prompt_ids) + wanted}: "
                f"{len(prompt_ids)} in the rendered prompt (chat template and tools included){asked}; shorten the messages or the tools",
                "context_length_exceeded",
            )
        return limit - len(prompt_ids)

    def _text(self, ids: list[int], stop: list[str]) -> str:
        """The sampled text without special tokens and without the stop string that ended it (as OpenAI returns it)."""
        text = self.source.tokenizer.decode(ids, skip_special_tokens=True)
        for s in stop:
            if text.endswith(s):
                return text[: -len(s)]
        return text


@dataclasses.dataclass
class _Generated:
    ids: list[int]
    sampled: Sampled


class _Serving:
    """`with gateway.serving() as dispatcher:` the endpoint is up and the agents run; on leaving,
    every agent task is cancelled, the server closed and its loop thread joined."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def __enter__(self) -> Dispatcher:
        g = self.gateway
        g.dispatcher.start(s.index for s in g.states)
        self.thread = LoopThread()
        self.server = HttpServer(g.routes(), g.limits.host, g.limits.port, g.limits.max_body_bytes)
        try:
            self.thread.submit(self.server.start()).result(timeout=60)
        except BaseException:
            self.thread.close()
            raise
        g.source.base_url = self.server.base_url
        self.agents = self.thread.submit(g.run_agents(self.server.base_url))
        return g.dispatcher

    def __exit__(self, *exc: Any) -> None:
        try:
            if exc[0] is None:
                self.agents.result(timeout=60)  # every episode has finished: only the gather's return is left
        finally:
            self.agents.cancel()
            self.thread.submit(self.server.stop()).result(timeout=30)
            self.thread.close()
            self.gateway.source.base_url = None


# ---- calling the agent -------------------------------------------------------------------------
async def call_agent(agent: Callable, task: dict, base_url: str, key: str, timeout_s: float, slots: asyncio.Semaphore) -> Any:
    """The agent's result for `task`, given the client its signature asks for (module docstring);
    a plain function on a daemon thread, once one of `slots` is free."""
    params = inspect.signature(agent).parameters
    if "base_url" in params:
        if inspect.iscoroutinefunction(agent):
            return await agent(dict(task), base_url=base_url, api_key=key)
        async with slots:
            return await in_daemon_thread(lambda: agent(dict(task), base_url=base_url, api_key=key))
    import openai

    # verify=False: the endpoint is plain HTTP, and a client that loads the CA bundle takes ~40 ms to make
    if inspect.iscoroutinefunction(agent):
        http = openai.DefaultAsyncHttpxClient(verify=False)
        client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=timeout_s, http_client=http)
        try:
            return await agent(dict(task), client)
        finally:
            await client.close()

    def run_sync() -> Any:
        with openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=timeout_s, http_client=openai.DefaultHttpxClient(verify=False)) as client:
            return agent(dict(task), client)

    async with slots:
        return await in_daemon_thread(run_sync)


async def in_daemon_thread(fn: Callable[[], Any]) -> Any:
    """`fn()` on a daemon thread of its own. Awaiting it can be cancelled (a timeout): the call
    cannot be stopped, so it is abandoned, and as a daemon it does not hold the process's exit
    (a pool's worker would: Python joins those at exit)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def run() -> None:
        try:
            outcome: tuple[Any, BaseException | None] = (fn(), None)
        except BaseException as err:  # handed to the awaiting episode
            outcome = (None, err)
        try:
            loop.call_soon_threadsafe(_settle_call, future, *outcome)
        except RuntimeError:
            pass  # the loop has closed: the episode was abandoned long ago

    threading.Thread(target=run, name="olingo-agent", daemon=True).start()
    return await future


def _settle_call(future: asyncio.Future, value: Any, error: BaseException | None) -> None:
    if future.done():  # cancelled: the episode timed out
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


def take_result(state: EpisodeState, result: Any) -> None:
    """The agent's return value as the episode's reward: a number, or a dict with `reward`,
    optionally `request_rewards` ({completion id: reward}) and other numbers (logged as agent/<name>)."""
    if isinstance(result, int | float) and not isinstance(result, bool) and math.isfinite(result):
        state.reward = float(result)
        return
    if not isinstance(result, dict) or not _number(result.get("reward", 0.0)):
        got = type(result).__name__ if not isinstance(result, dict) else f"'reward': {json.dumps(result.get('reward'), default=str)[:40]}"
        kind = f"returned {type(result).__name__} instead of a reward" if not isinstance(result, dict) else "returned a dict without a 'reward' number"
        state.fail("bad_return", f"expected a finite number or a dict with a 'reward' number, got {got}", kind)
        return
    per_request = result.get("request_rewards") or {}
    unknown = [rid for rid in per_request if rid not in state.request_ends] if isinstance(per_request, dict) else None
    if unknown is None or unknown or not all(_number(v) for v in per_request.values()):
        unknown_ids = f"; unknown: {unknown[:3]}" if unknown else ""
        state.fail("bad_return", f"request_rewards must map ids of this episode's trained requests to numbers{unknown_ids}", "returned a malformed dict")
        return
    others = {k: v for k, v in result.items() if k not in ("reward", "request_rewards")}
    if not all(_number(v) for v in others.values()):
        message = f"every other value of the returned dict must be a number (logged as agent/<name>), got {sorted(others)}"
        state.fail("bad_return", message, "returned a malformed dict")
        return
    state.reward, state.request_rewards = float(result.get("reward", 0.0)), {k: float(v) for k, v in per_request.items()}
    state.metrics = {k: float(v) for k, v in others.items()}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
