"""Built-in verifiers for RL with verifiable rewards (GRPO and friends), registered by name.

    math_answer     1.0 when the response's final answer (last \\boxed{}, else last number)
                    equals the ground truth numerically (REL_TOL, ABS_TOL), else 0.0
    exact_match     1.0 when the response equals the ground truth up to surrounding whitespace
    format_regex    1.0 when the whole response matches the row's `format_pattern`, else
                    DEFAULT_FORMAT_PATTERN (a non-empty \\boxed{...} somewhere), else 0.0
    length_penalty  0.0 within the row's `length_budget` (else DEFAULT_LENGTH_BUDGET
                    characters), down to -1.0 for a response twice the budget or longer

Factories for your own variants (register them with `register_reward("name")(...)`):
`regex_format(pattern)` and `length_penalty_fn(budget, per)`. The pure helpers behind
math_answer, `extract_answer`, `parse_number` and `answers_equal`, are public for reuse.

All are single-row functions `fn(prompt, response, gt_answer, **row_fields) -> float`. A
missing ground truth scores 0.0 (not an error): a verifier has nothing to verify against.
The registry (`olingo.rewards.registry.BUILTIN_REWARDS`) names the four, importing this module
on first use; this module imports nothing of olingo.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any, Literal

__all__ = [
    "ABS_TOL",
    "DEFAULT_FORMAT_PATTERN",
    "DEFAULT_LENGTH_BUDGET",
    "REL_TOL",
    "answers_equal",
    "exact_match",
    "extract_answer",
    "format_regex",
    "length_penalty",
    "length_penalty_fn",
    "math_answer",
    "parse_number",
    "regex_format",
]

REL_TOL = 1e-6  # math_answer: |a - b| <= max(REL_TOL * max(|a|, |b|), ABS_TOL) counts as equal
ABS_TOL = 1e-9  # (math.isclose's rule), so rounding in the last printed digits is forgiven
DEFAULT_FORMAT_PATTERN = r".*\\boxed\{\s*[^\s}].*\}.*"  # a non-empty \boxed{...} anywhere
DEFAULT_LENGTH_BUDGET = 256  # characters

# ---- numbers in text -------------------------------------------------------------------------
# A decimal: 1234, 1,234 (thousands groups of exactly three), 3.14, .5 (not the '.3' of '1.2.3').
_DECIMAL = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|(?<!\d)\.\d+"
# \frac{3}{4}, \dfrac{-1}{2}, \tfrac{1,000}{3}, and the one-digit shorthand \frac34.
_LATEX_FRAC = (
    rf"\\[dt]?frac\s*(?:\{{\s*(?P<num>-?(?:{_DECIMAL}))\s*\}}|(?P<num1>\d))"
    rf"\s*(?:\{{\s*(?P<den>-?(?:{_DECIMAL}))\s*\}}|(?P<den1>\d))"
)
# A minus is a sign only when it does not follow a word or a closing bracket: '10-5' is 5.
_NUMBER = re.compile(
    rf"(?P<sign>(?<![\w)\]}}])-)?(?:(?P<frac>{_LATEX_FRAC})|(?P<slash>\d+/\d+)|(?P<dec>{_DECIMAL}))"
)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.DOTALL)  # an escaped character (\{ \} \\) or a brace


def extract_answer(text: str) -> str | None:
    """The final answer of a response, as text, or None when it has none.

    The content of the last complete `\\boxed{...}` or `\\fbox{...}` (nested and escaped braces
    allowed; a box cut off by truncation is skipped; an empty box is no answer), else the last
    number in the text as written: '-1,234.5', '3/4', '\\frac{3}{4}' ('50%' gives '50').
    """
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed or None
    numbers = list(_NUMBER.finditer(_unlatex(text)))
    return numbers[-1].group(0) if numbers else None


def parse_number(text: str) -> Fraction | None:
    """The exact value of `text` when it is one number, else None.

    Accepts what `extract_answer` finds ('1,234', '-0.5', '.5', '3/4', '\\dfrac{3}{4}',
    '\\frac34') with surrounding whitespace or `$`, a leading '+', a trailing period and a
    trailing percent sign ('%' or '\\%', ignored: '50%' is 50), LaTeX spacing (`\\,` `\\!`) and
    `{,}` separators. A zero denominator, or more digits than Python converts, gives None.
    """
    text = _unlatex(text).strip().strip("$").strip().removeprefix("+").removesuffix(".")
    text = text.removesuffix("\\%").removesuffix("%").strip()
    match = _NUMBER.fullmatch(text)
    return _match_value(match) if match else None


def answers_equal(a: str | Fraction | float, b: str | Fraction | float, rel_tol: float = REL_TOL, abs_tol: float = ABS_TOL) -> bool:
    """Whether two answers are equal: numerically within the tolerances when both are numbers
    (strings are read with `parse_number`; the comparison is exact, in fractions), else, when
    neither is a number, as texts without whitespace, `$` or a trailing period ('x + 1' is
    'x+1'). A number never equals a non-number; NaN equals nothing.
    """
    if rel_tol < 0 or abs_tol < 0:
        raise ValueError(f"tolerances must be non-negative, got rel_tol={rel_tol}, abs_tol={abs_tol}")
    x, y = _as_number(a), _as_number(b)
    if x is None or y is None:
        return x is None and y is None and _canonical_text(str(a)) == _canonical_text(str(b))
    if isinstance(x, float) or isinstance(y, float):  # inf or nan: only an identical inf matches
        return x == y
    return abs(x - y) <= max(Fraction(rel_tol) * max(abs(x), abs(y)), Fraction(abs_tol))


# ---- the built-in verifiers -----------------------------------------------------------------
def math_answer(prompt: str, response: str, gt_answer: str | None) -> float:
    """1.0 when the response's final answer equals the ground truth, else 0.0.

    The response's answer is `extract_answer`'s (last box, else last number). The ground truth
    is read as an answer, not a solution: its last box if it has one, else the text after a
    GSM8K-style '####' if it has one, else all of it; so '0.75', '3/4' and '\\frac34' all mean
    3/4, and a non-numeric truth such as 'x+1' is compared as text instead of by its last
    number. Equality is `answers_equal` with REL_TOL and ABS_TOL. No answer found, or no
    ground truth, scores 0.0: nothing verifiable is not correct.
    """
    if gt_answer is None:
        return 0.0
    answer, expected = extract_answer(response), _expected_answer(str(gt_answer))
    if answer is None or expected is None:
        return 0.0
    return 1.0 if answers_equal(answer, expected) else 0.0


def exact_match(prompt: str, response: str, gt_answer: str | None) -> float:
    """1.0 when the response equals the ground truth once surrounding whitespace is stripped
    from both (case and inner spacing count), else 0.0; 0.0 without a ground truth."""
    if gt_answer is None:
        return 0.0
    return 1.0 if response.strip() == str(gt_answer).strip() else 0.0


def format_regex(prompt: str, response: str, gt_answer: str | None, format_pattern: str | None = None) -> float:
    """1.0 when the whole response matches a regular expression (`re.fullmatch`, `.` matching
    newlines too), else 0.0: a reward for following an output format, whatever the answer.

    The pattern is the row's `format_pattern` field when it has one, else
    DEFAULT_FORMAT_PATTERN, which asks for a non-empty `\\boxed{...}` anywhere in the
    response. An invalid pattern raises ValueError naming it.
    """
    return 1.0 if _compiled(DEFAULT_FORMAT_PATTERN if format_pattern is None else format_pattern).fullmatch(response) else 0.0


def length_penalty(prompt: str, response: str, gt_answer: str | None, length_budget: int | None = None) -> float:
    """-(characters beyond the budget) / budget, clipped to [-1, 0]: 0.0 within the budget,
    -0.5 at one and a half times it, -1.0 from twice it on. It discourages rambling without
    rewarding short answers. The budget is the row's `length_budget` field when given, else
    DEFAULT_LENGTH_BUDGET characters; it must be a positive whole number (ValueError)."""
    budget = _budget(DEFAULT_LENGTH_BUDGET if length_budget is None else length_budget)
    return _length_penalty(response, budget, "chars")


# ---- factories -----------------------------------------------------------------------------
def regex_format(pattern: str) -> Callable[[str, str, str | None], float]:
    """A single-row reward function: 1.0 when the whole response matches `pattern`
    (`re.fullmatch`, DOTALL), else 0.0. The pattern is compiled now (ValueError if invalid).

    Example: `register_reward("think_answer")(regex_format(r"<think>.*</think>\\s*<answer>.*</answer>"))`.
    """
    compiled = _compiled(pattern)

    def reward(prompt: str, response: str, gt_answer: str | None) -> float:
        return 1.0 if compiled.fullmatch(response) else 0.0

    return _named(reward, "regex_format", f"regex_format({pattern!r})", f"1.0 when the whole response matches {pattern!r}, else 0.0.")


def length_penalty_fn(budget: int, per: Literal["chars", "words"] = "chars") -> Callable[[str, str, str | None], float]:
    """A single-row reward function: -(units beyond `budget`) / budget, clipped to [-1, 0],
    where a unit is a character ('chars') or a whitespace-separated word ('words'). The
    budget is fixed (rows' `length_budget` fields are not read); ValueError if invalid.
    """
    budget = _budget(budget)
    if per not in ("chars", "words"):
        raise ValueError(f"length_penalty_fn: per must be 'chars' or 'words', got {per!r}")

    def reward(prompt: str, response: str, gt_answer: str | None) -> float:
        return _length_penalty(response, budget, per)

    return _named(reward, "length_penalty", f"length_penalty_fn({budget}, {per!r})", f"0.0 within {budget} {per}, down to -1.0 at twice that.")


# ---- helpers -------------------------------------------------------------------------------
def _unlatex(text: str) -> str:
    """Unicode minus to '-', LaTeX thin spaces dropped and `{,}` to ',' (1{,}234 is 1,234)."""
    return text.replace("\u2212", "-").replace("\\!", "").replace("\\,", "").replace("{,}", ",")


def _last_boxed(text: str) -> str | None:
    """The stripped content of the last complete \\boxed{...}/\\fbox{...}, or None."""
    boxes = list(_BOXED.finditer(text))
    if not boxes:
        return None
    closing = _matching_braces(text, boxes[0].end() - 1)
    for box in reversed(boxes):
        end = closing.get(box.end() - 1)
        if end is not None:
            return text[box.end() : end].strip()
    return None


def _matching_braces(text: str, start: int) -> dict[int, int]:
    """Index of each '{' from `start` on -> index of its '}'; one pass, so a response full of
    unclosed boxes costs no more than one without them."""
    stack: list[int] = []
    pairs: dict[int, int] = {}
    for token in _BRACE_TOKEN.finditer(text, start):
        if token.group() == "{":
            stack.append(token.start())
        elif token.group() == "}" and stack:
            pairs[stack.pop()] = token.start()
    return pairs


def _match_value(match: re.Match[str]) -> Fraction | None:
    try:
        if match["frac"]:
            value = _decimal(match["num"] or match["num1"]) / _decimal(match["den"] or match["den1"])
        elif match["slash"]:
            numerator, denominator = match["slash"].split("/")
            value = Fraction(int(numerator), int(denominator))
        else:
            value = _decimal(match["dec"])
    except (ValueError, ZeroDivisionError):  # x/0, or past Python's int-to-string digit limit
        return None
    return -value if match["sign"] else value


def _decimal(text: str) -> Fraction:
    return Fraction(text.replace(",", ""))


def _expected_answer(gt: str) -> str | None:
    """The answer in a ground truth: its last box, else what follows '####', else all of it."""
    if "####" in gt:
        gt = gt.rpartition("####")[2]
    boxed = _last_boxed(gt)
    return (boxed if boxed is not None else gt.strip()) or None


def _as_number(value: Any) -> Fraction | float | None:
    if isinstance(value, str):
        return parse_number(value)
    if isinstance(value, float) and not math.isfinite(value):
        return value
    if isinstance(value, int | float | Fraction) and not isinstance(value, bool):
        return Fraction(value)
    raise TypeError(f"answers_equal compares strings and numbers, got {type(value).__name__}")


def _canonical_text(text: str) -> str:
    return "".join(_unlatex(text).split()).strip("$").removesuffix(".")


@functools.lru_cache(maxsize=256)  # rows of one data set tend to share a handful of patterns
def _compiled_cached(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern, re.DOTALL)
    except re.error as err:
        raise ValueError(f"invalid format pattern {pattern!r}: {err}") from err


def _compiled(pattern: Any) -> re.Pattern[str]:
    if not isinstance(pattern, str):
        raise ValueError(f"a format pattern must be a string, got {type(pattern).__name__} {pattern!r}")
    return _compiled_cached(pattern)


def _budget(value: Any) -> int:
    """A length budget: a positive whole number (300.0 from a JSON file is 300)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0 or value != int(value):
        raise ValueError(f"a length budget must be a positive whole number, got {value!r}")
    return int(value)


def _length_penalty(text: str, budget: int, per: str) -> float:
    excess = (len(text) if per == "chars" else len(text.split())) - budget
    return 0.0 if excess <= 0 else max(-1.0, -excess / budget)


def _named(fn: Callable[..., float], name: str, qualname: str, doc: str) -> Callable[..., float]:
    """Name a factory's function; the qualname holds its settings, so registering two different
    ones under one name is a clash that `register_reward` reports."""
    fn.__name__, fn.__qualname__, fn.__doc__ = name, qualname, doc
    return fn
