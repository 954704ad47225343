"""Token ids for a prompt + response conversation through the tokenizer's own chat template.

The chat template decides every special token (bos, turn markers, eos), so nothing here
adds special tokens of its own: ``apply_chat_template`` tokenises the rendered text with
``add_special_tokens=False``, which keeps the template's bos from being doubled.

A turn ends at its end-of-turn token: the last eos token (``tokenizer.eos_token_id``, the token
rollouts stop on) among the turn's tokens. Text a template writes after it (ChatML's newline
after ``<|im_end|>``) is formatting the model never generates, so loss masks and response ids
stop before it. A template whose turns hold no eos token keeps its turns whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from olingo.dataset.messages import Message
from olingo.errors import OlingoError


class ChatTemplateError(OlingoError, ValueError):
    """The tokenizer has no chat template, so conversations cannot be rendered into tokens."""


def require_chat_template(tokenizer: Any) -> None:
    """Raise `ChatTemplateError`, saying what to set, when ``tokenizer`` has no chat template."""
    if getattr(tokenizer, "chat_template", None) is not None:
        return
    name = getattr(tokenizer, "name_or_path", "") or ""
    where = f" at '{name}'" if name else ""
    raise ChatTemplateError(
        f"the tokenizer{where} has no chat template (tokenizer.chat_template is None), and olingo "
        "renders every data row with it: set model.tokenizer to a tokenizer that has one, or put a "
        "chat template in the model directory (chat_template.jinja, or 'chat_template' in tokenizer_config.json)"
    )


def encode_chat(
    tokenizer: Any, messages: list[Message], *, add_generation_prompt: bool = False
) -> list[int]:
    """Token ids of ``messages`` rendered by the tokenizer's chat template."""
    require_chat_template(tokenizer)
    encoded = tokenizer.apply_chat_template(
        messages,
        tokenize=True,
        add_generation_prompt=add_generation_prompt,
        return_dict=False,
    )
    return _as_id_list(encoded)


def _as_id_list(encoded: Any) -> list[int]:
    """A flat list of ints from whatever apply_chat_template returned.

    transformers 5 returns a BatchEncoding unless ``return_dict=False`` (4.x returned a
    list); accept both, and tensors, so a custom tokenizer wrapper cannot surprise us.
    """
    if isinstance(encoded, Mapping):
        encoded = encoded["input_ids"]
    if hasattr(encoded, "tolist"):
        encoded = encoded.tolist()
    return [int(token) for token in encoded]


def split_prompt_response(
    tokenizer: Any, prompt: list[Message], response: list[Message]
) -> tuple[list[int], list[int]]:
    """Tokenise ``prompt + response`` once and split it into (prompt ids, response ids).

    The response ends at its last end-of-turn token (see ``turn_end``), where a rollout stops:
    template text after it is dropped, so a reward model trains on sequences that end as the
    sequences it scores in PPO do.

    The prompt part is the prompt rendered with the generation prompt (the header that
    opens an assistant turn), which is normally an exact token prefix of the whole
    conversation. When it is not (a template that renders its generation prompt unlike
    an assistant turn's opening, or a tokenizer merging text across the boundary), the
    response starts where the two token lists first differ: the response then absorbs
    the differing header tokens, so its length is over- rather than under-counted.
    """
    prompt_ids = encode_chat(tokenizer, prompt, add_generation_prompt=True)
    full_ids = encode_chat(tokenizer, prompt + response)
    cut = common_prefix_length(prompt_ids, full_ids)
    return full_ids[:cut], full_ids[cut : turn_end(tokenizer, full_ids, cut, len(full_ids))]


def turn_end(tokenizer: Any, ids: list[int], start: int, end: int) -> int:
    """Where the turn held by ``ids[start:end]`` ends: just after its last eos token, or
    ``end`` when it holds none (a template without an end-of-turn eos, or no eos at all)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is None:
        return end
    for position in range(end - 1, start - 1, -1):
        if ids[position] == eos:
            return position + 1
    return end


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """Number of leading positions where ``a`` and ``b`` hold the same token."""
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


def assistant_token_mask(
    tokenizer: Any, messages: list[Message], ids: list[int], first_turn: int = 0
) -> list[int]:
    """1 on the tokens of each assistant turn in ``messages[first_turn:]``, 0 elsewhere.

    ``ids`` is ``messages`` rendered by ``encode_chat`` (or a prefix of it). A turn's tokens are
    those from "conversation so far + generation prompt" up to its end-of-turn token (``turn_end``)
    within "conversation through this turn": its content and that token, not the template text
    after it. This needs no ``{% generation %}`` markers, only a template that renders a
    conversation's prefixes as prefixes of its tokens.
    """
    mask = [0] * len(ids)
    for i in range(first_turn, len(messages)):
        if messages[i]["role"] != "assistant":
            continue
        opening = encode_chat(tokenizer, messages[:i], add_generation_prompt=True)
        start = common_prefix_length(opening, ids)
        end = common_prefix_length(encode_chat(tokenizer, messages[: i + 1]), ids)
        end = turn_end(tokenizer, ids, start, end)
        mask[start:end] = [1] * (end - start)
    return mask


def left_truncate(
    ids: list[int], mask: list[int], max_length: int
) -> tuple[list[int], list[int]]:
    """``ids`` and its aligned ``mask``, both losing the same tokens from the start to fit.

    The end is what matters: the reward model scores the last token and the policy is
    trained on the response, so the prompt's beginning is what gets cut.
    """
    cut = max(0, len(ids) - max_length)
    return ids[cut:], mask[cut:]
