"""The OpenAI request and response bodies the gateway speaks (docs/agents.md, "train an existing
agent"): every request is checked field by field before it reaches the engine, and everything it
cannot honour is refused with a 400 that says why, never ignored.

Honoured: `messages` (roles system/developer/user/assistant/tool, string or text-part content,
assistant `tool_calls`), `tools` (function tools), `max_tokens` / `max_completion_tokens`,
`stop`, `logprobs`, `temperature` and `top_p` equal to the run's (a training endpoint samples
every token of a batch at the temperature its log-probs are taken at), `n` = 1.
Refused: streaming, `n` > 1, `top_logprobs` > 0, penalties, `logit_bias`, structured output,
a forced `tool_choice`. Other fields (`model`, `user`, `seed`, `metadata`, ...) are accepted
and have no effect: the gateway serves one model, the policy being trained.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_STOP_STRINGS = 8


class RequestError(Exception):
    """A request the gateway answers with an error status (never a crash of the server)."""

    def __init__(self, status: int, message: str, code: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.code, "code": self.code}}


@dataclass(frozen=True)
class Sampling:
    """The run's sampling, which a request may restate but not change."""

    temperature: float
    top_p: float


@dataclass
class ChatRequest:
    """A checked `/v1/chat/completions` body."""

    messages: list[dict[str, Any]]
    """Normalised: content a string (text parts joined), assistant tool-call arguments JSON strings."""
    tools: list[dict[str, Any]] | None
    """The function tools' OpenAI schemas ({"type": "function", "function": {...}}), or None."""
    max_tokens: int | None
    stop: list[str]
    logprobs: bool


@dataclass
class CompletionRequest:
    """A checked `/v1/completions` body: a prompt as text or as token ids."""

    prompt: str | list[int]
    max_tokens: int | None
    stop: list[str]
    logprobs: bool


def bad(message: str) -> RequestError:
    return RequestError(400, message)


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _int_field(body: dict, name: str, low: int = 1) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise bad(f"'{name}' must be an integer >= {low}, got {json.dumps(value)[:40]}")
    return value


def _common(body: dict, sampling: Sampling) -> tuple[int | None, list[str]]:
    """The fields chat and text completions share: refusals, sampling, max_tokens, stop."""
    if body.get("stream"):
        raise bad("'stream': streaming is not supported by the olingo gateway; send stream=false")
    if body.get("n") not in (None, 1):
        raise bad(f"'n' must be 1 (got {json.dumps(body.get('n'))[:20]}): each episode samples one continuation per request; "
                  "the run starts its G episodes per task itself")
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise bad(f"'{name}' is not supported: it changes the distribution the policy is trained on")
    if body.get("logit_bias"):
        raise bad("'logit_bias' is not supported: it changes the distribution the policy is trained on")
    for name, run_value in (("temperature", sampling.temperature), ("top_p", sampling.top_p)):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise bad(f"'{name}' must be a number, got {json.dumps(value)[:40]}")
        if abs(float(value) - run_value) > 1e-6:
            raise bad(f"'{name}' is {value}, but this run samples at {name}={run_value} (its generation section): "
                      "omit it or send the run's value")
    max_tokens = _int_field(body, "max_tokens")
    max_completion = _int_field(body, "max_completion_tokens")
    return (max_completion if max_completion is not None else max_tokens), _stop(body.get("stop"))


def _stop(value: Any) -> list[str]:
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOP_STRINGS:
        raise bad(f"'stop' must be a non-empty string or a list of at most {MAX_STOP_STRINGS} of them")
    return list(stops)


def parse_chat(body: Any, sampling: Sampling) -> ChatRequest:
    """The checked chat request, or a `RequestError` naming the field."""
    body = _object(body)
    max_tokens, stop = _common(body, sampling)
    if body.get("top_logprobs") not in (None, 0):
        raise bad("'top_logprobs' > 0 is not supported; 'logprobs': true returns the sampled tokens' log-probs")
    response_format = body.get("response_format")
    if response_format is not None and (not isinstance(response_format, dict) or response_format.get("type") != "text"):
        raise bad("'response_format' other than {\"type\": \"text\"} is not supported (no constrained decoding while training)")
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise bad("'tool_choice' must be 'auto' or 'none': the policy decides whether to call a tool")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list")
    checked = [_message(m, i) for i, m in enumerate(messages)]
    if checked[-1]["role"] == "assistant":
        raise bad("the last message is the assistant's: the gateway samples the next assistant turn, after a user, system or tool message")
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise bad("'logprobs' must be true or false")
    tools = None if choice == "none" else _tools(body.get("tools"))
    return ChatRequest(checked, tools, max_tokens, stop, bool(logprobs))


def _message(message: Any, index: int) -> dict[str, Any]:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise bad(f"{where} must be an object")
    role = message.get("role")
    if role not in ROLES:
        raise bad(f"{where}.role must be one of {', '.join(ROLES)}, got {json.dumps(role)[:30]}")
    out: dict[str, Any] = {"role": role, "content": _content(message.get("content"), where, optional=role == "assistant")}
    if role == "tool" and message.get("tool_call_id") is not None:
        if not isinstance(message["tool_call_id"], str):
            raise bad(f"{where}.tool_call_id must be a string")
        out["tool_call_id"] = message["tool_call_id"]
    if isinstance(message.get("name"), str):
        out["name"] = message["name"]
    if role == "assistant" and message.get("tool_calls"):
        out["tool_calls"] = _tool_calls(message["tool_calls"], where)
    return out


def _content(content: Any, where: str, optional: bool) -> str:
    if content is None and optional:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise bad(f"{where}.content must be a string or a list of text parts (images and audio are not supported)")


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise bad(f"{where}.tool_calls must be a list")
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad(f"{where}.tool_calls[{j}] must be {{id, type: function, function: {{name, arguments}}}}")
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        out.append({"id": str(call.get("id", "")), "type": "function", "function": {"name": function["name"], "arguments": arguments}})
    return out


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise bad("'tools' must be a list")
    for j, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad(f"tools[{j}] must be {{type: function, function: {{name, description?, parameters?}}}}")
        if function.get("parameters") is not None and not isinstance(function["parameters"], dict):
            raise bad(f"tools[{j}].function.parameters must be a JSON schema object")
    return tools


def parse_completion(body: Any, sampling: Sampling) -> CompletionRequest:
    """The checked text-completion request, or a `RequestError` naming the field."""
    body = _object(body)
    max_tokens, stop = _common(body, sampling)
    if body.get("echo"):
        raise bad("'echo' is not supported")
    if body.get("suffix") is not None:
        raise bad("'suffix' is not supported")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one prompt
    is_ids = isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)
    if not (isinstance(prompt, str) and prompt) and not is_ids:
        raise bad("'prompt' must be a non-empty string or a list of token ids (one prompt per request)")
    logprobs = body.get("logprobs")
    if logprobs not in (None, 0, 1) or isinstance(logprobs, bool):
        raise bad("'logprobs' must be 0 or 1 here: the sampled tokens' log-probs, no alternatives")
    return CompletionRequest(prompt, max_tokens, stop, bool(logprobs))


# ---- responses ------------------------------------------------------------------------------
@dataclass
class Sampled:
    """What the engine sampled for one request, as a response needs it."""

    prompt_tokens: int
    tokens: list[str]
    """Each sampled token's text."""
    log_probs: list[float] | None
    finish_reason: str
    """"stop" or "length" ("tool_calls" is set where a call was parsed)."""


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(sampled: Sampled) -> dict[str, int]:
    return {"prompt_tokens": sampled.prompt_tokens, "completion_tokens": len(sampled.tokens), "total_tokens": sampled.prompt_tokens + len(sampled.tokens)}


def chat_response(request_id: str, model: str, message: dict[str, Any], sampled: Sampled, logprobs: bool) -> dict[str, Any]:
    """The `chat.completion` object for one choice."""
    finish = "tool_calls" if message.get("tool_calls") else sampled.finish_reason
    entries = None
    if logprobs and sampled.log_probs is not None:
        entries = {"content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []} for t, lp in zip(sampled.tokens, sampled.log_probs, strict=True)
        ]}
    return {
        "id": request_id, "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": entries}], "usage": usage(sampled),
    }


def completion_response(request_id: str, model: str, text: str, sampled: Sampled, logprobs: bool) -> dict[str, Any]:
    """The `text_completion` object for one choice."""
    entries = None
    if logprobs and sampled.log_probs is not None:
        entries = {"tokens": sampled.tokens, "token_logprobs": sampled.log_probs, "top_logprobs": None, "text_offset": None}
    return {
        "id": request_id, "object": "text_completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "text": text, "finish_reason": sampled.finish_reason, "logprobs": entries}], "usage": usage(sampled),
    }


def models_response(model: str) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "olingo"}]}
