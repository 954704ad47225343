"""Tool use for multi-turn episodes: the JSON schema of a Python function, parsing the tool
calls an assistant turn makes, a system prompt that describes the tools, and
`ToolEnvironment`, an `Environment` that runs the calls and answers with their results.

A tool is a plain Python function (or `async def`) with type hints on every argument and a
Google-style docstring whose `Args:` section describes each one; its schema is what
`transformers.utils.get_json_schema` makes of it.

The call format. Unless the tokenizer declares its own (a `response_template`, read by
`tokenizer.parse_response`), a call is the Hermes / Qwen2.5 format: a JSON object with the
tool's name and its arguments between `<tool_call>` tags, as many as the turn needs::

    Let me add these first.
    <tool_call>
    {"name": "add", "arguments": {"a": 12, "b": 30}}
    </tool_call>

A turn without a call is the final answer. `render_tools_prompt` writes this format into a
system message for chat templates that take no `tools=` (`template_supports_tools` tells).
"""

from __future__ import annotations

import functools
import inspect
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import jinja2
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from transformers.utils import get_json_schema
from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException

from olingo.config_errors import did_you_mean
from olingo.dataset.chat_tokens import ChatTemplateError, require_chat_template
from olingo.errors import OlingoError
from olingo.rewards.registry import one_line
from olingo.rollout.environment import EnvFailure, EnvironmentCatalog, EnvStep, call_all, import_path, resolve_environment

# The closing tag is optional at the very end: a turn cut at the token limit, or a model that
# stops right after its JSON, still makes its last call (a cut JSON fails to parse anyway).
TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)


class ToolSchemaError(OlingoError, ValueError):
    """A tool function whose JSON schema cannot be made (a missing type hint or docstring)."""


@dataclass
class ToolCall:
    """One well-formed call of a known tool, with arguments that fit its signature."""

    name: str
    """The tool's name (its function's `__name__`)."""
    arguments: dict[str, Any]
    """Keyword arguments, as the JSON gave them."""


def tool_schema(fn: Callable) -> dict:
    """`{"type": "function", "function": {"name", "description", "parameters"}}` for `fn`,
    the form chat templates take in `tools=`. A ToolSchemaError names the function when it
    lacks a type hint or a docstring description for some argument."""
    name = getattr(fn, "__name__", repr(fn))
    try:
        return get_json_schema(fn)
    except (DocstringParsingException, TypeHintParsingException) as err:
        raise ToolSchemaError(
            f"tool '{name}' has no usable schema: {err}. A tool needs a type hint on every argument and a "
            "Google-style docstring: a description, then an 'Args:' section with one line per argument"
        ) from None


def tools_by_name(tools: Sequence[Callable]) -> dict[str, Callable]:
    """`{fn.__name__: fn}`; two tools with one name would make calls ambiguous, so that is an error."""
    named: dict[str, Callable] = {}
    for fn in tools:
        name = getattr(fn, "__name__", None)
        if not name or name == "<lambda>":
            raise ToolSchemaError(f"tool {fn!r} has no name: define it with def, the name is what the model calls")
        if name in named:
            raise ToolSchemaError(f"two tools are named '{name}': a call names its tool, so names must differ")
        named[name] = fn
    return named


# ---- parsing calls ----------------------------------------------------------------------------
def parse_tool_calls(text: str, tools: Sequence[Callable], tokenizer: Any = None) -> tuple[list[ToolCall], list[str]]:
    """The tool calls in an assistant turn, in order, and one message per call that cannot run
    (malformed JSON, an unknown tool, arguments that do not fit its signature or schema).
    Never raises for what the model wrote: its mistakes are for it to read and fix.

    `tokenizer`: when it has a `response_template`, transformers' `parse_response` reads the
    calls in the model's own format; otherwise the `<tool_call>` format of the module docstring.
    """
    named = tools_by_name(tools)
    raw_calls, errors = _raw_calls(text, tools, tokenizer)
    calls = []
    for index, raw in enumerate(raw_calls, 1):
        call, problem = _check_call(raw, named)
        if call is not None:
            calls.append(call)
        else:
            errors.append(f"tool call {index}: {problem}")
    return calls, errors


def _raw_calls(text: str, tools: Sequence[Callable], tokenizer: Any) -> tuple[list[Any], list[str]]:
    """What each call holds before checking: its text in the default format, or the dicts a
    tokenizer's response template parses to (its parse failing is one error for the turn)."""
    if getattr(tokenizer, "response_template", None) is None:
        return [body.strip() for body in TOOL_CALL_RE.findall(text)], []
    try:
        # prefix="": the text is only the generated turn, nothing of it was pre-written.
        message = tokenizer.parse_response(text, prefix="", tools=list(tools))
    except (ValueError, KeyError, TypeError) as err:
        return [], [f"the tool calls could not be parsed: {one_line(err)}"]
    return list(message.get("tool_calls") or []), []


def _check_call(raw: Any, named: dict[str, Callable]) -> tuple[ToolCall | None, str]:
    """`(ToolCall, "")` for a call that can run, else `(None, what is wrong)`."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as err:
            return None, f'malformed JSON ({err}); write {{"name": ..., "arguments": {{...}}}}'
    if isinstance(raw, dict) and isinstance(raw.get("function"), dict):
        raw = raw["function"]  # the OpenAI-style {"type": "function", "function": {...}}
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        return None, 'expected a JSON object {"name": ..., "arguments": {...}}'
    name, arguments = raw["name"], raw.get("arguments", {})
    if isinstance(arguments, str):  # some formats send the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as err:
            return None, f"tool '{name}': the arguments are malformed JSON ({err})"
    if name not in named:
        return None, f"unknown tool '{name}'{did_you_mean(name, named)}; the tools are: {', '.join(named)}"
    if not isinstance(arguments, dict):
        return None, f"tool '{name}': arguments must be a JSON object, got {type(arguments).__name__}"
    problem = argument_problem(named[name], arguments)
    return (None, f"tool '{name}': {problem}") if problem else (ToolCall(name, arguments), "")


def argument_problem(fn: Callable, arguments: dict[str, Any]) -> str:
    """Why `fn(**arguments)` would be a wrong call (a missing or unexpected argument, a value of
    the wrong JSON type), or "" when it fits. Only top-level JSON types are checked."""
    try:
        _signature(fn).bind(**arguments)
    except TypeError as err:
        return str(err)
    properties = _properties(fn)
    for key, value in arguments.items():
        expected = _json_types(properties.get(key, {}))
        if expected and not any(_is_json_type(value, kind) for kind in expected):
            return f"argument '{key}' should be {' or '.join(expected)}, got {_json_type_name(value)} {json.dumps(value)[:40]}"
        choices = properties.get(key, {}).get("enum")
        if choices is not None and value not in choices:
            return f"argument '{key}' should be one of {json.dumps(choices)}, got {json.dumps(value)[:40]}"
    return ""


@functools.lru_cache(maxsize=256)
def _signature(fn: Callable) -> inspect.Signature:
    """`inspect.signature(fn)`, made once: building it costs ~0.1 ms, paid at every call otherwise."""
    return inspect.signature(fn)


@functools.lru_cache(maxsize=256)
def _properties(fn: Callable) -> dict[str, dict]:
    """The argument schemas of `fn`, made once: every call of the tool checks against them."""
    return tool_schema(fn)["function"]["parameters"].get("properties", {})


def _json_types(schema: dict) -> list[str]:
    """The JSON types a property schema allows ([] when any is): its `type` (one or a list),
    its `anyOf` choices, and null when `nullable` (how get_json_schema marks Optional)."""
    declared = schema.get("type")
    kinds = [declared] if isinstance(declared, str) else list(declared or [])
    for choice in schema.get("anyOf", []):
        kinds += _json_types(choice)
    if kinds and schema.get("nullable"):
        kinds.append("null")
    return kinds


_PY_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list,), "object": (dict,), "null": (type(None),),
}


def _is_json_type(value: Any, kind: str) -> bool:
    if kind not in _PY_TYPES:
        return True  # a type this check does not know is the tool's to judge
    # bool is an int in Python but not a number in JSON.
    return isinstance(value, _PY_TYPES[kind]) and not (isinstance(value, bool) and kind in ("integer", "number"))


def _json_type_name(value: Any) -> str:
    return next((kind for kind in _PY_TYPES if _is_json_type(value, kind)), type(value).__name__)


# ---- describing tools to the model ------------------------------------------------------------
def render_tools_prompt(tools: Sequence[Callable | dict]) -> str:
    """A system-message text that lists the tools' JSON schemas and the `<tool_call>` format,
    for chat templates that do not render `tools=` themselves (the wording is Qwen2.5's).
    A tool is a function or its schema already made (an OpenAI request's `tools` entry)."""
    schemas = "\n".join(json.dumps(fn if isinstance(fn, dict) else tool_schema(fn)) for fn in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{schemas}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n\n'
        "Each result comes back in a tool message. When you have the answer, reply without a tool call."
    )


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders `tools=`: a probe conversation renders
    differently with a tool than without (templates that ignore `tools` render the same)."""
    probe = [{"role": "user", "content": "hi"}]
    tool = {"type": "function", "function": {"name": "olingo_probe_tool", "description": "probe", "parameters": {"type": "object", "properties": {}}}}
    try:
        plain = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
        with_tools = tokenizer.apply_chat_template(probe, tools=[tool], tokenize=False, add_generation_prompt=True)
    except (ValueError, TypeError, jinja2.TemplateError):
        return False  # no chat template at all, or one that refuses tools
    return plain != with_tools


def chat_with_tools(tokenizer: Any, messages: list[dict], tools: Sequence[Callable | dict], **kwargs: Any) -> Any:
    """`tokenizer.apply_chat_template(messages, ...)` with the tools (functions or their schemas)
    described: through `tools=` when the template renders them, else as `render_tools_prompt`
    in the system message (appended to the conversation's own system message when it has one)."""
    if template_supports_tools(tokenizer):
        return tokenizer.apply_chat_template(messages, tools=[fn if isinstance(fn, dict) else tool_schema(fn) for fn in tools], **kwargs)
    prompt = render_tools_prompt(tools)
    if messages and messages[0].get("role") == "system":
        messages = [{**messages[0], "content": f"{messages[0]['content']}\n\n{prompt}"}, *messages[1:]]
    else:
        messages = [{"role": "system", "content": prompt}, *messages]
    return tokenizer.apply_chat_template(messages, **kwargs)


# ---- the environment ----------------------------------------------------------------------------
class ToolEnvironment:
    """An `Environment` whose replies are tool results.

    Each assistant turn's calls run (at most `max_calls_per_turn`, concurrently, each within
    `call_timeout_s`; plain or `async def` tools) and their results, `str(...)` of what the tool
    returned or the error it raised, come back as `{"role": "tool", ...}` messages, as do the
    reasons calls could not run. A turn without a call ends the episode with
    `reward(assistant_text, row)` (0 without a reward function). `max_invalid_calls` turns in a
    row whose calls all failed to parse also end it, with reward 0, so a model that cannot
    call does not spend the episode's turns on it. A plain tool past its timeout cannot be
    stopped: its thread (a daemon, which does not hold the process at exit) runs on, so a tool
    that may hang should bound itself (or be async). A tool may return any value: its result
    message holds `str(value)`.

    The counters (`tool_calls`, `tool_errors` (raised or timed out), `tool_parse_errors`,
    `timeouts`) cover the episode since `reset`; `metrics()` gives them as a dict. A source
    makes one environment per episode from a factory of no arguments:
    `functools.partial(ToolEnvironment, tools, reward)`, or, to name it, a registered subclass::

        @register_environment("calculator")
        class Calculator(ToolEnvironment):
            def __init__(self):
                super().__init__([add, multiply], reward=exact_match)
    """

    def __init__(
        self, tools: Sequence[Callable], reward: Callable[[str, dict], float] | None = None, *,
        call_timeout_s: float = 10.0, max_invalid_calls: int = 2, max_calls_per_turn: int = 4,
        tokenizer: Any = None, result_role: str = "tool",
    ) -> None:
        self.tools = tools_by_name(tools)
        for fn in tools:
            tool_schema(fn)  # a tool without a schema fails here, not at its first call
        self.reward_fn = reward
        self.call_timeout_s = call_timeout_s
        self.max_invalid_calls = max_invalid_calls
        self.max_calls_per_turn = max_calls_per_turn
        self.tokenizer = tokenizer
        self.result_role = result_role  # "user" for chat templates without a tool role
        self.reset({})

    def reset(self, row: dict) -> None:
        """Start an episode for `row` (kept for the reward function); zero the counters."""
        self.row = row
        self.tool_calls = self.tool_errors = self.tool_parse_errors = self.timeouts = 0
        self.invalid_turns = 0  # consecutive turns whose calls all failed to parse

    def step(self, assistant: str) -> EnvStep:
        """Run the turn's tool calls and answer with their results; see the class docstring."""
        calls, errors = parse_tool_calls(assistant, list(self.tools.values()), self.tokenizer)
        if not calls and not errors:
            return EnvStep([], reward=self._final_reward(assistant), done=True)
        if len(calls) > self.max_calls_per_turn:
            skipped = ", ".join(call.name for call in calls[self.max_calls_per_turn:])
            errors.append(f"at most {self.max_calls_per_turn} tool calls run per turn; skipped: {skipped}")
            calls = calls[: self.max_calls_per_turn]
        self.tool_parse_errors += len(errors)
        messages = [self.result_message(call.name, result) for call, result in zip(calls, self._run(calls), strict=True)]
        messages += [self.result_message(None, f"error: {error}") for error in errors]
        self.invalid_turns = 0 if calls else self.invalid_turns + 1
        return EnvStep(messages, reward=0.0, done=self.invalid_turns >= self.max_invalid_calls)

    def metrics(self) -> dict[str, float]:
        """This episode's counters, by name (a source sums them over episodes)."""
        return {"tool_calls": self.tool_calls, "tool_errors": self.tool_errors, "tool_parse_errors": self.tool_parse_errors, "tool_timeouts": self.timeouts}

    def _run(self, calls: list[ToolCall]) -> list[str]:
        """Each call's result text: `str(result)`, or the error it raised or its timeout."""
        self.tool_calls += len(calls)
        outcomes = call_all([(functools.partial(self.tools[c.name], **c.arguments), ()) for c in calls], self.call_timeout_s)
        texts = []
        for outcome in outcomes:
            if isinstance(outcome, EnvFailure):
                self.tool_errors += 1
                timed_out = isinstance(outcome.error, TimeoutError)
                self.timeouts += timed_out
                outcome = f"error: timed out after {self.call_timeout_s:g}s" if timed_out else f"error: {one_line(outcome.error)}"
            texts.append(str(outcome))
        return texts

    def result_message(self, name: str | None, content: str) -> dict:
        """The message a tool result (or a call's error, `name` None) comes back as: `result_role`."""
        message = {"role": self.result_role, "content": content}
        if name is not None:
            message["name"] = name  # templates that label each tool result read it
        return message

    def _final_reward(self, assistant: str) -> float:
        return 0.0 if self.reward_fn is None else float(self.reward_fn(assistant, self.row))


def check_result_roles(catalog: EnvironmentCatalog, tokenizer: Any) -> None:
    """A one-line ChatTemplateError naming the config field unless the chat template renders the
    tool results of every configured `ToolEnvironment` (one is built for the probe): run once the
    tokenizer is loaded, so a template without a tool role stops the run at start-up rather than
    at the first tool call, after the model loaded."""
    for _, params_key, spec, params in catalog.configured():
        cls = resolve_environment(spec)
        if inspect.isclass(cls) and issubclass(cls, ToolEnvironment):
            env = cls(**params)
            takes_role = "result_role" in inspect.signature(cls).parameters or isinstance(env, ConfiguredTools)
            fix = f"set {params_key}.result_role: user" if takes_role else f"build {cls.__name__} with result_role='user'"
            check_result_role(env, tokenizer, f"environment '{spec}'", fix)


def check_result_role(env: ToolEnvironment, tokenizer: Any, where: str, fix: str) -> None:
    """A one-line ChatTemplateError, from `where` to `fix`, unless a tool result message of `env`
    renders after an assistant turn, content included, as an episode renders it (`EnvDelta`)."""
    require_chat_template(tokenizer)
    marker = "olingo tool result probe"
    conversation = [{"role": "user", "content": "probe"}, {"role": "assistant", "content": "probe"}, env.result_message(next(iter(env.tools), "tool"), marker)]
    role = env.result_role
    try:
        text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    except (jinja2.TemplateError, ValueError, TypeError, KeyError) as err:
        problem = f"has no '{role}' role (rendering a tool result message raised: {' '.join(str(err).split())})"
    else:
        if marker in text:
            return
        problem = f"leaves the content of '{role}' messages out, so the policy would never see a tool result"
    raise ChatTemplateError(f"{where}: the chat template {problem}: {fix}")


# ---- tools named in a config ----------------------------------------------------------------------
class ToolsParams(BaseModel):
    """The parameters of the built-in environment `tools` (`environment.params`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    tools: list[str] = Field(min_length=1, description="the tools: import paths 'package.module:function' of plain typed functions")
    reward: str | None = Field(None, description="the final turn's reward: a registered reward-function name or 'package.module:function'")
    call_timeout_s: float = Field(10.0, gt=0, description="seconds one tool call may take")
    max_invalid_calls: int = Field(2, ge=1, description="turns in a row whose calls all fail to parse before the episode ends")
    max_calls_per_turn: int = Field(4, ge=1, description="tool calls run per turn; the rest are answered with an error")
    result_role: Literal["tool", "user"] = Field("tool", description="the role of result messages (user: templates without a tool role)")


class ConfiguredTools(ToolEnvironment):
    """The built-in environment `tools`: a `ToolEnvironment` whose tools and reward are named by
    import path, so a config file can set them (docs/agents.md):

        environment: {name: tools, params: {tools: [my_pkg.tools:add], reward: exact_match}}

    The reward is called as `reward.functions` are, `fn(prompt, response, gt_answer, **row_fields)`,
    with the final assistant turn as the response and "" as the prompt (an environment sees the
    row's fields, not its prompt)."""

    def __init__(self, **params: Any) -> None:
        checked = self.checked(params, "environment.params")
        tools = [import_tool(spec, f"environment.params.tools[{i}]") for i, spec in enumerate(checked.tools)]
        reward = row_reward(checked.reward) if checked.reward is not None else None
        options = checked.model_dump(exclude={"tools", "reward"})
        super().__init__(tools, reward, **options)

    @classmethod
    def check_params(cls, params: dict[str, Any], key: str) -> None:
        """One-line errors naming `key`'s field: an unknown parameter, a wrong value, a tool that
        does not import or has no schema, an unknown reward; called when the config is built."""
        checked = cls.checked(params, key)
        tools = [import_tool(spec, f"{key}.tools[{i}]") for i, spec in enumerate(checked.tools)]
        try:
            for fn in tools:
                tool_schema(fn)
            tools_by_name(tools)
        except ToolSchemaError as err:
            raise ToolSchemaError(f"{key}.tools: {err}") from None
        if checked.reward is not None:
            try:
                row_reward(checked.reward)
            except ValueError as err:  # RewardError: unknown name, bad import path
                raise ToolSchemaError(f"{key}.reward: {err}") from None

    @staticmethod
    def checked(params: dict[str, Any], key: str) -> ToolsParams:
        """`params` validated; the first problem as a one-line ToolSchemaError naming its field."""
        fields = list(ToolsParams.model_fields)
        for name in params:
            if name not in fields:
                raise ToolSchemaError(f"{key}.{name}: the tools environment takes no parameter '{name}'{did_you_mean(name, fields)}; "
                                      f"its parameters: {', '.join(fields)}")
        try:
            return ToolsParams(**params)
        except ValidationError as err:
            first = err.errors()[0]
            where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in first["loc"])
            got = "" if first["type"] == "missing" else f", got {json.dumps(first.get('input'), default=str)[:60]}"
            raise ToolSchemaError(f"{key}{where}: {first['msg']}{got}") from None


@functools.lru_cache(maxsize=256)
def import_tool(spec: str, key: str) -> Callable:
    """The function at 'package.module:function' (imported once); a one-line ToolSchemaError naming
    `key` when the path does not name a function."""
    module, module_name, attr = import_path(spec, key, "a tool's import path 'package.module:function'", ToolSchemaError)
    fn = getattr(module, attr, None)
    if fn is None:
        choices = [n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")]
        raise ToolSchemaError(f"{key}: '{module_name}' has no function '{attr}'{did_you_mean(attr, choices)}")
    if inspect.isclass(fn) or not callable(fn):
        raise ToolSchemaError(f"{key}: '{spec}' is {type(fn).__name__}, not a function")
    return fn


@functools.lru_cache(maxsize=64)
def row_reward(spec: str) -> Callable[[str, dict], float]:
    """A `ToolEnvironment` reward `(text, row) -> float` from a reward function's name or import
    path, called as the run's reward functions are (see `ConfiguredTools`)."""
    from olingo.rewards.functions import reward_function  # the rewards layer, only for this

    function = reward_function(spec)

    def reward(text: str, row: dict) -> float:
        fields = {name: [value] for name, value in row.items() if name != "gt_answer"}
        return float(function.values([""], [text], [row.get("gt_answer")], fields)[0])

    return reward
