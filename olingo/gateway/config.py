"""The `agent:` section of `olingo grpo` and `olingo ppo`: train an existing agent program
through the gateway (docs/agents.md, "train an existing agent")."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from olingo.config import StrictModel
from olingo.errors import OlingoError
from olingo.rollout.environment import import_path


class AgentSpecError(OlingoError, ValueError):
    """`agent.function` does not name a usable agent."""


class AgentSection(StrictModel):
    """An agent program trained through an OpenAI-compatible endpoint olingo serves during each
    rollout. Unset (`function: null`): no agent."""

    function: str | None = Field(
        None,
        description="the agent, package.module:function, called once per episode as run(task, client) -> reward (a number, or a dict with "
        "'reward'); an async def gets an openai.AsyncOpenAI client, a plain function an openai.OpenAI one (run in a thread); a function "
        "with base_url and api_key parameters gets those instead. task: the prompt row (messages, prompt, gt_answer, other fields)",
    )
    timeout_s: float = Field(300.0, gt=0, description="seconds an episode may take; past it the episode is dropped (agent_timeouts)")
    max_new_tokens: int = Field(
        256, ge=1, description="sampled tokens per request at most (also capped by generation.max_new_tokens and the request's max_tokens)",
    )
    max_episode_tokens: int = Field(
        1024, ge=1, description="response tokens of an episode's row (new context and sampled tokens); a request past it gets a 400 context_length_exceeded",
    )
    max_failure_rate: float = Field(
        0.25, ge=0, le=1,
        description="fraction of a batch's episodes that may fail (raise, time out, never call the model, send a bad request, return no reward) "
        "before the run stops; failed episodes are dropped with their group",
    )
    batching: Literal["lockstep", "window"] = Field(
        "lockstep",
        description="when requests go to the engine: lockstep (once every running episode waits: the same batches on every run, so resume is exact) "
        "or window (also after batch_window_s: faster with slow tools, not reproducible)",
    )
    batch_window_s: float = Field(0.05, gt=0, le=60, description="window batching: seconds the oldest waiting request waits for others")
    host: str = Field("127.0.0.1", min_length=1, description="address the endpoint binds (loopback: only this machine's programs reach it)")
    port: int = Field(0, ge=0, le=65535, description="port the endpoint binds (0: a free one, so several ranks or makers never collide)")
    max_body_bytes: int = Field(4 * 2**20, ge=1024, le=2**30, description="request bodies larger than this get a 413")
    model_name: str = Field("policy", min_length=1, description="the model id /v1/models lists (requests may name any model: the policy answers)")
    reward_weight: float = Field(1.0, ge=0, description="weight of the agents' rewards in the score, beside reward.functions' own weights")

    engine_log_probs: ClassVar[bool] = True  # the default engine reports log-probs: requests may ask for them

    @model_validator(mode="after")
    def _agent_resolves(self) -> AgentSection:
        if self.function is not None:
            resolve_agent(self.function)
            check_gateway_installed()
        return self

    def source(self, engine: Any, tokenizer: Any, prompt_sources: Any = (), *, split_rows: bool = False) -> Any:
        """The `GatewaySource` of this section on `engine`, or None without an agent. split_rows:
        a request that does not extend its episode starts a new segment (the forwards pack)."""
        if self.function is None:
            return None
        from olingo.gateway.source import GatewayLimits, GatewaySource

        limits = GatewayLimits(
            self.timeout_s, self.max_new_tokens, self.max_episode_tokens, self.max_failure_rate, self.batching == "lockstep", self.batch_window_s,
            self.host, self.port, self.max_body_bytes, self.model_name, self.reward_weight,
        )
        return GatewaySource(engine, tokenizer, resolve_agent(self.function), limits, split_rows=split_rows)


def resolve_agent(spec: str) -> Callable:
    """The function 'package.module:function' names; a one-line `AgentSpecError` otherwise."""
    label = f"agent.function '{spec}'"
    module, _, name = import_path(spec, label, "package.module:function", AgentSpecError)
    agent = getattr(module, name, None)
    if not callable(agent) or inspect.isclass(agent):
        raise AgentSpecError(f"{label}: '{name}' in '{module.__name__}' is not a function")
    params = list(inspect.signature(agent).parameters)
    if not ({"base_url", "api_key"} <= set(params) or len(params) >= 2):
        raise AgentSpecError(f"{label}: expected run(task, client) or run(task, base_url, api_key), got ({', '.join(params)})")
    return agent


def check_gateway_installed() -> None:
    """The gateway's server and client libraries (aiohttp, openai) import; else say how to add them."""
    for module in ("aiohttp", "openai"):
        try:
            __import__(module)
        except ImportError:
            raise AgentSpecError(f"agent.function needs the '{module}' package: add the gateway's libraries with `make gateway`") from None
