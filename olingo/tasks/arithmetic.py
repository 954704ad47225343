"""Small-number arithmetic: an embedded task whose answers a program can check.

Format. A prompt is the bare equation with a trailing equals sign and the completion is
the answer's digits, nothing else::

    prompt "12+7="   completion "19"
    prompt "15-8="   completion "7"
    prompt "4*6="    completion "24"     (only when "*" is among `ops`)

Operands run from 0 to `max_operand` inclusive. Subtraction is only posed with the
left operand at least the right one, so every answer is a non-negative integer written in
canonical form (no sign, no leading zeros, no spaces): the "format" a later reward checks.

Splits. The full set of problems is enumerated, shuffled by `random.Random(seed)` and cut
into a held-out eval part (`eval_fraction` of it) and a train part, so the two splits never
share a prompt and the same seed always gives the same splits in the same order.

Rows. `sft_rows`, `preference_rows` and `prompt_rows` give plain dicts in the column
layout the trainers read (prompt/completion, prompt/chosen/rejected, prompt/gt_answer);
the chat template is applied later, by whoever tokenizes them.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

Split = Literal["train", "eval"]
T = TypeVar("T")

# `int` on both sides keeps every answer exact; the table also fixes which ops exist.
_OPS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
}
# The first signed integer; a leading "+" or "-" only counts when a digit follows.
_INTEGER = re.compile(r"[-+]?\d+")


@dataclass(frozen=True)
class Problem:
    """One question with its canonical answer, e.g. `Problem("12+7=", "19")`."""

    prompt: str
    answer: str


@dataclass(frozen=True)
class _Equation:
    """The operands behind a problem; kept so wrong answers can be derived from them."""

    left: int
    op: str
    right: int

    @property
    def value(self) -> int:
        """The exact result of the equation."""
        return _OPS[self.op](self.left, self.right)

    def problem(self) -> Problem:
        """The equation in the task's prompt/answer format."""
        return Problem(prompt=f"{self.left}{self.op}{self.right}=", answer=str(self.value))


@dataclass(frozen=True)
class ArithmeticTask:
    """Arithmetic on operands 0..max_operand with held-out eval prompts.

    Attributes:
        max_operand: Largest operand. The default (20) gives 672 problems for "+" and
            "-": enough that a held-out split measures arithmetic rather than recall, small
            enough for a 2-layer, 64-wide model to learn on a CPU in minutes.
        ops: Operators to pose, a subset of "+", "-", "*".
        seed: Seed for the split, the row order and the wrong answers.
        eval_fraction: Share of the problems held out as the eval split.
    """

    max_operand: int = 20
    ops: tuple[str, ...] = ("+", "-")
    seed: int = 0
    eval_fraction: float = 0.1

    def __post_init__(self) -> None:
        """Reject configs that would give an empty split or an unknown operator."""
        if self.max_operand < 1:
            raise ValueError(f"max_operand must be >= 1, got {self.max_operand}")
        unknown = sorted(set(self.ops) - set(_OPS))
        if not self.ops or unknown:
            raise ValueError(f"ops must be a non-empty subset of {sorted(_OPS)}, got {self.ops!r}")
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in (0, 1), got {self.eval_fraction}")

    def problems(self, split: Split) -> list[Problem]:
        """The problems of one split, in the seed's order; train and eval are disjoint."""
        return [equation.problem() for equation in self._equations(split)]

    def sft_rows(self, split: Split, n: int | None = None) -> list[dict[str, str]]:
        """`{"prompt", "completion"}` rows; `n` larger than the split cycles through it again."""
        rows = [{"prompt": p.prompt, "completion": p.answer} for p in self.problems(split)]
        return _cycle(rows, n)

    def prompt_rows(self, split: Split, n: int | None = None) -> list[dict[str, str]]:
        """`{"prompt", "gt_answer"}` rows for rollouts and evaluation; `n` cycles as in `sft_rows`."""
        rows = [{"prompt": p.prompt, "gt_answer": p.answer} for p in self.problems(split)]
        return _cycle(rows, n)

    def preference_rows(self, split: Split, n: int | None = None) -> list[dict[str, str]]:
        """`{"prompt", "chosen", "rejected"}` rows: the right answer against a plausible wrong one.

        Row i uses problem i mod len(split), so `n` above the split size gives each problem
        several pairs; the k-th pair of a problem takes the k-th of its shuffled wrong
        answers (repeating only once they are used up). `None` gives one pair per problem.
        """
        equations = self._equations(split)
        n = len(equations) if n is None else n
        rng = random.Random(f"{self.seed}:preference:{split}")
        wrong: dict[int, list[int]] = {}
        rows = []
        for i in range(n):
            index, round_ = i % len(equations), i // len(equations)
            equation = equations[index]
            if index not in wrong:
                wrong[index] = _wrong_answers(equation, rng)
            candidates = wrong[index]
            rejected = candidates[round_ % len(candidates)]
            rows.append(
                {
                    "prompt": equation.problem().prompt,
                    "chosen": str(equation.value),
                    "rejected": str(rejected),
                }
            )
        return rows

    def _equations(self, split: Split) -> list[_Equation]:
        """Enumerate every equation, shuffle with the seed, and cut off the eval share."""
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        operands = range(self.max_operand + 1)
        equations = [
            _Equation(a, op, b)
            for op in self.ops
            for a in operands
            for b in operands
            if op != "-" or a >= b  # keeps every answer non-negative
        ]
        random.Random(self.seed).shuffle(equations)
        n_eval = min(max(1, round(self.eval_fraction * len(equations))), len(equations) - 1)
        return equations[:n_eval] if split == "eval" else equations[n_eval:]


def _wrong_answers(equation: _Equation, rng: random.Random) -> list[int]:
    """Plausible mistakes for one equation, distinct, never the right answer, in random order.

    Off by one or ten, digits reversed, another operator applied, and two other nearby numbers.
    Negative values are dropped because every right answer is non-negative: a minus sign
    would let a reward model tell the pair apart without doing any arithmetic.
    """
    value = equation.value
    candidates = [value - 1, value + 1, value - 10, value + 10]
    if value >= 10:
        candidates.append(int(str(value)[::-1]))
    candidates += [
        fn(equation.left, equation.right) for op, fn in _OPS.items() if op != equation.op
    ]
    nearby = [value + d for d in (-5, -4, -3, -2, 2, 3, 4, 5) if value + d >= 0]
    candidates += rng.sample(nearby, 2)
    unique = list(dict.fromkeys(c for c in candidates if c != value and c >= 0))
    rng.shuffle(unique)
    return unique


def _cycle(items: Sequence[T], n: int | None) -> list[T]:
    """The first `n` items of `items` repeated end to end; all of them once when `n` is None."""
    if n is None:
        return list(items)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return [items[i % len(items)] for i in range(n)]


def extract_answer(response: str) -> str | None:
    """The first integer in `response`, canonicalised (`" 019."` -> `"19"`), or None if there is none."""
    match = _INTEGER.search(response)
    return None if match is None else str(int(match.group()))


def is_correct(response: str, gt_answer: str) -> bool:
    """Whether the first integer in `response` equals `gt_answer` as a number."""
    predicted = extract_answer(response)
    return predicted is not None and predicted == extract_answer(gt_answer)


# ---- reward functions for the task (the registry knows them by name: arithmetic_exact, ...) ----
_CANONICAL_INTEGER = re.compile(r"0|[1-9][0-9]*")


def arithmetic_exact(prompt: str, response: str, gt_answer: str | None) -> float:
    """1.0 when the first integer of the response equals the ground truth, else 0.0."""
    if gt_answer is None:
        raise ValueError(f"arithmetic_exact needs a gt_answer for prompt {prompt!r}; add a 'gt_answer' field to the prompt data")
    return 1.0 if is_correct(response, gt_answer) else 0.0


def arithmetic_format(prompt: str, response: str, gt_answer: str | None) -> float:
    """1.0 when the response is one canonical non-negative integer and nothing else, else 0.0."""
    return 1.0 if _CANONICAL_INTEGER.fullmatch(response) else 0.0
