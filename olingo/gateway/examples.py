"""Agents written as their authors would write them, against the official `openai` client, for
`agent.function` (docs/agents.md, "train an existing agent"). Nothing in them knows olingo.

`retry_arithmetic`: the `arithmetic_retry` environment as an agent program, for the embedded
arithmetic task. `calculator`: a tool-calling agent with the exact `calculate` tool, for the
calculator word problems (olingo/rollout/calculator.py).
"""

from __future__ import annotations

import json
from typing import Any

from olingo.rollout.calculator import calculate, final_answer_reward
from olingo.rollout.tools import tool_schema

MODEL = "policy"  # any name: the gateway serves the policy under training


async def retry_arithmetic(task: dict, client: Any) -> float:
    """Two attempts at the task's answer: 1.0 right at once, 0.5 right after "Wrong. Try again.", else 0."""
    messages = list(task["messages"])
    for attempt in (1, 2):
        reply = await client.chat.completions.create(model=MODEL, messages=messages)
        if reply.choices[0].finish_reason == "length":  # cut off mid-answer: the environment ends such an episode, unscored
            return 0.0
        answer = (reply.choices[0].message.content or "").strip()
        if answer == str(task["gt_answer"]).strip():
            return 1.0 if attempt == 1 else 0.5
        messages += [{"role": "assistant", "content": reply.choices[0].message.content}, {"role": "user", "content": "Wrong. Try again."}]
    return 0.0


CALCULATOR_TOOLS = [tool_schema(calculate)]


async def calculator(task: dict, client: Any, max_turns: int = 3) -> dict:
    """Answer a word problem, calling `calculate` as often as the model asks; the reward is 1.0
    when the final answer's last number is the task's `gt_answer`. Also reports tool use. A
    request refused for the context length (OpenAI's `context_length_exceeded`; the gateway's
    spent `agent.max_episode_tokens`) ends the episode unanswered, reward 0, as the `calculator`
    environment ends one that runs out of its token budget."""
    messages, calls, valid = list(task["messages"]), 0, 0
    for _ in range(max_turns):
        try:
            reply = await client.chat.completions.create(model=MODEL, messages=messages, tools=CALCULATOR_TOOLS)
        except Exception as err:
            if getattr(err, "code", None) != "context_length_exceeded":
                raise
            return {"reward": 0.0, "tool_calls": calls, "valid_calls": valid}  # out of context: no final answer, as the environment ends it
        message = reply.choices[0].message
        if not message.tool_calls:
            return {"reward": final_answer_reward(message.content or "", task), "tool_calls": calls, "valid_calls": valid}
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            calls += 1
            try:
                result = calculate(**json.loads(call.function.arguments))
                valid += 1
            except (ValueError, TypeError, ZeroDivisionError, json.JSONDecodeError) as err:
                result = f"error: {err}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return {"reward": 0.0, "tool_calls": calls, "valid_calls": valid}
