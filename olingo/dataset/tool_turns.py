"""Checks that a chat template renders what a conversation holds, before it is trained on.

A template that knows nothing of tool calls (SmolLM2's ChatML template writes ``content`` only)
renders an assistant turn made of ``tool_calls`` as an empty turn: the row would train the model
to answer nothing. That is refused with the row and field, not learned silently.
"""

from __future__ import annotations

from typing import Any

from jinja2.exceptions import TemplateError

from olingo.dataset.messages import Message, RowRef


def render_text(tokenizer: Any, messages: list[Message]) -> str:
    """``messages`` rendered by the tokenizer's chat template, as text."""
    return tokenizer.apply_chat_template(messages, tokenize=False)


def check_tool_calls_rendered(tokenizer: Any, messages: list[Message], ref: RowRef, field: str, start: int = 0) -> None:
    """A DataError naming ``field[i - start].tool_calls`` when the template renders the
    conversation the same with and without turn i's tool calls (it ignores them); turns before
    ``start`` (a prompt the field does not hold) are not checked."""
    for i in range(start, len(messages)):
        message = messages[i]
        if not message.get("tool_calls"):
            continue
        without = [*messages[:i], {"role": "assistant", "content": message["content"]}]
        try:
            ignored = render_text(tokenizer, messages[: i + 1]) == render_text(tokenizer, without)
        except TemplateError as exc:
            raise ref.error(f"{field}[{i - start}]", f"the chat template rejected this conversation: {exc}") from exc
        if ignored:
            reason = (
                "the chat template does not render tool calls (it writes this turn the same without them): "
                "use a model whose chat template supports tools (model.tokenizer), or write the calls into 'content'"
            )
            raise ref.error(f"{field}[{i - start}].tool_calls", reason)
