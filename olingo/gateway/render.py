"""Chat requests to prompt ids and sampled text back to an assistant message (with `tool_calls`),
through the policy's own chat template.

A request that extends the episode's previous one (its messages are the previous request's,
then the assistant message the gateway answered, then new messages) is never rendered again:
its prompt is the previous prompt, the ids the engine sampled, and the new messages' chat-template
delta (`EnvDelta`, the rule multi-turn environments use, docs/agents.md). Any other request (the
first of an episode, or one whose history was rewritten) is rendered whole.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from jinja2 import TemplateError

from olingo.gateway.protocol import RequestError
from olingo.rollout.multi_turn import EnvDelta
from olingo.rollout.tools import TOOL_CALL_RE, chat_with_tools, template_supports_tools

_RENDER_ERRORS = (TemplateError, ValueError, TypeError, KeyError)


class ChatRenderer:
    """Prompt ids for chat requests, and assistant messages from sampled text, for one tokenizer."""

    def __init__(self, tokenizer: Any, stop_ids: list[int]) -> None:
        self.tokenizer, self.delta = tokenizer, EnvDelta(tokenizer, stop_ids)
        self.native_tools = template_supports_tools(tokenizer)  # probed once: it renders two conversations

    def full(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        """The whole conversation rendered with the generation prompt (tools described as the
        template takes them, else in the system message)."""
        rendered = [self._for_template(m) for m in messages]
        try:
            if tools:
                text = chat_with_tools(self.tokenizer, rendered, tools, tokenize=False, add_generation_prompt=True)
            else:
                text = self.tokenizer.apply_chat_template(rendered, tokenize=False, add_generation_prompt=True)
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
        """A message as chat templates take it: tool-call arguments as objects; a template
        without tool support reads the calls as the `<tool_call>` text the model writes."""
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
