"""Chat requests to prompt ids and sampled text back to an assistant message (with `tool_calls`),
through the policy's own chat template.

A request that extends the episode's previous one (its messages are the previous request's,
then the assistant message the gateway answered, then new messages) is never rendered again:
its prompt is the previous prompt, the ids the engine sampled, and the new messages' chat-template
delta (`EnvDelta`, the rule multi-turn environments use, docs/agents.md). Any other request (the
first of an episode, or one whose history was rewritten) is rendered whole.

The agent's tool messages (tool results) are rendered as the run's result role: `tool`, or
`user` for a chat template without a tool role (`agent.result_role`, as `ToolEnvironment`'s); the
tool prompt olingo writes for a template that does not render `tools=` names that role.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from jinja2 import TemplateError

from olingo.gateway.config import AgentSpecError
from olingo.gateway.protocol import RequestError
from olingo.rollout.multi_turn import EnvDelta
from olingo.rollout.tools import TOOL_CALL_RE, render_tools_prompt, template_supports_tools

_RENDER_ERRORS = (TemplateError, ValueError, TypeError, KeyError, IndexError)
PROBE_TOOL = {"type": "function", "function": {"name": "olingo_probe_tool", "description": "probe", "parameters": {"type": "object", "properties": {}}}}


class ChatRenderer:
    """Prompt ids for chat requests, and assistant messages from sampled text, for one tokenizer."""

    def __init__(self, tokenizer: Any, stop_ids: list[int], result_role: str = "tool") -> None:
        self.tokenizer, self.delta, self.result_role = tokenizer, EnvDelta(tokenizer, stop_ids), result_role
        self.native_tools = template_supports_tools(tokenizer)  # probed once: it renders two conversations

    def full(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        """The whole conversation rendered with the generation prompt (tools described as the
        template takes them, else in the system message)."""
        rendered = [self._for_template(m) for m in messages]
        try:
            text = render_chat(self.tokenizer, rendered, tools, self.native_tools, self.result_role)
        except _RENDER_ERRORS as err:
            raise RequestError(400, f"the policy's chat template cannot render these messages: {' '.join(str(err).split())}") from None
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def extension(self, messages: list[dict], last_token: int) -> list[int] | None:
        """The delta ids of `messages` (what follows the assistant turn that ended with
        `last_token`), or None where the template does not render the conversation as a prefix."""
        try:
            return self.delta.ids([self._for_template(m) for m in messages], last_token)
        except _RENDER_ERRORS as err:
            raise RequestError(400, f"the policy's chat template cannot render these messages: {' '.join(str(err).split())}") from None

    def _for_template(self, message: dict) -> dict:
        """A message as chat templates take it: a tool message in the result role; tool-call
        arguments as objects; a template without tool support reads the calls as the
        `<tool_call>` text the model writes."""
        if message["role"] == "tool" and self.result_role != "tool":
            return {"role": self.result_role, "content": message["content"], **({"name": message["name"]} if "name" in message else {})}
        calls = message.get("tool_calls")
        if not calls:
            return message
        parsed = [{"name": c["function"]["name"], "arguments": _arguments(c["function"]["arguments"])} for c in calls]
        if not self.native_tools:
            text = "\n".join(f"<tool_call>\n{json.dumps(p)}\n</tool_call>" for p in parsed)
            return {"role": "assistant", "content": f"{message['content']}\n{text}".strip()}
        return {**message, "tool_calls": [{"type": "function", "function": p} for p in parsed]}

    def assistant_message(self, text: str, tools: list[dict] | None) -> dict[str, Any]:
        """The OpenAI assistant message for sampled `text`: where the request declared tools and
        every call in the text names one with JSON-object arguments, those calls as `tool_calls`
        and the rest of the text as content; otherwise the whole text as content (a malformed
        call is the model's mistake, for the agent to read)."""
        content, calls = self._calls(text, tools) if tools else (text, None)
        if not calls:
            return {"role": "assistant", "content": text}
        return {"role": "assistant", "content": content or None, "tool_calls": calls}

    def _calls(self, text: str, tools: list[dict]) -> tuple[str, list[dict] | None]:
        """(the text around the calls, the calls), or (text, None) where any call is malformed."""
        names = {t["function"]["name"] for t in tools}
        if getattr(self.tokenizer, "response_template", None) is not None:
            try:
                parsed = self.tokenizer.parse_response(text, prefix="", tools=tools)
            except _RENDER_ERRORS:
                return text, None
            raw, content = list(parsed.get("tool_calls") or []), str(parsed.get("content") or "")
        else:
            raw, content = [body.strip() for body in TOOL_CALL_RE.findall(text)], TOOL_CALL_RE.sub("", text).strip()
        calls = []
        for item in raw:
            try:
                item = json.loads(item) if isinstance(item, str) else item
            except json.JSONDecodeError:
                return text, None
            item = item.get("function", item) if isinstance(item, dict) else item
            if not isinstance(item, dict) or item.get("name") not in names or not isinstance(arguments := _arguments(item.get("arguments", {})), dict):
                return text, None
            calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": item["name"], "arguments": json.dumps(arguments)}})
        return content, calls or None


def render_chat(tokenizer: Any, messages: list[dict], tools: list[dict] | None, native_tools: bool, result_role: str) -> str:
    """The conversation's text with the generation prompt; tools through `tools=` where the
    template renders them, else as the tool prompt (naming `result_role`) in the system message."""
    if not tools:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    if native_tools:
        return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    prompt = tools_prompt(tools, result_role)
    if messages and messages[0].get("role") == "system":
        messages = [{**messages[0], "content": f"{messages[0]['content']}\n\n{prompt}"}, *messages[1:]]
    else:
        messages = [{"role": "system", "content": prompt}, *messages]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def tools_prompt(tools: list[dict], result_role: str) -> str:
    """`render_tools_prompt` (the system-message tool description), saying which role results come back in."""
    return render_tools_prompt(tools).replace("comes back in a tool message", f"comes back in a {result_role} message")


def tool_block_tokens(tokenizer: Any, tools: list[dict], native_tools: bool, result_role: str) -> int | None:
    """Tokens of the tools' description alone: rendered with an empty conversation (one empty user
    message where the template refuses none); None where the template cannot render it."""
    for messages in ([], [{"role": "user", "content": ""}]):
        try:
            return len(tokenizer.encode(render_chat(tokenizer, messages, tools, native_tools, result_role), add_special_tokens=False))
        except _RENDER_ERRORS:
            continue
    return None


def has_tool_role(tokenizer: Any) -> bool:
    """Whether the chat template renders a tool message: a probe result appears in the text, after
    a plain assistant turn or one that made the call (templates that check call ids)."""
    marker, call_id = "olingo_probe_result", "olingoprb"
    call = {"id": call_id, "type": "function", "function": {"name": "olingo_probe_tool", "arguments": {}}}
    result = {"role": "tool", "content": marker, "tool_call_id": call_id, "name": "olingo_probe_tool"}
    for assistant in ({"role": "assistant", "content": "ok"}, {"role": "assistant", "content": "", "tool_calls": [call]}):
        try:
            if marker in tokenizer.apply_chat_template([{"role": "user", "content": "hi"}, assistant, result], tokenize=False, add_generation_prompt=True):
                return True
        except _RENDER_ERRORS:
            continue
    return False


def resolve_result_role(tokenizer: Any, result_role: str) -> str:
    """The role tool results are rendered as: `result_role`, or for `auto` tool where the chat
    template renders a tool message, else user. A one-line `AgentSpecError` where `result_role` is
    tool and the template has no tool role. A tokenizer without a chat template: `tool` (chat
    requests are refused anyway; text completions need none)."""
    if result_role == "user" or getattr(tokenizer, "chat_template", None) is None:
        return "tool" if result_role == "auto" else result_role
    if has_tool_role(tokenizer):
        return "tool"
    if result_role == "tool":
        raise AgentSpecError(
            "agent.result_role=tool, but the policy's chat template has no tool role (a tool message fails to render or is dropped): "
            "set agent.result_role: user to render the agent's tool results as user messages"
        )
    return "user"


def _arguments(arguments: Any) -> Any:
    """Tool-call arguments as an object (a JSON string parsed; anything unparseable kept as is)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


def same_message(sent: dict, known: dict) -> bool:
    """Whether a message the agent sent is one the episode already holds: the same role, content
    (outer whitespace aside, a missing content as empty), tool-call names and arguments (as
    objects: clients re-serialise JSON), and tool-call id and name where given."""
    if sent["role"] != known["role"] or (sent.get("content") or "").strip() != (known.get("content") or "").strip():
        return False
    if sent.get("tool_call_id") != known.get("tool_call_id") or sent.get("name") != known.get("name"):
        return False
    calls = lambda m: [(c["function"]["name"], _arguments(c["function"]["arguments"])) for c in m.get("tool_calls") or []]  # noqa: E731
    return calls(sent) == calls(known)
