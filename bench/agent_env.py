"""The multi-turn workload both agent runners share (`bench/agent_run.py`, `bench/trl/agent_trl.py`).

One environment, two faces: a tool `lookup()` that answers every call with the same text. TRL 1.16's
`GRPOTrainer(environment_factory=...)` exposes an environment's public methods as tools and keeps
generating while a turn parses to a tool call (`_tool_call_loop`, at most `max_tool_calling_iterations`
rounds); olingo's `MultiTurnSource` steps a `ToolEnvironment` after every turn that ended with a stop
token until `max_turns`. For both to run the same turns and tokens, every turn must be the same tool
call ended by the end-of-turn token, whatever the sampled tokens: the policy here is the tiny Llama of
`bench/workload.py` (hidden 128, 2 layers) trained beforehand (`build_agent_policy`, a few hundred
steps of next-token loss on scripted episodes) to write exactly `TURN` after every assistant header.
Sampling at temperature 1 still runs the full softmax over the vocabulary each token; the scripted
policy just puts (almost) all its mass on one token, so turns have a fixed length on both sides (the
runners count tokens by role and report them).

The tokenizer is characters plus `<pad>`, `<unk>`, `<|im_start|>` and `<|im_end|>` (eos, the stop
token), with a compact ChatML template that renders tool calls Hermes-style and tool results as a
`tool` turn (prefix-preserving, as both trainers require), and the response template of Qwen3 (the
`qwen3_template` of TRL's `trl/chat_template_utils.py`), so `tokenizer.parse_response` reads the calls
on both sides. Nothing here imports olingo at module level: the TRL venv imports it too.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

TOOL_NAME = "lookup"
TOOL_RESULT = "the value is 42"
TURN = '<tool_call>\n{"name": "lookup", "arguments": {}}\n</tool_call>'
PAD, UNK, IM_START, IM_END = "<pad>", "<unk>", "<|im_start|>", "<|im_end|>"
CHARACTERS = ("\n", *(chr(code) for code in range(32, 127)))
# After training, the scripted token has probability >= 0.998 at every position; logits x 4 (sampling at
# temperature 1 from them is sampling the trained model at 1/4) make a deviation within a run improbable.
SHARPEN = 4.0

# ChatML without a system default; `tools=` is accepted and not rendered, so both runners' prompts
# are the user turn alone. Arguments render as JSON (a string is written as it is).
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}{%- endif -%}"
    "{%- if message['tool_calls'] is defined and message['tool_calls'] -%}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- set f = call['function'] if call['function'] is defined else call -%}"
    "{%- set args = f['arguments'] if f['arguments'] is string else (f['arguments'] | tojson) -%}"
    "{{ '<tool_call>\n{\"name\": \"' + f['name'] + '\", \"arguments\": ' + args + '}\n</tool_call>' }}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{ '<|im_end|>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\n' }}{%- endif -%}"
)

# transformers' response template (>= 5.13) for the Hermes / Qwen3 format: TRL's `qwen3_template`.
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "reasoning_content": {"open": "<think>", "close_pattern": r"</think>\s*", "content": "text"},
        "tool_calls": {
            "open": "<tool_call>", "close_pattern": r"</tool_call>\s*", "repeats": True, "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def build_agent_tokenizer(model_max_length: int = 1024):
    """The character tokenizer of this workload (see the module docstring)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = (PAD, UNK, IM_START, IM_END)
    vocab = {token: index for index, token in enumerate((*specials, *CHARACTERS))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=PAD, unk_token=UNK, eos_token=IM_END, extra_special_tokens=[IM_START],
        padding_side="left", model_max_length=model_max_length, clean_up_tokenization_spaces=False, chat_template=CHAT_TEMPLATE,
    )
    tokenizer.response_template = RESPONSE_TEMPLATE
    return tokenizer


def load_agent_tokenizer(path: str):
    """The saved tokenizer, with the response template set (whether or not the file kept it)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    tokenizer.response_template = RESPONSE_TEMPLATE
    return tokenizer


def user_messages(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def tool_reply_ids(tokenizer) -> list[int]:
    """The tokens between two turns: what follows the end-of-turn token up to the next assistant header."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "u"}, {"role": "assistant", "content": TURN}, {"role": "tool", "name": TOOL_NAME, "content": TOOL_RESULT}],
        add_generation_prompt=True, tokenize=False,
    )
    end = text.index(IM_END, text.index(TURN)) + len(IM_END)  # the end of the assistant turn
    return tokenizer.encode(text[end:], add_special_tokens=False)


def scripted_episode(tokenizer, prompt: str, turns: int) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of one scripted episode: the templated prompt, then `turns` times TURN + eos,
    tool replies between them; the mask is 1 on the turns' tokens."""
    prompt_ids = tokenizer.apply_chat_template(user_messages(prompt), add_generation_prompt=True, tokenize=True, return_dict=False)
    turn = tokenizer.encode(TURN, add_special_tokens=False) + [tokenizer.eos_token_id]
    reply = tool_reply_ids(tokenizer)
    ids, mask = list(prompt_ids), [0] * len(prompt_ids)
    for k in range(turns):
        ids, mask = ids + turn, mask + [1] * len(turn)
        if k < turns - 1:
            ids, mask = ids + reply, mask + [0] * len(reply)
    return ids, mask


def build_agent_policy(root: Path, prompts_path: str, max_turns: int = 5, steps: int = 250, seed: int = 0) -> str:
    """`root/agent_policy`: the h128x2 Llama taught to answer every assistant header with TURN + eos
    (built once; the next-token loss on scripted episodes of 1..max_turns turns, AdamW lr 3e-3).
    Returns its directory."""
    import torch

    from olingo.tasks.tiny_model import build_tiny_llama, save_pretrained_pair

    out = root / f"agent_policy_t{max_turns}"
    if (out / "config.json").exists():
        return str(out)
    tokenizer = build_agent_tokenizer()
    policy = build_tiny_llama(tokenizer, hidden_size=128, num_layers=2, num_heads=4, max_position_embeddings=1024, seed=seed)
    rows = [json.loads(line)["prompt"] for line in Path(prompts_path).read_text().splitlines() if line.strip()]
    rng = random.Random(seed)
    optim = torch.optim.AdamW(policy.parameters(), lr=3e-3, weight_decay=0.0)
    policy.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for step in range(steps):
            episodes = [scripted_episode(tokenizer, rng.choice(rows), rng.randint(1, max_turns)) for _ in range(8)]
            width = max(len(ids) for ids, _ in episodes)
            ids = torch.tensor([i + [tokenizer.pad_token_id] * (width - len(i)) for i, _ in episodes])
            mask = torch.tensor([m + [0] * (width - len(m)) for _, m in episodes], dtype=torch.bool)
            logits = policy(input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id).long()).logits[:, :-1]
            loss = torch.nn.functional.cross_entropy(logits[mask[:, 1:]], ids[:, 1:][mask[:, 1:]])
            loss.backward()
            optim.step()
            optim.zero_grad(set_to_none=True)
            if step % 50 == 0:
                print(f"[agent policy] step {step}: loss {loss.item():.5f}", flush=True)
    policy.eval()
    with torch.no_grad():  # logits x SHARPEN (the head is linear after the final norm): a turn samples the same text every time
        policy.model.norm.weight.mul_(SHARPEN)
    policy.generation_config.eos_token_id = tokenizer.eos_token_id
    policy.generation_config.pad_token_id = tokenizer.pad_token_id
    save_pretrained_pair(policy, tokenizer, out)
    return str(out)


def write_agent_prompts(root: Path, arithmetic_path: str, tokenizer_dir: str) -> str:
    """The arithmetic prompts ("37+45=") as rows {prompt, input_ids}: input_ids are the templated
    user turn and assistant header, exactly as TRL renders a conversational prompt."""
    path = root / "agent_prompts.jsonl"
    tokenizer = load_agent_tokenizer(tokenizer_dir)
    lines = []
    for line in Path(arithmetic_path).read_text().splitlines():
        row = json.loads(line)
        ids = tokenizer.apply_chat_template(user_messages(row["prompt"]), add_generation_prompt=True, tokenize=True, return_dict=False)
        lines.append(json.dumps({"prompt": row["prompt"], "input_ids": list(ids), "gt_answer": row["gt_answer"]}))
    path.write_text("\n".join(lines) + "\n")
    return str(path)


class TRLLookupEnv:
    """TRL's face of the environment: `reset(**row)`, one tool method, and `get_reward` (TRL calls it
    once per finished rollout; constant 0, as olingo's episodes that end at max_turns score 0)."""

    def reset(self, **row) -> None:
        self.calls = 0

    def lookup(self) -> str:
        """Look the value up.

        Returns:
            The value.
        """
        self.calls += 1
        return TOOL_RESULT

    def get_reward(self) -> float:
        return 0.0
