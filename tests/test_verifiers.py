"""Built-in verifiers: answer extraction and parsing, numeric equality with tolerances, the four
registered functions through the registry (errors as RewardError naming the row), factories."""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction

import pytest

from olingo.rewards.functions import CompositeReward
from olingo.rewards.registry import REWARD_FUNCTIONS, RewardError, register_reward, resolve_reward
from olingo.rewards.verifiers import (
    ABS_TOL,
    DEFAULT_LENGTH_BUDGET,
    REL_TOL,
    answers_equal,
    exact_match,
    extract_answer,
    format_regex,
    length_penalty,
    length_penalty_fn,
    math_answer,
    parse_number,
    regex_format,
)

NEW_NAMES = {"math_answer": math_answer, "exact_match": exact_match, "format_regex": format_regex, "length_penalty": length_penalty}


def score(spec: str, responses: list[str], gt_answers: list[str | None], **row_fields: list) -> list[float]:
    """The unweighted values of one registered function over rows, through CompositeReward."""
    prompts = [f"q{i}" for i in range(len(responses))]
    return CompositeReward({spec: 1.0}).score(prompts, responses, gt_answers, row_fields).terms[spec].tolist()


# ---- registry ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(NEW_NAMES))
def test_every_new_name_resolves(name: str) -> None:
    assert resolve_reward(name) is NEW_NAMES[name]
    assert REWARD_FUNCTIONS[name] is NEW_NAMES[name]


@pytest.mark.slow  # a fresh interpreter per case
@pytest.mark.parametrize("first", ["olingo.rewards.registry", "olingo.rewards.verifiers"])
def test_names_exist_after_importing_either_module_first(first: str) -> None:
    code = f"import {first}\nfrom olingo.rewards.registry import resolve_reward\nprint(*(resolve_reward(n).__name__ for n in {sorted(NEW_NAMES)!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == sorted(NEW_NAMES)


# ---- extraction and parsing ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("so \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("first \\boxed{3}, finally \\boxed{ {a}+\\{b\\} }", "{a}+\\{b\\}"),  # nested and escaped braces
        ("\\fbox{42} is it", "42"),
        ("\\boxed{7} then \\boxed{8", "7"),  # a box cut off by truncation is skipped
        ("\\boxed{ }", None),  # an empty box is no answer, not a fall-back to numbers
        ("we get 12 apples, then 1,234 pears", "1,234"),
        ("x = -5", "-5"),
        ("10-5", "5"),  # a minus after a digit is subtraction, not a sign
        ("pi is about 3.14159.", "3.14159"),  # the trailing period is not a decimal point
        ("it is 3/4 of the cake", "3/4"),
        ("that is \\dfrac{3}{4}.", "\\dfrac{3}{4}"),
        ("shorthand \\frac34", "\\frac34"),
        ("a rise of 50%", "50"),
        ("x \u2212 y = \u22127", "-7"),  # unicode minus
        ("no digits here", None),
    ],
)
def test_extract_answer(text: str, answer: str | None) -> None:
    assert extract_answer(text) == answer


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", Fraction(42)),
        (" -1,234.5. ", Fraction(-2469, 2)),
        ("+0.75", Fraction(3, 4)),
        (".5", Fraction(1, 2)),
        ("3/4", Fraction(3, 4)),
        ("-\\frac{3}{4}", Fraction(-3, 4)),
        ("\\frac{-3}{4}", Fraction(-3, 4)),
        ("\\dfrac{1,000}{8}", Fraction(125)),
        ("\\tfrac12", Fraction(1, 2)),
        ("$12$", Fraction(12)),
        ("50\\%", Fraction(50)),
        ("1{,}234", Fraction(1234)),
        ("3/0", None),
        ("\\frac{1}{0}", None),
        ("x+1", None),
        ("1 2", None),
        ("9" * 5000, None),  # beyond Python's int-to-string digit limit: no number, no crash
        ("", None),
    ],
)
def test_parse_number(text: str, value: Fraction | None) -> None:
    assert parse_number(text) == value


def test_answers_equal_tolerances_and_text() -> None:
    assert (REL_TOL, ABS_TOL) == (1e-6, 1e-9)
    assert answers_equal("0.75", "\\frac34") and answers_equal("3/4", Fraction(3, 4))
    assert answers_equal("1000000", "1000000.1")  # relative 1e-7: passes
    assert not answers_equal("1000", "1001")  # relative 1e-3: fails
    assert answers_equal("0", "0.0000000001")  # absolute 1e-10 <= ABS_TOL
    assert not answers_equal("0", "0.00000001")  # absolute 1e-8 > ABS_TOL
    assert answers_equal("1000", "1001", rel_tol=1e-2)
    assert answers_equal(0.1, "0.1") and answers_equal(float("inf"), float("inf"))
    assert not answers_equal(float("nan"), float("nan"))
    assert answers_equal("x + 1", "x+1.") and not answers_equal("x+1", "x+2")
    assert not answers_equal("1", "one")  # a number never equals a non-number
    with pytest.raises(ValueError, match="non-negative"):
        answers_equal("1", "1", rel_tol=-1.0)


# ---- math_answer ---------------------------------------------------------------------------
def test_math_answer_through_the_registry() -> None:
    rows = [
        ("Thus \\boxed{\\frac{3}{4}}.", "0.75", 1.0),
        ("The answer is 0.75.", "3/4", 1.0),
        ("so it is 3/4", "\\frac34", 1.0),
        ("She pays $1,234 in total.", "1234", 1.0),
        ("The temperature is -12 degrees", "-12", 1.0),
        ("\\boxed{2}, not 5", "5", 0.0),  # the box wins over a later number
        ("about 1.0000001", "1", 1.0),  # relative 1e-7: within REL_TOL
        ("about 1.001", "1", 0.0),  # relative 1e-3: wrong
        ("no idea", "7", 0.0),  # no answer found
        ("42", None, 0.0),  # nothing to verify against
        ("\\boxed{x + 1}", "x+1", 1.0),  # a non-numeric truth is compared as text ...
        ("it is 1", "x+1", 0.0),  # ... not by its last number
        ("so 72 clips", "48 + 24 = 72 clips #### 72", 1.0),  # GSM8K-style truth
        ("\\boxed{5}", "\\boxed{5}", 1.0),
    ]
    responses, truths, expected = (list(column) for column in zip(*rows, strict=True))
    assert score("math_answer", responses, truths) == expected
    assert math_answer("q", "it is 42", 42) == 1.0  # a numeric truth from Python code


# ---- exact_match ---------------------------------------------------------------------------
def test_exact_match_strips_whitespace_only() -> None:
    responses = ["  Paris\n", "paris", "Par is", "Paris", '"Paris"']
    truths = [" Paris", "Paris", "Paris", None, "Paris"]
    assert score("exact_match", responses, truths) == [1.0, 0.0, 0.0, 0.0, 0.0]


# ---- format_regex --------------------------------------------------------------------------
def test_format_regex_default_pattern() -> None:
    responses = ["Reasoning...\nso \\boxed{\\frac{1}{2}} done", "the answer is 7", "\\boxed{}", "\\boxed{ }", "\\boxed{7}"]
    assert score("format_regex", responses, [None] * 5) == [1.0, 0.0, 0.0, 0.0, 1.0]


def test_format_regex_row_pattern_and_default_for_rows_without_one() -> None:
    responses = ["<think>a\nb</think><answer>3</answer>", "<answer>3</answer>", "so \\boxed{3}"]
    patterns = [r"<think>.*</think><answer>.*</answer>", r"<think>.*</think><answer>.*</answer>", None]
    assert score("format_regex", responses, ["3"] * 3, format_pattern=patterns) == [1.0, 0.0, 1.0]


def test_format_regex_invalid_pattern_is_a_reward_error_naming_row_and_pattern() -> None:
    with pytest.raises(RewardError, match=r"'format_regex' raised on row 1 \(prompt 'q1'\): ValueError: invalid format pattern '\(unclosed'"):
        score("format_regex", ["a", "b"], [None, None], format_pattern=["a", "(unclosed"])
    with pytest.raises(RewardError, match=r"row 0 .*a format pattern must be a string, got int 3"):
        score("format_regex", ["a"], [None], format_pattern=[3])


def test_regex_format_factory() -> None:
    fn = regex_format(r"\d+")
    assert (fn("q", "123", None), fn("q", "12a", None)) == (1.0, 0.0)
    register_reward("test_verifiers_digits")(fn)
    try:
        assert score("test_verifiers_digits", ["123", "\n12\n"], [None, None]) == [1.0, 0.0]
        register_reward("test_verifiers_digits")(regex_format(r"\d+"))  # the same pattern again: fine
        with pytest.raises(RewardError, match=r"'test_verifiers_digits' is taken by olingo.rewards.verifiers.regex_format\('\\\\d\+'\)"):
            register_reward("test_verifiers_digits")(regex_format(r"\w+"))
    finally:
        REWARD_FUNCTIONS.pop("test_verifiers_digits")
    with pytest.raises(ValueError, match=r"invalid format pattern '\[a-'"):
        regex_format("[a-")


# ---- length_penalty ------------------------------------------------------------------------
def test_length_penalty_default_budget() -> None:
    assert DEFAULT_LENGTH_BUDGET == 256
    responses = ["", "x" * 256, "x" * 320, "x" * 512, "x" * 5000]
    assert score("length_penalty", responses, [None] * 5) == [0.0, 0.0, -0.25, -1.0, -1.0]  # clipped at -1


def test_length_penalty_row_budget() -> None:
    responses = ["abcd", "abcdef", "abcdefghij", "x" * 300]
    assert score("length_penalty", responses, [None] * 4, length_budget=[4, 4, 4, None]) == [0.0, -0.5, -1.0, pytest.approx(-44 / 256)]
    assert length_penalty("q", "abcdef", None, length_budget=4.0) == -0.5  # 4.0 from a JSON file
    with pytest.raises(RewardError, match=r"row 0 .*a length budget must be a positive whole number, got 0"):
        score("length_penalty", ["a"], [None], length_budget=[0])


def test_length_penalty_fn_factory() -> None:
    words = length_penalty_fn(4, per="words")
    assert (words("q", "one two  three\nfour", None), words("q", "a b c d e f", None), words("q", "a " * 20, None)) == (0.0, -0.5, -1.0)
    chars = length_penalty_fn(10)
    assert (chars("q", "x" * 10, None), chars("q", "x" * 13, None)) == (0.0, pytest.approx(-0.3))
    assert CompositeReward([(words, 2.0)]).score(["q"], ["a b c d e f"], [None]).total.tolist() == [-1.0]
    with pytest.raises(ValueError, match="per must be 'chars' or 'words', got 'tokens'"):
        length_penalty_fn(10, per="tokens")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive whole number, got True"):
        length_penalty_fn(True)
