"""Train an existing agent program: an OpenAI-compatible endpoint served during rollouts, which
records every sampled token (docs/agents.md, "train an existing agent")."""

from olingo.gateway.config import AgentSection, AgentSpecError
from olingo.gateway.source import AgentFailureRate, GatewayLimits, GatewaySource

__all__ = ["AgentFailureRate", "AgentSection", "AgentSpecError", "GatewayLimits", "GatewaySource"]
