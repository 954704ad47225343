"""Benchmarks: scores of a run's model on held-out data, in the loop or after training.

| kind         | scores                                                 | metrics            |
|--------------|--------------------------------------------------------|--------------------|
| `arithmetic` | greedy answers of the embedded arithmetic task's held-out prompts, checked exactly | `accuracy`, `n`; breakdown by operator |

A benchmark scores a live model (`score`, used in the loop every `run_every` optimizer steps) or
a saved model directory (`evaluate_dir`, after training). Metrics are logged under the
benchmark's name (`arithmetic/accuracy`); every scored row is kept as a prediction
(`{prompt, response, gt_answer, correct}`), which loggers save as JSONL.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import Field

from olingo.config import ConfigError, StrictModel
from olingo.config_errors import did_you_mean
from olingo.experiment.config import BenchmarkSpec
from olingo.experiment.results import EvalResult
from olingo.trainer.loop_support import EvalOutput

OPERATOR = re.compile(r"\d\s*([+\-*/x])\s*\d")


class ArithmeticParams(StrictModel):
    """Parameters of the `arithmetic` benchmark."""

    data: str = Field("builtin:prompts_eval", description="JSONL of {prompt, gt_answer} rows (default: the held-out split)")
    limit: int | None = Field(None, ge=1, description="score only the first N rows")
    max_new_tokens: int = Field(6, ge=1, description="answer tokens at most (greedy decoding)")
    batch_size: int = Field(128, ge=1, description="prompts per generate call")


def operator_of(prompt: str) -> str:
    """'12+7=' -> '+': the operator of an arithmetic prompt ('?' when there is none)."""
    match = OPERATOR.search(prompt)
    return match.group(1) if match else "?"


def accuracy_by(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    """Share of correct rows per value of `rows[i][key]`."""
    totals: dict[str, list[int]] = {}
    for row in rows:
        counts = totals.setdefault(str(row[key]), [0, 0])
        counts[0] += int(bool(row["correct"]))
        counts[1] += 1
    return {value: correct / n for value, (correct, n) in sorted(totals.items())}


def read_prompt_rows(path: str, limit: int | None) -> list[dict[str, str]]:
    """{prompt, gt_answer} rows of a JSONL file; a bad row is an error naming file and line."""
    rows = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ConfigError(f"benchmark data file not found: {path}") from None
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or row.get("gt_answer") is None:
            raise ConfigError(f"{path}, line {lineno}: a benchmark row needs a string 'prompt' and a 'gt_answer'")
        rows.append({"prompt": row["prompt"], "gt_answer": str(row["gt_answer"])})
    return rows[:limit] if limit else rows


@torch.no_grad()
def greedy_answers(model: Any, tokenizer: Any, prompts: list[str], max_new_tokens: int, batch_size: int) -> list[str]:
    """The greedy completion of each prompt, rendered as a user turn by the chat template."""
    device = next(model.parameters()).device
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False) for p in prompts]
    answers: list[str] = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(texts[start:start + batch_size], return_tensors="pt", padding=True, add_special_tokens=False, padding_side="left").to(device)
        out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        answers += tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    return answers


class ArithmeticBenchmark:
    """Held-out accuracy of the embedded arithmetic task: greedy answers, checked exactly."""

    kind = "arithmetic"
    needs_generation = True  # scores a causal LM's answers: not applicable to reward models

    def __init__(self, name: str, params: ArithmeticParams, run_every: int = 0) -> None:
        from olingo.recipes.common import resolve_path

        self.name, self.params, self.run_every = name, params, run_every
        self.rows = read_prompt_rows(resolve_path(params.data), params.limit)

    def score(self, model: Any, tokenizer: Any, step: int | None, tags: dict[str, str]) -> tuple[EvalResult, list[dict]]:
        """Score a live model (left in whatever mode the caller chose)."""
        from olingo.tasks import is_correct

        start = time.perf_counter()
        p = self.params
        answers = greedy_answers(model, tokenizer, [r["prompt"] for r in self.rows], p.max_new_tokens, p.batch_size)
        predictions = [
            {**row, "response": answer, "correct": bool(is_correct(answer, row["gt_answer"])), "op": operator_of(row["prompt"])}
            for row, answer in zip(self.rows, answers, strict=True)
        ]
        accuracy = sum(r["correct"] for r in predictions) / max(len(predictions), 1)
        result = EvalResult(
            name=self.name, metrics={"accuracy": accuracy, "n": len(predictions)},
            breakdowns={"op": accuracy_by(predictions, "op")}, eval_seconds=time.perf_counter() - start,
            step=step, tags={**tags, "kind": self.kind},
        )
        return result, predictions

    def evaluate_dir(self, model_dir: str, tags: dict[str, str]) -> tuple[EvalResult, list[dict]]:
        """Score a saved model directory (with its tokenizer) after training: step is None."""
        from olingo.models import load_causal_lm, load_tokenizer

        tokenizer = load_tokenizer(model_dir, padding_side="left")
        model = load_causal_lm(model_dir).eval()
        return self.score(model, tokenizer, None, tags)


BENCHMARKS: dict[str, tuple[type[StrictModel], type[ArithmeticBenchmark]]] = {
    "arithmetic": (ArithmeticParams, ArithmeticBenchmark),
}


def build_benchmark(spec: BenchmarkSpec) -> ArithmeticBenchmark:
    """A benchmark from its spec; unknown kinds and parameters are errors with a did-you-mean."""
    if spec.kind not in BENCHMARKS:
        raise ConfigError(f"unknown benchmark kind '{spec.kind}'{did_you_mean(spec.kind, BENCHMARKS)}; known: {', '.join(BENCHMARKS)}")
    params_model, cls = BENCHMARKS[spec.kind]
    try:
        params = params_model.model_validate(spec.params)
    except ValueError as err:
        raise ConfigError(f"benchmark '{spec.label}': invalid params: {err}") from None
    return cls(spec.label, params, spec.run_every)


@dataclass
class InLoopBenchmark:
    """A benchmark as a trainer evaluator (`olingo.trainer.loop_support.Evaluator`) for one run."""

    benchmark: ArithmeticBenchmark
    tags: dict[str, str]

    @property
    def name(self) -> str:
        return self.benchmark.name

    @property
    def every(self) -> int:
        return self.benchmark.run_every

    def __call__(self, model: Any, tokenizer: Any, step: int) -> EvalOutput:
        result, predictions = self.benchmark.score(model, tokenizer, step, self.tags)
        return EvalOutput(prefixed(self.name, result.metrics), predictions, result)


def prefixed(name: str, metrics: dict[str, float]) -> dict[str, float]:
    """{'accuracy': 0.5} -> {'<name>/accuracy': 0.5}: benchmark metrics as they are logged."""
    return {f"{name}/{key}": value for key, value in metrics.items()}
