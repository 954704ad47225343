"""Arithmetic word problems in plain English, answered by a number a program checks.

The real-model demo's task (`olingo demo --model smollm2`): one-step problems a small instruct
model gets right only some of the time, so reinforcement from a verifier has room to help::

    "Mia has 34 stickers. She gets 15 more. How many stickers does Mia have now? End your
     reply with the answer as a number."                                    gt_answer "49"

Three kinds of problem, each with its own phrasings: addition and subtraction of numbers up
to `max_operand`, and multiplication of factors 2..9 (bags of items, rows of seats). The
answer is always a non-negative integer; the verifier is `math_answer` (the last number of the
response equals it), and `ends_with_number` (a reward function, referenced as
`olingo.tasks.word_problems:ends_with_number`) is the format the instruction asks for.

Splits: problems are drawn from `random.Random(seed)`; the eval split is drawn first and the
train split never repeats an eval question, so evaluation is on held-out questions.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

INSTRUCTION = "End your reply with the answer as a number."
NAMES = ("Sam", "Mia", "Leo", "Ana", "Tom", "Zoe", "Ben", "Ivy", "Max", "Eva", "Noah", "Lily")
ITEMS = ("apples", "marbles", "books", "stickers", "coins", "pens", "cards", "shells", "stamps", "cookies")
PRONOUN = {"Sam": "He", "Leo": "He", "Tom": "He", "Ben": "He", "Max": "He", "Noah": "He"}  # others: She

_ADD = (
    "{n} has {a} {it}. {p} gets {b} more. How many {it} does {n} have now?",
    "{n} had {a} {it} and found {b} more. How many {it} does {n} have?",
    "There are {a} {it} in a box and {b} in another box. How many {it} are there in total?",
)
_SUB = (
    "{n} has {a} {it} and gives away {b}. How many {it} are left?",
    "{n} had {a} {it}. {p} lost {b} of them. How many {it} does {n} have now?",
    "A jar holds {a} {it}. {n} takes {b} out. How many {it} are still in the jar?",
)
_MUL = (
    "{n} has {a} bags with {b} {it} in each bag. How many {it} does {n} have?",
    "There are {a} rows of {it} with {b} {it} in each row. How many {it} are there?",
    "{n} buys {a} packs of {it}. Each pack has {b} {it}. How many {it} does {n} buy?",
)
_ENDS_WITH_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?\s*[.!]?\s*$")


@dataclass(frozen=True)
class WordProblemTask:
    """Generated word problems with held-out eval questions.

    Attributes:
        max_operand: Largest addend, minuend and subtrahend (factors are 2..9).
        seed: Seed of the problem draws.
        instruction: Appended to every question; it asks for the format `ends_with_number` checks.
    """

    max_operand: int = 60
    seed: int = 0
    instruction: str = INSTRUCTION

    def prompt_rows(self, train: int, eval: int) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
        """(`train` rows, `eval` rows) of {"prompt", "gt_answer"}; no train question is an eval question."""
        rng = random.Random(self.seed)
        eval_rows = _distinct(lambda: self._problem(rng), eval, set())
        train_rows = _distinct(lambda: self._problem(rng), train, {r["prompt"] for r in eval_rows})
        return train_rows, eval_rows

    def _problem(self, rng: random.Random) -> dict[str, str]:
        kind = rng.randrange(3)
        name, items = rng.choice(NAMES), rng.choice(ITEMS)
        if kind == 0:
            a, b = rng.randint(2, self.max_operand), rng.randint(2, self.max_operand)
            template, answer = rng.choice(_ADD), a + b
        elif kind == 1:
            a = rng.randint(10, self.max_operand)
            b = rng.randint(1, a - 1)
            template, answer = rng.choice(_SUB), a - b
        else:
            a, b = rng.randint(2, 9), rng.randint(2, 9)
            template, answer = rng.choice(_MUL), a * b
        question = template.format(n=name, p=PRONOUN.get(name, "She"), a=a, b=b, it=items)
        return {"prompt": f"{question} {self.instruction}", "gt_answer": str(answer)}


def _distinct(draw, count: int, taken: set[str]) -> list[dict[str, str]]:  # draw: () -> row
    """`count` rows from `draw` whose prompts are not in `taken` nor repeated (`taken` is updated)."""
    rows: list[dict[str, str]] = []
    while len(rows) < count:
        row = draw()
        if row["prompt"] not in taken:
            taken.add(row["prompt"])
            rows.append(row)
    return rows


def ends_with_number(prompt: str, response: str, gt_answer: str | None) -> float:
    """1.0 when the response ends with a number (optionally followed by '.' or '!'), the format
    the task's instruction asks for; whether the number is right is `math_answer`'s question."""
    return 1.0 if _ENDS_WITH_NUMBER.search(response) else 0.0
