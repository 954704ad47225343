"""Token ids for a prompt + response conversation through the tokenizer's own chat template.

The chat template decides every special token (bos, turn markers, eos), so nothing here
adds special tokens of its own: ``apply_chat_template`` tokenises the rendered text with
``add_special_tokens=False``, which keeps the template's bos from being doubled.

A turn ends at its end-of-turn token: the last of the tokens rollouts stop on (``turn_stop_ids``:
the eos token and the token the chat template closes an assistant turn with, e.g. Gemma's
``<end_of_turn>``, which is not its eos) among the turn's tokens. Text a template writes after it
(the newline after ChatML's ``<|im_end|>`` or Gemma's ``<end_of_turn>``) is formatting the model
never generates, so loss masks and response ids stop before it. A template whose turns hold no
such token keeps its turns whole.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Any

from jinja2 import TemplateError

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
        "renders every data row with it: set model.chat_template (a template string or a .jinja file), set "
        "model.tokenizer to a tokenizer that has one, or put a chat template in the model directory "
        "(chat_template.jinja, or 'chat_template' in tokenizer_config.json)"
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
    """Where the turn held by ``ids[start:end]`` ends: just after its last stop token
    (``turn_stop_ids``), or ``end`` when it holds none (a template that ends turns with plain
    text, or a tokenizer with neither eos nor an end-of-turn token)."""
    stops = set(turn_stop_ids(tokenizer))
    for position in range(end - 1, start - 1, -1):
        if ids[position] in stops:
            return position + 1
    return end


def turn_stop_ids(tokenizer: Any) -> list[int]:
    """The tokens that end a response: the tokenizer's eos, then the chat template's
    end-of-turn token when it is another one (``end_of_turn_token_ids``)."""
    eos = getattr(tokenizer, "eos_token_id", None)
    ids = [] if eos is None else [eos]
    return ids + [token for token in end_of_turn_token_ids(tokenizer) if token not in ids]


# A distinctive assistant text: no template alters it, and no tokenizer merges it with what follows.
_PROBE = "olingo end-of-turn probe"
# tokenizer -> (the chat template read, its end-of-turn ids): reading renders the template once
# per tokenizer instead of once per data row, and again only when its template is replaced.
_END_OF_TURN: weakref.WeakKeyDictionary[Any, tuple[str, list[int]]] = weakref.WeakKeyDictionary()


def end_of_turn_token_ids(tokenizer: Any) -> list[int]:
    """The special token the chat template closes an assistant turn with, as a one-id list,
    or [] when there is none (no template, or turns that end in plain text).

    Read by rendering [user, assistant "<probe>"] and taking the first token after the probe
    text, skipping whitespace (Llama-2 writes " </s>"): Gemma's ``<end_of_turn>``, ChatML's
    ``<|im_end|>``, Llama-3's ``<|eot_id|>``, Phi-3's ``<|end|>``. Instruct models do not
    always list it as an eos id (a GGUF file names one eos; Gemma's is ``<eos>``), yet the model
    ends every answer with it, so rollouts must stop there (docs/real-models.md).
    """
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        return []
    cached = _END_OF_TURN.get(tokenizer)
    if cached is None or cached[0] != template:
        cached = (template, _read_end_of_turn(tokenizer))
        _END_OF_TURN[tokenizer] = cached
    return list(cached[1])


def _read_end_of_turn(tokenizer: Any) -> list[int]:
    """`end_of_turn_token_ids`, uncached."""
    conversation = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _PROBE}]
    try:
        text = tokenizer.apply_chat_template(conversation, tokenize=False)
    except (TemplateError, ValueError, TypeError, KeyError, IndexError):
        return []  # a template that refuses this conversation: rendering data rows will say why
    at = text.rfind(_PROBE) if isinstance(text, str) else -1
    if at < 0:
        return []
    special = set(tokenizer.all_special_ids)
    special |= {token for token, added in getattr(tokenizer, "added_tokens_decoder", {}).items() if added.special}
    for token in tokenizer.encode(text[at + len(_PROBE):], add_special_tokens=False):
        if token in special:
            return [token]
        if tokenizer.decode([token]).strip():
            return []  # plain text closes the turn
    return []


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
