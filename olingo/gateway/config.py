"""The `agent:` section of `olingo grpo` and `olingo ppo`: train an existing agent program
through the gateway (docs/agents.md, "train an existing agent")."""

from __future__ import annotations

import inspect
import ipaddress
from collections.abc import Callable
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from olingo.config import StrictModel
from olingo.config_errors import did_you_mean
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
    host: str = Field(
        "127.0.0.1", min_length=1,
        description="address the endpoint binds (loopback: only this machine's programs reach it; any other address needs agent.allow_remote)",
    )
    allow_remote: bool = Field(
        False, description="let agent.host be a non-loopback address: the endpoint is then open to other machines, guarded only by the "
        "per-episode keys sent over plain HTTP (a warning at start says so)",
    )
    port: int = Field(0, ge=0, le=65535, description="port the endpoint binds (0: a free one, so several ranks or makers never collide)")
    max_body_bytes: int = Field(4 * 2**20, ge=1024, le=2**30, description="request bodies larger than this get a 413")
    model_name: str = Field("policy", min_length=1, description="the model id /v1/models lists (requests may name any model: the policy answers)")
    reward_weight: float = Field(1.0, ge=0, description="weight of the agents' rewards in the score, beside reward.functions' own weights")
    result_role: Literal["auto", "tool", "user"] = Field(
        "auto",
        description="the role the agent's tool messages (tool results) are rendered as, and named in the tool prompt olingo writes: tool, "
        "user (chat templates without a tool role), or auto (tool where the policy's chat template renders a tool message, else user)",
    )

    engine_log_probs: ClassVar[bool] = True  # the default engine reports log-probs: requests may ask for them

    @model_validator(mode="after")
    def _agent_resolves(self) -> AgentSection:
        check_host(self.host, self.allow_remote)
        if self.function is not None:
            resolve_agent(self.function)
            check_gateway_installed()
        return self

    def check_tokenizer(self, tokenizer: Any) -> str:
        """The result role this section renders tool messages as on `tokenizer`'s chat template; an
        `AgentSpecError` where `result_role: tool` and the template has no tool role. A few renders:
        callable as soon as the tokenizer loads, before the model does."""
        from olingo.gateway.render import resolve_result_role

        return resolve_result_role(tokenizer, self.result_role)

    def source(self, engine: Any, tokenizer: Any, prompt_sources: Any = (), *, split_rows: bool = False) -> Any:
        """The `GatewaySource` of this section on `engine`, or None without an agent. split_rows:
        a request that does not extend its episode starts a new segment (the forwards pack)."""
        if self.function is None:
            return None
        from olingo.gateway.source import GatewayLimits, GatewaySource

        limits = GatewayLimits(
            timeout_s=self.timeout_s, max_new_tokens=self.max_new_tokens, max_episode_tokens=self.max_episode_tokens,
            max_failure_rate=self.max_failure_rate, lockstep=self.batching == "lockstep", batch_window_s=self.batch_window_s, host=self.host,
            port=self.port, max_body_bytes=self.max_body_bytes, model_name=self.model_name, reward_weight=self.reward_weight,
            result_role=self.result_role, allow_remote=self.allow_remote,
        )
        return GatewaySource(engine, tokenizer, resolve_agent(self.function), limits, split_rows=split_rows)


def resolve_agent(spec: str) -> Callable:
    """The function 'package.module:function' names; a one-line `AgentSpecError` otherwise."""
    label = f"agent.function '{spec}'"
    module, _, name = import_path(spec, label, "package.module:function", AgentSpecError)
    if not hasattr(module, name):
        functions = [n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")]
        raise AgentSpecError(f"{label}: module '{module.__name__}' has no attribute '{name}', so it is not a function{did_you_mean(name, functions)}")
    agent = getattr(module, name)
    if not callable(agent) or inspect.isclass(agent):
        raise AgentSpecError(f"{label}: '{name}' in '{module.__name__}' is not a function (it is a {type(agent).__name__})")
    params = list(inspect.signature(agent).parameters)
    if not ({"base_url", "api_key"} <= set(params) or len(params) >= 2):
        raise AgentSpecError(f"{label}: expected run(task, client) or run(task, base_url, api_key), got ({', '.join(params)})")
    return agent


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only: localhost or a loopback address (a host name other
    than localhost is not resolved, so it counts as remote)."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_host(host: str, allow_remote: bool) -> None:
    """An `AgentSpecError` for a non-loopback `agent.host` unless `agent.allow_remote` says so."""
    if not allow_remote and not is_loopback(host):
        raise AgentSpecError(
            f"agent.host={host} is not a loopback address: the endpoint would be open to other machines, guarded only by per-episode keys "
            "sent over plain HTTP; keep agent.host=127.0.0.1, or set agent.allow_remote: true to serve it anyway"
        )


def check_gateway_installed() -> None:
    """The gateway's server and client libraries (aiohttp, openai) import; else say how to add them."""
    for module in ("aiohttp", "openai"):
        try:
            __import__(module)
        except ImportError:
            raise AgentSpecError(f"agent.function needs the '{module}' package: add the gateway's libraries with `make gateway`") from None
