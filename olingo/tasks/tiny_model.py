"""A tiny Llama-style causal LM, built from a config with a seeded initialisation.

It is an ordinary `LlamaForCausalLM`, so the code that loads and trains it serves real
checkpoints unchanged. The input embedding and the output head are separate matrices
(`tie_word_embeddings=False`): with a 104-token vocabulary tying would save only ~7k
parameters, and untied weights spare FSDP/ZeRO-3/PEFT their tied-parameter special cases.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerBase


def build_tiny_llama(
    tokenizer: PreTrainedTokenizerBase,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 256,
    seed: int = 0,
) -> LlamaForCausalLM:
    """A freshly initialised float32 Llama sized to `tokenizer`, identical for identical arguments.

    `num_heads` defaults to 2, so the default hidden size 64 gives heads of 32 dimensions:
    vLLM's CPU attention refuses 16, and the model must run in every rollout engine. (4 heads of
    16 had the same parameters, initialised identically; 4 heads of 32 learnt the task worse.)
    `num_kv_heads` defaults to `num_heads` (plain multi-head attention). `intermediate_size`
    defaults to Llama's 8/3 x hidden rounded up to a multiple of 16, which gives the SwiGLU
    MLP about the parameters of a 4x GELU MLP. The global torch RNG is left untouched.
    """
    if intermediate_size is None:
        intermediate_size = -(-8 * hidden_size // (3 * 16)) * 16
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads or num_heads,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    # Weight init draws from the global generator; forking keeps callers' streams intact.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    # Generation reads these from generation_config, so a rollout stops on eos and pads with pad.
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def save_pretrained_pair(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, out_dir: str | Path
) -> Path:
    """Save model and tokenizer into one Hugging Face directory and return its path.

    The result loads with `AutoModelForCausalLM.from_pretrained(out_dir)` and
    `AutoTokenizer.from_pretrained(out_dir)`, like any checkpoint from the Hub.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
