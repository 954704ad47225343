"""`math_verify`: Math-Verify's verdicts on hand cases and on the labelled set of
bench/math_verify_cases.py, its failures scored 0, threads, and its name in configs."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from bench.math_verify_agreement import summary, verdicts
from olingo.errors import MissingExtraError
from olingo.recipes.grpo_config import GRPOConfig
from olingo.rewards import RewardError, resolve_reward
from olingo.rewards import math_verify as module
from olingo.rewards.math_verify import TIMEOUT_S, math_verify


@pytest.mark.parametrize(
    ("response", "gt_answer", "score"),
    [
        (r"So the answer is \boxed{\dfrac{3}{4}}.", "0.75", 1.0),
        (r"\boxed{\frac{\sqrt{2}}{2}}", r"The answer is $\boxed{\frac{1}{\sqrt{2}}}$.", 1.0),  # the gold's box is read
        (r"\boxed{x = 5}", "Add 3 to both sides.\n#### 5", 1.0),  # the gold after GSM8K's '####'
        (r"\boxed{\left( 3, -1 \right)}", "(3,-1)", 1.0),
        (r"\boxed{\frac{2}{3}}", "0.75", 0.0),
        (r"\boxed{(-1, 3)}", "(3,-1)", 0.0),
        (r"\boxed{5}", None, 0.0),  # no ground truth
        (r"\boxed{5}", "  ", 0.0),  # an empty one
        ("I am not sure how to solve this.", "5", 0.0),  # nothing to parse
    ],
)
def test_hand_cases(response: str, gt_answer: str | None, score: float) -> None:
    assert math_verify("", response, gt_answer) == score


def test_labelled_set_where_the_checkers_disagree() -> None:
    """The measured verdicts of bench/results/math_verify.md. Math-Verify misses four: it rounds
    to 6 decimals (0.333333 = 1/3), drops units (5 m = 5 cm), joins boxes a comma apart into a
    set ({12, 72}), and compares an inequality with an interval only when the response is the
    interval; the first three are where math_answer is right and it is not."""
    rows = verdicts()
    assert summary(rows) == {"cases": 60, "agree": 43, "math_answer_right": 45, "math_verify_right": 56}
    disagree = [r for r in rows if r["math_answer"] != r["math_verify"]]
    assert {r["name"] for r in disagree if r["math_answer"] == r["correct"]} == {"six_decimals", "wrong_unit", "boxes_comma_last_right"}
    assert sum(r["math_verify"] == r["correct"] for r in disagree) == 14
    assert {r["name"] for r in rows if r["math_verify"] != r["correct"]} == {
        "six_decimals", "wrong_unit", "boxes_comma_last_right", "inequality_vs_interval"}


def test_timeout_only_in_the_main_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """signal.alarm works only in the main thread: a worker thread gets no timeout and a real
    verdict (a signal error would be scored 0.0, so 1.0 shows there was none)."""
    library = module._library()
    timeouts = []
    real_parse = library.parse

    def parse(*args, parsing_timeout, **kwargs):
        timeouts.append(parsing_timeout)
        return real_parse(*args, parsing_timeout=parsing_timeout, **kwargs)

    monkeypatch.setattr(library, "parse", parse)
    args = ("", r"\boxed{\frac{1}{2}}", "0.5")
    assert math_verify(*args) == 1.0
    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(lambda _: math_verify(*args), range(2))) == [1.0, 1.0]
    assert timeouts == [TIMEOUT_S] * 2 + [None] * 4


@pytest.mark.parametrize("error", [RuntimeError("sympy failed"), module._library().errors.TimeoutException("timed out")])
def test_a_failure_inside_math_verify_scores_zero(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    def verify(*args, **kwargs):
        raise error

    monkeypatch.setattr(module._library(), "verify", verify)
    assert math_verify("", r"\boxed{5}", "5") == 0.0


def test_the_name_resolves_and_a_grpo_config_naming_it_validates() -> None:
    assert resolve_reward("math_verify") is math_verify
    assert GRPOConfig(reward={"functions": {"math_verify": 1.0}}).reward.functions == {"math_verify": 1.0}


def test_without_the_package_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "math_verify", None)  # importing it now raises ImportError
    monkeypatch.delitem(sys.modules, "olingo.rewards.math_verify")  # so the import-time check runs again
    with pytest.raises(RewardError, match=r"pip install 'olingo\[math_verify\]'"):
        resolve_reward("olingo.rewards.math_verify:math_verify")
    module._library.cache_clear()  # the first call imports the package again (and fails)
    try:
        with pytest.raises(MissingExtraError, match=r"pip install 'olingo\[math_verify\]'"):
            module._library()
    finally:
        module._library.cache_clear()
