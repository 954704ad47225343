"""Tiny Python functions to write, each checked by hidden asserts: the prompt rows of the
`python_tests` environment (olingo/rollout/python_tests.py; docs/agents.md, "Running model-written code").

A row is::

    {"prompt": "Write a Python function add(a, b) that returns a + b.",
     "tests": ["assert add(1, 2) == 3", "assert add(-4, 4) == 0", ...]}

The policy sees the prompt; the environment runs its reply against `tests` in the sandbox.
`prepare_python_tests(root)` writes the two splits once, as the arithmetic task's files are
written (`olingo.tasks.assets`): `builtin:python_tests_train` (40 problems) and
`builtin:python_tests_eval` (8 held-out ones) name them in a config.
"""

from __future__ import annotations

import random
from pathlib import Path

from olingo.tasks.assets import write_jsonl_atomic

SPLITS = ("python_tests_train", "python_tests_eval")
ASSETS_DIR = "python-tests-v1"  # under $OLINGO_HOME/assets; a new version when PROBLEMS change
_EVAL_PROBLEMS = 8

# (signature, what it returns, hidden asserts). Short prompts: the tiny model reads 256 positions.
PROBLEMS: list[tuple[str, str, list[str]]] = [
    ("add(a, b)", "returns a + b", ["add(1, 2) == 3", "add(-4, 4) == 0", "add(0, 0) == 0", "add(10, 5) == 15"]),
    ("sub(a, b)", "returns a - b", ["sub(5, 3) == 2", "sub(3, 5) == -2", "sub(0, 0) == 0"]),
    ("mul(a, b)", "returns a * b", ["mul(3, 4) == 12", "mul(-2, 5) == -10", "mul(7, 0) == 0"]),
    ("is_even(n)", "returns True if n is even, else False", ["is_even(4) is True", "is_even(7) is False", "is_even(0) is True", "is_even(-2) is True"]),
    ("is_odd(n)", "returns True if n is odd, else False", ["is_odd(3) is True", "is_odd(8) is False", "is_odd(-1) is True"]),
    ("square(n)", "returns n squared", ["square(3) == 9", "square(-4) == 16", "square(0) == 0"]),
    ("cube(n)", "returns n cubed", ["cube(2) == 8", "cube(-3) == -27", "cube(1) == 1"]),
    ("double(n)", "returns 2 * n", ["double(4) == 8", "double(-1) == -2", "double(0) == 0"]),
    ("half(n)", "returns n // 2", ["half(8) == 4", "half(7) == 3", "half(0) == 0"]),
    ("negate(n)", "returns -n", ["negate(5) == -5", "negate(-2) == 2", "negate(0) == 0"]),
    ("absolute(n)", "returns the absolute value of n", ["absolute(-3) == 3", "absolute(4) == 4", "absolute(0) == 0"]),
    ("maximum(a, b)", "returns the larger of a and b", ["maximum(2, 9) == 9", "maximum(9, 2) == 9", "maximum(-1, -5) == -1"]),
    ("minimum(a, b)", "returns the smaller of a and b", ["minimum(2, 9) == 2", "minimum(9, 2) == 2", "minimum(-1, -5) == -5"]),
    ("reverse(s)", "returns the string s reversed", ["reverse('abc') == 'cba'", "reverse('') == ''", "reverse('ab ') == ' ba'"]),
    ("length(s)", "returns the number of characters in s", ["length('abc') == 3", "length('') == 0", "length('a b') == 3"]),
    ("first(xs)", "returns the first item of the list xs", ["first([4, 5, 6]) == 4", "first(['a']) == 'a'"]),
    ("last(xs)", "returns the last item of the list xs", ["last([4, 5, 6]) == 6", "last(['a']) == 'a'"]),
    ("total(xs)", "returns the sum of the numbers in xs", ["total([1, 2, 3]) == 6", "total([]) == 0", "total([-1, 1]) == 0"]),
    ("count_char(s, c)", "returns how often the character c occurs in s", ["count_char('banana', 'a') == 3", "count_char('abc', 'z') == 0"]),
    ("upper(s)", "returns s in upper case", ["upper('abc') == 'ABC'", "upper('a1') == 'A1'", "upper('') == ''"]),
    ("lower(s)", "returns s in lower case", ["lower('ABC') == 'abc'", "lower('A1') == 'a1'", "lower('') == ''"]),
    ("is_empty(s)", "returns True if s is the empty string", ["is_empty('') is True", "is_empty('a') is False", "is_empty(' ') is False"]),
    ("concat(a, b)", "returns the strings a and b joined", ["concat('ab', 'cd') == 'abcd'", "concat('', 'x') == 'x'"]),
    ("repeat(s, n)", "returns s repeated n times", ["repeat('ab', 3) == 'ababab'", "repeat('x', 0) == ''"]),
    ("is_positive(n)", "returns True if n > 0, else False", ["is_positive(3) is True", "is_positive(0) is False", "is_positive(-2) is False"]),
    ("sign(n)", "returns -1, 0 or 1 by the sign of n", ["sign(-7) == -1", "sign(0) == 0", "sign(12) == 1"]),
    ("factorial(n)", "returns n! (factorial(0) is 1)", ["factorial(0) == 1", "factorial(1) == 1", "factorial(5) == 120"]),
    ("fib(n)", "returns the n-th Fibonacci number (fib(0) is 0)", ["fib(0) == 0", "fib(1) == 1", "fib(2) == 1", "fib(10) == 55"]),
    ("is_palindrome(s)", "returns True if s reads the same backwards",
     ["is_palindrome('abba') is True", "is_palindrome('abc') is False", "is_palindrome('') is True"]),
    ("count_vowels(s)", "returns the number of vowels (aeiou) in s", ["count_vowels('hello') == 2", "count_vowels('xyz') == 0", "count_vowels('aei') == 3"]),
    ("mean(xs)", "returns the average of the numbers in xs", ["mean([1, 2, 3]) == 2", "mean([4]) == 4", "mean([1, 2]) == 1.5"]),
    ("max_list(xs)", "returns the largest number in xs", ["max_list([3, 9, 2]) == 9", "max_list([-5, -1]) == -1"]),
    ("min_list(xs)", "returns the smallest number in xs", ["min_list([3, 9, 2]) == 2", "min_list([-5, -1]) == -5"]),
    ("evens(xs)", "returns the even numbers of xs, in order", ["evens([1, 2, 3, 4]) == [2, 4]", "evens([1, 3]) == []", "evens([]) == []"]),
    ("squares(xs)", "returns the squares of the numbers in xs", ["squares([1, 2, 3]) == [1, 4, 9]", "squares([]) == []"]),
    ("contains(xs, x)", "returns True if x is in the list xs", ["contains([1, 2], 2) is True", "contains([1, 2], 5) is False", "contains([], 1) is False"]),
    ("index_of(xs, x)", "returns the index of x in xs, or -1", ["index_of([5, 6, 7], 6) == 1", "index_of([5], 9) == -1"]),
    ("clamp(n, lo, hi)", "returns n limited to lo..hi", ["clamp(5, 0, 3) == 3", "clamp(-2, 0, 3) == 0", "clamp(2, 0, 3) == 2"]),
    ("gcd(a, b)", "returns the greatest common divisor of a and b", ["gcd(12, 18) == 6", "gcd(7, 5) == 1", "gcd(9, 3) == 3"]),
    ("is_prime(n)", "returns True if n is a prime number", ["is_prime(2) is True", "is_prime(9) is False", "is_prime(13) is True", "is_prime(1) is False"]),
    ("digit_sum(n)", "returns the sum of the digits of n >= 0", ["digit_sum(123) == 6", "digit_sum(0) == 0", "digit_sum(909) == 18"]),
    ("swap(a, b)", "returns the tuple (b, a)", ["swap(1, 2) == (2, 1)", "swap('x', 'y') == ('y', 'x')"]),
    ("capitalize(s)", "returns s with its first letter in upper case", ["capitalize('hello') == 'Hello'", "capitalize('a b') == 'A b'"]),
    ("remove_spaces(s)", "returns s without its spaces", ["remove_spaces('a b c') == 'abc'", "remove_spaces('ab') == 'ab'"]),
    ("words(s)", "returns the list of the words of s", ["words('a bc d') == ['a', 'bc', 'd']", "words('x') == ['x']"]),
    ("join_words(ws)", "returns the words of ws joined by spaces", ["join_words(['a', 'b']) == 'a b'", "join_words(['x']) == 'x'"]),
    ("average(a, b)", "returns the mean of a and b", ["average(2, 4) == 3", "average(1, 2) == 1.5"]),
    ("is_divisible(a, b)", "returns True if b divides a", ["is_divisible(10, 5) is True", "is_divisible(10, 3) is False"]),
]


def problem_rows() -> dict[str, list[dict]]:
    """{split name: rows}: the problems in a fixed shuffled order, the last 8 held out."""
    rows = [
        {"prompt": f"Write a Python function {signature} that {what}.", "tests": [f"assert {test}" for test in tests]}
        for signature, what, tests in PROBLEMS
    ]
    random.Random(0).shuffle(rows)
    return {"python_tests_train": rows[:-_EVAL_PROBLEMS], "python_tests_eval": rows[-_EVAL_PROBLEMS:]}


def prepare_python_tests(root: Path) -> dict[str, Path]:
    """Write each split as `root/<split>.jsonl` unless it is there (atomically); {split: path}."""
    root.mkdir(parents=True, exist_ok=True)
    paths = {split: root / f"{split}.jsonl" for split in SPLITS}
    if not all(path.exists() for path in paths.values()):
        for split, rows in problem_rows().items():
            write_jsonl_atomic(paths[split], rows)
    return paths
