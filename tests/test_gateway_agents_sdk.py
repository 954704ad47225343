"""The OpenAI Agents SDK (openai-agents, requirements-gateway.txt) driving the gateway as its users
write it: an `Agent` with a `function_tool`, on `OpenAIChatCompletionsModel` over the episode's
client, run by `Runner.run`. Its tool call reaches the SDK, the SDK runs the tool, and the row is
the sampled ids with the tool turn's chat-template delta between them (docs/agents.md)."""

from __future__ import annotations

import pytest
import torch

from olingo.engines import GenerationSettings, rollout_from_responses
from olingo.gateway import GatewayLimits, GatewaySource
from olingo.rollout import PromptBatch
from olingo.rollout.calculator import calculate, final_answer_reward
from tests.test_multi_turn import smol  # noqa: F401 - SmolLM2's tokenizer (ChatML)

agents = pytest.importorskip("agents", reason="the OpenAI Agents SDK is not installed (requirements-gateway.txt, `make gateway`)")

CALL = '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2+3"}}\n</tool_call><|im_end|>'
ANSWER = "The answer is 5.<|im_end|>"


async def run(task: dict, client) -> dict:
    """A calculator agent as the SDK's users write it; 1.0 when its final output's last number is the answer."""
    agent = agents.Agent(
        name="calculator", instructions="Answer the question; use calculate for arithmetic.", tools=[agents.function_tool(calculate)],
        model=agents.OpenAIChatCompletionsModel(model="policy", openai_client=client),
    )
    result = await agents.Runner.run(agent, task["prompt"])
    tool_runs = sum(item.type == "tool_call_output_item" for item in result.new_items)
    return {"reward": final_answer_reward(str(result.final_output), task), "tool_runs": tool_runs}


class TwoTurnEngine:
    """Answers a context without a tool turn with CALL, one with a tool turn with ANSWER;
    remembers each call's contexts and the ids it returned."""

    shares_weights, can_sleep = True, False

    def __init__(self, tok) -> None:
        self.tok, self.calls, self.answers = tok, [], []

    def generate(self, input_ids, attention_mask, settings, n=1):
        contexts = [ids[m.bool()].tolist() for ids, m in zip(input_ids, attention_mask, strict=True)]
        rows = [self.tok.encode(ANSWER if "<|im_start|>tool" in self.tok.decode(c) else CALL, add_special_tokens=False) for c in contexts]
        self.calls.append(contexts)
        self.answers.append(rows)
        width = max(len(r) for r in rows)
        responses = torch.tensor([r + [self.tok.pad_token_id] * (width - len(r)) for r in rows])
        return rollout_from_responses(input_ids, attention_mask, responses, self.tok, settings, -responses.float() / 1000)


@pytest.mark.slow  # SmolLM2's tokenizer (the `smol` fixture) and an HTTP endpoint
def test_the_agents_sdk_calls_the_tool_and_its_row_is_the_sampled_ids_and_the_tool_delta(smol):  # noqa: F811 - the imported fixture
    agents.set_tracing_disabled(True)  # the SDK would export traces to api.openai.com
    messages = [{"role": "user", "content": "What is 2+3?"}]
    ids = smol.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    batch = PromptBatch(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long), ["5"], {}, [messages])
    engine = TwoTurnEngine(smol)
    settings = GenerationSettings(max_new_tokens=64, stop_token_ids=[smol.convert_tokens_to_ids("<|im_end|>")])
    sampled = GatewaySource(engine, smol, run, GatewayLimits(), split_rows=True).sample(batch, settings, n=2)

    assert len(engine.calls) == 2 and sampled.dropped.tolist() == [False, False]  # lockstep: both episodes' turns in one call each
    assert sampled.env_rewards.tolist() == [1.0, 1.0] and sampled.info["agent/tool_runs"] == 1.0  # the SDK ran `calculate` once
    assert sampled.info["history_rewrites"] == 0 and sampled.info["bad_requests"] == 0
    first_prompt = smol.decode(engine.calls[0][0])  # the SDK's instructions as the system message, its tool's schema described
    assert "use calculate for arithmetic" in first_prompt and '"name": "calculate"' in first_prompt
    rollout, width = sampled.rollout, sampled.rollout.num_prompt_tokens
    for k in range(2):
        first, second = engine.calls[0][k], engine.calls[1][k]
        call, answer = engine.answers[0][k], engine.answers[1][k]
        delta = second[len(first) + len(call):]
        assert second[: len(first) + len(call)] == first + call  # the second request extends the first token for token
        assert smol.decode(delta) == "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"
        real = rollout.attention_mask[k].bool()
        response = rollout.sequences[k, width:][real[width:]].tolist()
        assert rollout.sequences[k, :width][real[:width]].tolist() == first
        assert response == call + delta + answer
        mask = rollout.action_mask[k, : len(response)].tolist()
        assert mask == [True] * len(call) + [False] * len(delta) + [True] * len(answer) and not rollout.action_mask[k, len(response):].any()
