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
`async def`, an `openai.OpenAI` for a plain function, which runs in a thread), or `base_url` and
`api_key` for a program that builds its own client.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from olingo.dataset.chat_tokens import ChatTemplateError
from olingo.engines import GenerationSettings, RolloutEngine
from olingo.engines.base import keeping_prefixes, left_pad
from olingo.engines.settings import resolve_stop_token_ids
from olingo.errors import OlingoError
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
from olingo.gateway.render import ChatRenderer, same_message
from olingo.gateway.server import Dispatcher, HttpServer, Job, LoopThread, error_response, read_json
from olingo.rewards.registry import one_line
from olingo.rollout.multi_turn import sampled_turn
from olingo.rollout.source import PromptBatch, SampledBatch

logger = logging.getLogger(__name__)


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


class GatewaySource:
    """A `RolloutSource` of agent episodes through the gateway (module docstring)."""

    def __init__(self, engine: RolloutEngine, tokenizer: Any, agent: Callable, limits: GatewayLimits, *, split_rows: bool = False) -> None:
        self.engine, self.tokenizer, self.agent, self.limits = engine, tokenizer, agent, limits
        self.recorder = Recorder(limits.max_episode_tokens, split_rows)
        for name in ("httpx", "httpx2"):  # the agents' clients would log every request at INFO
            logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLogger(name).level))
        self.base_url: str | None = None  # while an endpoint is up (tests read it)

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
        self._check_failures(states)
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

    def _check_failures(self, states: list[EpisodeState]) -> None:
        """Warn of each failed episode; an `AgentFailureRate` past `max_failure_rate`."""
        failed = [s for s in states if s.failure is not None]
        for state in failed[:5]:
            logger.warning("agent episode %d dropped: %s%s", state.index, state.failure, f": {state.error}" if state.error else "")
        if len(failed) > 5:
            logger.warning("... and %d more agent episodes dropped", len(failed) - 5)
        if failed and len(failed) / len(states) > self.limits.max_failure_rate:
            counts = ", ".join(f"{reason} {sum(s.failure == reason for s in failed)}" for reason in FAILURES if any(s.failure == reason for s in failed))
            first = next(s for s in failed)
            raise AgentFailureRate(
                f"{len(failed)} of {len(states)} agent episodes failed ({counts}), more than agent.max_failure_rate={self.limits.max_failure_rate}; "
                f"the first: episode {first.index}, {first.failure}{': ' + first.error if first.error else ''}"
            )


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
                self._renderer = ChatRenderer(self.source.tokenizer, self.stop_ids)
            except ChatTemplateError as err:
                raise RequestError(400, f"chat completions need a chat template: {err}") from None
        return self._renderer

    # ---- lifecycle -----------------------------------------------------------------------------
    def serving(self) -> _Serving:
        return _Serving(self)

    async def run_agents(self, base_url: str) -> None:
        pool = ThreadPoolExecutor(max_workers=min(64, len(self.states)), thread_name_prefix="olingo-agent")
        try:
            await asyncio.gather(*(self._episode(state, base_url, pool) for state in self.states))
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    async def _episode(self, state: EpisodeState, base_url: str, pool: ThreadPoolExecutor) -> None:
        """Run the agent on one episode's task, bounded by `timeout_s`; record its reward or why it failed."""
        try:
            result = await asyncio.wait_for(call_agent(self.source.agent, state.task, base_url, state.key, self.limits.timeout_s, pool), self.limits.timeout_s)
            if state.failure is None:
                take_result(state, result)
        except TimeoutError:
            state.fail("timeout", f"no result within agent.timeout_s={self.limits.timeout_s} s")
        except asyncio.CancelledError:
            state.fail("error", "cancelled")
            raise
        except Exception as err:  # the agent's own error: its episode is dropped, the run goes on
            state.fail("error", one_line(err))
        finally:
            state.finished = True
            self.dispatcher.finished(state.index)
        if state.failure is None and state.requests == 0:
            state.fail("no_requests", "the agent returned without calling the model")

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
                state.fail("bad_request", err.message)
            return error_response(err)

    async def _chat(self, state: EpisodeState, body: Any) -> dict:
        request = parse_chat(body, self.sampling)
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
        room = self.source.recorder.room(state, prompt_ids)
        cap = min(self.cap, max_tokens or math.inf, room or math.inf)
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
async def call_agent(agent: Callable, task: dict, base_url: str, key: str, timeout_s: float, pool: ThreadPoolExecutor) -> Any:
    """The agent's result for `task`, given the client its signature asks for (module docstring)."""
    params = inspect.signature(agent).parameters
    if "base_url" in params:
        if inspect.iscoroutinefunction(agent):
            return await agent(dict(task), base_url=base_url, api_key=key)
        return await asyncio.get_running_loop().run_in_executor(pool, lambda: agent(dict(task), base_url=base_url, api_key=key))
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

    return await asyncio.get_running_loop().run_in_executor(pool, run_sync)


def take_result(state: EpisodeState, result: Any) -> None:
    """The agent's return value as the episode's reward: a number, or a dict with `reward`,
    optionally `request_rewards` ({completion id: reward}) and other numbers (logged as agent/<name>)."""
    if isinstance(result, int | float) and not isinstance(result, bool) and math.isfinite(result):
        state.reward = float(result)
        return
    if not isinstance(result, dict) or not _number(result.get("reward", 0.0)):
        state.fail("bad_return", f"expected a finite number or a dict with a 'reward' number, got {type(result).__name__}")
        return
    per_request = result.get("request_rewards") or {}
    unknown = [rid for rid in per_request if rid not in state.request_ends] if isinstance(per_request, dict) else None
    if unknown is None or unknown or not all(_number(v) for v in per_request.values()):
        unknown_ids = f"; unknown: {unknown[:3]}" if unknown else ""
        state.fail("bad_return", f"request_rewards must map ids of this episode's trained requests to numbers{unknown_ids}")
        return
    others = {k: v for k, v in result.items() if k not in ("reward", "request_rewards")}
    if not all(_number(v) for v in others.values()):
        state.fail("bad_return", f"every other value of the returned dict must be a number (logged as agent/<name>), got {sorted(others)}")
        return
    state.reward, state.request_rewards = float(result.get("reward", 0.0)), {k: float(v) for k, v in per_request.items()}
    state.metrics = {k: float(v) for k, v in others.items()}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
