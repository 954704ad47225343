"""The benchmark workloads: models of two sizes and fixed token batches, written as files.

Every implementation (olingo, the minimal loop, TRL) loads the same Hugging Face directories and
the same token ids from these files, so they do exactly the same work:
- `policy/`: a Llama causal LM with the embedded char tokenizer;
- `reward/`, `value/`: `LlamaForSequenceClassification` (num_labels=1) from the same body, the
  reward model and the critic (TRL's value model has this format too);
- `pairs_L<len>.jsonl`: preference pairs {chosen_input_ids, rejected_input_ids} of one length;
- `prompts_P<len>.jsonl`: prompts {input_ids} of one length (no padding anywhere);
- `arith_n<rows>.jsonl`: arithmetic prompts {prompt, input_ids, gt_answer} ("37+45=", answer "82"),
  all of one length, for GRPO with the arithmetic checker as its reward;
- `dpo_P<prompt>_R<response>_n<rows>.jsonl`: DPO pairs {prompt_ids, chosen_ids, rejected_ids}, a
  prompt of one length and two responses of one length, each ending with the eos token.
Token ids are drawn uniformly from the non-special tokens with a fixed seed. The chosen row
differs from the rejected one by a learnable rule (it has more digits), so losses fall.

The real model (`build_real_models`, size "smollm2"): SmolLM2-135M-Instruct's weights (olingo's
conversion of the packaged GGUF, `builtin:smollm2`) as `smollm2/{policy,reward,value}/`, and data
in its BPE tokenizer: word sequences (`write_word_pairs`, `write_word_dpo_pairs`: every word one
token, so decoding and re-tokenizing gives back the ids, as TRL's DPOTrainer needs) and arithmetic
questions as text (`write_text_arithmetic_prompts`), each file of one length throughout.
"""

from __future__ import annotations

import copy
import json
import random
import re
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForSequenceClassification

from olingo.tasks.tiny_model import build_tiny_llama, save_pretrained_pair
from olingo.tasks.tokenizer import build_char_tokenizer

# name -> (hidden size, layers, attention heads)
SIZES = {"h128x2": (128, 2, 4), "h256x4": (256, 4, 4)}


def build_models(root: Path, size: str) -> dict[str, str]:
    """policy/, reward/ and value/ directories for `size` under root/size (built once)."""
    hidden, layers, heads = SIZES[size]
    out = root / size
    paths = {name: str(out / name) for name in ("policy", "reward", "value")}
    if (out / "value" / "config.json").exists():
        return paths
    tokenizer = build_char_tokenizer(model_max_length=512)
    policy = build_tiny_llama(tokenizer, hidden_size=hidden, num_layers=layers, num_heads=heads, max_position_embeddings=512, seed=0)
    # Generation never stops early: every implementation produces exactly response_length tokens.
    policy.generation_config.eos_token_id = None
    save_pretrained_pair(policy, tokenizer, paths["policy"])
    for seed, name in ((1, "reward"), (2, "value")):
        config = copy.deepcopy(policy.config)
        config.num_labels = 1
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = LlamaForSequenceClassification(config)
        save_pretrained_pair(model, tokenizer, paths[name])
    return paths


def content_token_ids() -> tuple[list[int], list[int]]:
    """Ids of ordinary characters, and the digit ids among them."""
    tokenizer = build_char_tokenizer()
    special = set(tokenizer.all_special_ids)
    ids = [i for i in range(len(tokenizer)) if i not in special]
    digits = [tokenizer.convert_tokens_to_ids(c) for c in "0123456789"]
    return ids, digits


def write_pairs(root: Path, length: int, rows: int, seed: int = 0) -> str:
    """`rows` preference pairs of `length` tokens each; chosen rows are digit-rich."""
    path = root / f"pairs_L{length}_n{rows}.jsonl"
    if path.exists():
        return str(path)
    ids, digits = content_token_ids()
    return write_pair_rows(path, ids, digits, length, rows, seed)


def write_pair_rows(path: Path, vocab: list[int], rich: list[int], length: int, rows: int, seed: int, prompt_length: int = 0) -> str:
    """Reward-model pairs into `path`: each chosen token is from `rich` with probability 1/2 (else
    `vocab`), each rejected token from `vocab`; with `prompt_length`, both rows of a pair start with
    the same `prompt_length` tokens from `vocab` (a prompt), then `length - prompt_length` of their own."""
    rng = random.Random(seed)
    with path.open("w") as handle:
        for _ in range(rows):
            prompt = [rng.choice(vocab) for _ in range(prompt_length)]
            chosen = prompt + [rng.choice(rich) if rng.random() < 0.5 else rng.choice(vocab) for _ in range(length - prompt_length)]
            rejected = prompt + [rng.choice(vocab) for _ in range(length - prompt_length)]
            handle.write(json.dumps({"chosen_input_ids": chosen, "rejected_input_ids": rejected}) + "\n")
    return str(path)


def write_dpo_pairs(root: Path, prompt_length: int, response_length: int, rows: int, seed: int = 0) -> str:
    """`rows` DPO pairs: a prompt of `prompt_length` tokens and two responses of `response_length`
    tokens each (the last one the eos token, as a tokenised response ends); chosen responses are
    digit-rich. No "<" is drawn, so the decoded text of any row never spells a special token and
    re-tokenising it gives back exactly these ids (TRL's DPOTrainer takes text; see trl/dpo_trl.py)."""
    path = root / f"dpo_P{prompt_length}_R{response_length}_n{rows}.jsonl"
    if path.exists():
        return str(path)
    tokenizer = build_char_tokenizer()
    ids, digits = content_token_ids()
    ids = [i for i in ids if i != tokenizer.convert_tokens_to_ids("<")]
    return write_dpo_rows(path, ids, digits, tokenizer.eos_token_id, prompt_length, response_length, rows, seed)


def write_dpo_rows(path: Path, vocab: list[int], rich: list[int], eos: int, prompt_length: int, response_length: int, rows: int, seed: int) -> str:
    """DPO rows into `path`: a prompt from `vocab`, responses of `response_length` tokens ending
    with `eos`; chosen tokens from `rich` with probability 1/2, rejected ones from `vocab`."""
    body = response_length - 1
    rng = random.Random(seed)
    with path.open("w") as handle:
        for _ in range(rows):
            prompt = [rng.choice(vocab) for _ in range(prompt_length)]
            chosen = [rng.choice(rich) if rng.random() < 0.5 else rng.choice(vocab) for _ in range(body)] + [eos]
            rejected = [rng.choice(vocab) for _ in range(body)] + [eos]
            handle.write(json.dumps({"prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected}) + "\n")
    return str(path)


def write_prompts(root: Path, length: int, rows: int, seed: int = 0) -> str:
    """`rows` prompts of `length` tokens each."""
    path = root / f"prompts_P{length}_n{rows}.jsonl"
    if path.exists():
        return str(path)
    ids, _ = content_token_ids()
    rng = random.Random(seed)
    with path.open("w") as handle:
        for _ in range(rows):
            handle.write(json.dumps({"input_ids": [rng.choice(ids) for _ in range(length)]}) + "\n")
    return str(path)


def read_jsonl(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def write_arithmetic_prompts(root: Path, rows: int, seed: int = 0) -> str:
    """`rows` distinct problems "ab+cd=" / "ab-cd=" (two-digit operands, so every prompt has 6
    tokens and nothing is padded) with their answers: {prompt, input_ids, gt_answer}."""
    path = root / f"arith_n{rows}.jsonl"
    if path.exists():
        return str(path)
    tokenizer = build_char_tokenizer()
    problems = [(a, op, b) for a in range(10, 100) for b in range(10, 100) for op in "+-" if op == "+" or a >= b]
    random.Random(seed).shuffle(problems)
    with path.open("w") as handle:
        for a, op, b in problems[:rows]:
            text = f"{a}{op}{b}="
            handle.write(json.dumps({"prompt": text, "input_ids": tokenizer(text)["input_ids"], "gt_answer": str(a + b if op == "+" else a - b)}) + "\n")
    return str(path)


# ---- the real model ---------------------------------------------------------------------------
REAL_SOURCE = "builtin:smollm2"
REAL_PAD = "<|endoftext|>"


def model_dirs(out: Path, source: str) -> tuple[dict[str, str], str, AutoTokenizer | None]:
    """The policy/, reward/ and value/ paths under `out`, the resolved `source` and its tokenizer
    with the benchmark's pad token; the tokenizer is None when the directories are built already."""
    from olingo.recipes.common import resolve_model_path

    paths = {name: str(out / name) for name in ("policy", "reward", "value")}
    if (out / "value" / "config.json").exists():
        return paths, source, None
    src = resolve_model_path(source)
    tokenizer = AutoTokenizer.from_pretrained(src)
    tokenizer.pad_token = REAL_PAD
    return paths, src, tokenizer


def build_real_models(root: Path, source: str = REAL_SOURCE) -> dict[str, str]:
    """policy/, reward/ and value/ under root/smollm2 from SmolLM2-135M-Instruct (built once).

    The policy is the converted causal LM with two changes every implementation sees alike: the
    pad token is <|endoftext|> (the shipped pad is the eos <|im_end|>, which TRL's PPO reads as the
    end of a response and a sequence-classification head skips when it looks for the last token),
    and generation_config names no eos, so every response runs to its full length as in the tiny
    workloads. reward/ and value/ are LlamaForSequenceClassification: the same body, a fresh
    1-output head (seeds 1 and 2)."""
    paths, src, tokenizer = model_dirs(root / "smollm2", source)
    if tokenizer is None:
        return paths
    policy = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    policy.config.pad_token_id = policy.generation_config.pad_token_id = tokenizer.pad_token_id
    policy.generation_config.eos_token_id = None
    save_pretrained_pair(policy, tokenizer, paths["policy"])
    for seed, name in ((1, "reward"), (2, "value")):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = LlamaForSequenceClassification.from_pretrained(src, num_labels=1, dtype=torch.float32)
        model.config.pad_token_id = tokenizer.pad_token_id
        save_pretrained_pair(model, tokenizer, paths[name])
    return paths


BIG_VOCAB = 262_144  # Gemma 3's vocabulary size
BIG_VOCAB_LAYERS = 4


def build_big_vocab_models(root: Path, source: str = REAL_SOURCE, vocab: int = BIG_VOCAB, layers: int = BIG_VOCAB_LAYERS) -> dict[str, str]:
    """policy/, reward/ and value/ under root/vocab{vocab}: random-init models of SmolLM2's shape
    (hidden 576, 9 heads / 3 KV heads, MLP 1536, tied embeddings) with `layers` layers and a
    `vocab`-token vocabulary, with SmolLM2's tokenizer (its 49,152 ids are a subset, so the real
    workloads' data serve unchanged). The output head then holds most of the parameters and the
    logits most of a step's memory: what a chunked log-prob path changes. Set up as
    `build_real_models` sets up the real policy (pad <|endoftext|>, no eos in generation)."""
    from transformers import AutoConfig

    paths, src, tokenizer = model_dirs(root / f"vocab{vocab}_l{layers}", source)
    if tokenizer is None:
        return paths
    config = AutoConfig.from_pretrained(src)
    config.vocab_size, config.num_hidden_layers, config.pad_token_id = vocab, layers, tokenizer.pad_token_id
    for seed, name in ((0, "policy"), (1, "reward"), (2, "value")):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if name == "policy":
                model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
                model.generation_config.pad_token_id, model.generation_config.eos_token_id = tokenizer.pad_token_id, None
            else:
                scored = copy.deepcopy(config)
                scored.num_labels = 1
                model = LlamaForSequenceClassification(scored)
        save_pretrained_pair(model, tokenizer, paths[name])
    return paths


def single_token_words(tokenizer_dir: str) -> list[int]:
    """Ids of the tokens that are a space and 3-10 lowercase letters and that the tokenizer gives
    back for that text alone: a sequence of them decodes and re-tokenizes to the same ids."""
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    word = re.compile(r" [a-z]{3,10}")
    ids = []
    for i in range(len(tokenizer)):
        text = tokenizer.decode([i])
        if word.fullmatch(text) and tokenizer(text, add_special_tokens=False)["input_ids"] == [i]:
            ids.append(i)
    return ids


def write_word_pairs(root: Path, tokenizer_dir: str, length: int, rows: int, seed: int = 0, prompt_length: int = 0) -> str:
    """`rows` preference pairs of `length` word tokens each; half of a chosen row's words come from
    the first tenth of the word list, so a reward model can learn to prefer it. With `prompt_length`,
    a pair's rows share their first `prompt_length` words (as pairs of responses to one prompt do)."""
    path = root / (f"words_pairs_L{length}_n{rows}.jsonl" if not prompt_length else f"words_pairs_P{prompt_length}_L{length}_n{rows}.jsonl")
    if path.exists():
        return str(path)
    words = single_token_words(tokenizer_dir)
    return write_pair_rows(path, words, words[: len(words) // 10], length, rows, seed, prompt_length)


def write_word_dpo_pairs(root: Path, tokenizer_dir: str, prompt_length: int, response_length: int, rows: int, seed: int = 0) -> str:
    """DPO pairs in word tokens, as `write_dpo_pairs`: a prompt of `prompt_length` words, two
    responses of `response_length` tokens each ending with the eos; chosen ones rich in the first
    tenth of the word list."""
    path = root / f"words_dpo_P{prompt_length}_R{response_length}_n{rows}.jsonl"
    if path.exists():
        return str(path)
    words = single_token_words(tokenizer_dir)
    eos = AutoTokenizer.from_pretrained(tokenizer_dir).eos_token_id
    return write_dpo_rows(path, words, words[: len(words) // 10], eos, prompt_length, response_length, rows, seed)


def write_text_arithmetic_prompts(root: Path, tokenizer_dir: str, rows: int, seed: int = 0) -> str:
    """`rows` questions "Q: What is ab+cd?\\nA:" (or a-b) in the real tokenizer, {prompt, input_ids,
    gt_answer}; its digits are single tokens, so every prompt has the same length (checked)."""
    path = root / f"text_arith_n{rows}.jsonl"
    if path.exists():
        return str(path)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    problems = [(a, op, b) for a in range(10, 100) for b in range(10, 100) for op in "+-" if op == "+" or a >= b]
    random.Random(seed).shuffle(problems)
    lines = []
    for a, op, b in problems[:rows]:
        text = f"Q: What is {a}{op}{b}?\nA:"
        lines.append({"prompt": text, "input_ids": tokenizer(text)["input_ids"], "gt_answer": str(a + b if op == "+" else a - b)})
    if len({len(row["input_ids"]) for row in lines}) != 1:
        raise RuntimeError(f"{tokenizer_dir}: the arithmetic prompts do not all tokenize to one length")
    path.write_text("".join(json.dumps(row) + "\n" for row in lines))
    return str(path)
