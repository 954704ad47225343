"""Held-out accuracy of a causal LM on the arithmetic task (greedy decoding, exact answer)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from olingo.tasks.arithmetic import ArithmeticTask, is_correct


@torch.no_grad()
def greedy_accuracy(model_dir: str, task: ArithmeticTask | None = None, split: str = "eval", max_new_tokens: int = 6) -> float:
    """Share of `split` prompts whose greedy completion holds the right answer."""
    task = task or ArithmeticTask()
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    rows = task.prompt_rows(split)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": r["prompt"]}], add_generation_prompt=True, tokenize=False) for r in rows]
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    answers = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    return sum(is_correct(a, r["gt_answer"]) for a, r in zip(answers, rows, strict=True)) / len(rows)

