"""A character-level tokenizer with a chat template, built offline with `tokenizers`.

Vocabulary (104 ids): eight special tokens, then newline, then printable ASCII 32..126::

    0 <pad>   1 <unk>   2 <s> (bos)   3 </s> (eos, the stop token)
    4 <|system|>   5 <|user|>   6 <|assistant|>   7 <|end|>

Every character is one token and `decode` concatenates them, so `decode(encode(s)) == s`
for any printable-ASCII `s`, spaces included. Encoding adds no special tokens: the chat
template writes `<s>` itself, so encoding a rendered chat never doubles it.

Chat template. A conversation renders as::

    <s><|system|>...<|end|><|user|>12+7=<|end|><|assistant|>19</s>

System and user turns end with `<|end|>`; an assistant turn ends with the eos token `</s>`,
so a rollout stops on `eos_token_id` (3), the id `generate` already stops on.
`add_generation_prompt=True` ends the text with `<|assistant|>`. The assistant content and
its `</s>` sit inside `{% generation %}`, so `return_assistant_tokens_mask=True` marks exactly
the tokens a model should learn to produce. Since every character and marker is its own
token, the tokens of a rendered prompt are always a prefix of the tokens of the same prompt
followed by its answer.
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"
SYSTEM, USER, ASSISTANT, END = "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"
SPECIAL_TOKENS = (PAD, UNK, BOS, EOS, SYSTEM, USER, ASSISTANT, END)
# The token that ends an assistant turn; rollouts stop on it.
STOP_TOKEN = EOS
CHARACTERS = ("\n", *(chr(code) for code in range(32, 127)))

# Tokens are spelled out (not spliced from the constants above) so the template reads as
# the text it renders; a test checks the two agree.
CHAT_TEMPLATE = (
    "<s>"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "<|assistant|>{% generation %}{{ message['content'] }}</s>{% endgeneration %}"
    "{% elif message['role'] in ('system', 'user') %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{% else %}"
    "{{ raise_exception('unknown role ' ~ message['role'] ~ ', expected system/user/assistant') }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_char_tokenizer(model_max_length: int = 256) -> PreTrainedTokenizerFast:
    """The character-level tokenizer described in the module docstring, padding on the right."""
    vocab = {token: index for index, token in enumerate((*SPECIAL_TOKENS, *CHARACTERS))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Oniguruma's "." skips newlines; "[\s\S]" isolates every character, newline included.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    # Without a decoder `tokenizers` joins tokens with spaces; Fuse concatenates them.
    backend.decoder = decoders.Fuse()
    # Registered as special so "<|user|>" in text is one token, not eight characters.
    backend.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        unk_token=UNK,
        bos_token=BOS,
        eos_token=EOS,
        extra_special_tokens=[SYSTEM, USER, ASSISTANT, END],
        padding_side="right",
        model_max_length=model_max_length,
        # Cleanup would turn "a ." into "a." and break the exact round trip.
        clean_up_tokenization_spaces=False,
        chat_template=CHAT_TEMPLATE,
    )
