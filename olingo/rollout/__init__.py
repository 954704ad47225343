"""Where rollouts come from: the `RolloutSource` interface and its implementations.

A source turns a batch of prompt rows into responses sampled by the policy, as token ids with
the mask of the tokens the policy produced (docs/architecture.md, "Rollout sources"). The
experience makers score what a source returns, estimate advantages and hand it to the learner;
a new kind of rollout (a multi-turn environment, an external agent) is a new source, and neither
the learners nor the loop change.
"""

from olingo.rollout.environment import Environment, EnvStep, register_environment, resolve_environment
from olingo.rollout.multi_turn import EpisodeLimits, MultiTurnSource
from olingo.rollout.source import PromptBatch, RolloutSource, SampledBatch, SingleTurnSource
from olingo.rollout.tools import ToolEnvironment, parse_tool_calls, render_tools_prompt, tool_schema

__all__ = [
    "EnvStep", "Environment", "EpisodeLimits", "MultiTurnSource", "PromptBatch", "RolloutSource", "SampledBatch", "SingleTurnSource",
    "ToolEnvironment", "parse_tool_calls", "register_environment", "render_tools_prompt", "resolve_environment", "tool_schema",
]
