"""A built-in tool environment, `calculator` (docs/agents.md): the policy may call one tool,
`calculate(expression)`, on arithmetic word problems whose numbers are too large for a small
model's own arithmetic, and is rewarded when its final answer (a turn without a call) is right.

    user       Mia has 4521 stickers. She gets 3877 more. How many ...? End your reply with ...
    assistant  <tool_call>
               {"name": "calculate", "arguments": {"expression": "4521 + 3877"}}
               </tool_call>
    tool       8398
    assistant  The answer is 8398.                                   reward math_answer = 1

`calculate` reads the expression with `ast` and evaluates only numbers, + - * / and
parentheses, exactly (fractions), so a model's expression can never run code. The problems
(`calculator_problems`) are the word-problem task's phrasings (olingo/tasks/word_problems.py)
with 4- to 5-digit sums and differences and 3-digit by 2-digit products.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from fractions import Fraction

from olingo.rewards.verifiers import math_answer
from olingo.rollout.environment import register_environment
from olingo.rollout.tools import ToolEnvironment
from olingo.tasks.word_problems import _ADD, _MUL, _SUB, INSTRUCTION, ITEMS, NAMES, PRONOUN, _distinct

MAX_EXPRESSION_CHARS = 200  # a word problem's expression is short; longer text is not arithmetic
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")  # "4,521" -> "4521"


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression of numbers, + - * / and parentheses.

    Args:
        expression: The expression to evaluate, written with the numbers of the question.
    """
    # No worked example here: this text is in every prompt, and a small model copies an
    # example's numbers instead of the question's (measured with SmolLM2-135M, docs/agents.md).
    text = _THOUSANDS.sub("", expression.strip())
    if not text or len(text) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expected an expression of 1 to {MAX_EXPRESSION_CHARS} characters, got {len(text)}")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ValueError(f"cannot read {text!r} as arithmetic: use numbers, + - * / and parentheses") from None
    return format_number(_evaluate(tree.body))


def _evaluate(node: ast.AST) -> Fraction:
    """The exact value of an expression tree of numbers, + - * /, unary signs and parentheses."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ZeroDivisionError("division by zero")
        return _OPERATORS[type(node.op)](left, right)
    raise ValueError(f"unsupported {ast.unparse(node)!r}: only numbers, + - * / and parentheses")


def format_number(value: Fraction) -> str:
    """An integer as its digits; other values as a decimal of up to 6 places ('2.5', '0.333333')."""
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6f}".rstrip("0").rstrip(".")


def final_answer_reward(text: str, row: dict) -> float:
    """1.0 when the final answer's last number equals the row's `gt_answer` (the word-problem
    task's checker, `math_answer`), else 0.0."""
    return math_answer("", text, row.get("gt_answer"))


@register_environment("calculator")
class CalculatorEnvironment(ToolEnvironment):
    """`calculate` as the only tool, rewarded by `final_answer_reward`; the keyword arguments
    are `ToolEnvironment`'s (`environment.params` in a config)."""

    def __init__(self, call_timeout_s: float = 5.0, max_invalid_calls: int = 2, max_calls_per_turn: int = 4, result_role: str = "tool") -> None:
        super().__init__(
            [calculate], reward=final_answer_reward, call_timeout_s=call_timeout_s,
            max_invalid_calls=max_invalid_calls, max_calls_per_turn=max_calls_per_turn, result_role=result_role,
        )


def calculator_problems(train: int, eval: int, seed: int = 0) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(`train`, `eval`) word problems with large numbers, each {"prompt", "gt_answer",
    "expression"} (the expression `calculate` answers it with); no train question is an eval one."""
    rng = random.Random(seed)
    held_out = _distinct(lambda: _large_problem(rng), eval, set())
    return _distinct(lambda: _large_problem(rng), train, {r["prompt"] for r in held_out}), held_out


def _large_problem(rng: random.Random) -> dict[str, str]:
    """One problem: a sum of two 4-5 digit numbers, a difference, or a 3-digit by 2-digit product."""
    kind = rng.randrange(3)
    if kind == 0:
        a, b = rng.randint(1000, 99999), rng.randint(1000, 99999)
        template, symbol, answer = rng.choice(_ADD), "+", a + b
    elif kind == 1:
        a = rng.randint(10000, 99999)
        b = rng.randint(1000, a - 1000)
        template, symbol, answer = rng.choice(_SUB), "-", a - b
    else:
        a, b = rng.randint(100, 999), rng.randint(12, 99)
        template, symbol, answer = rng.choice(_MUL), "*", a * b
    name = rng.choice(NAMES)
    question = template.format(n=name, p=PRONOUN.get(name, "She"), a=a, b=b, it=rng.choice(ITEMS))
    return {"prompt": f"{question} {INSTRUCTION}", "gt_answer": str(answer), "expression": f"{a} {symbol} {b}"}


__all__ = ["CalculatorEnvironment", "calculate", "calculator_problems", "final_answer_reward"]
