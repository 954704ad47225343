r"""`math_verify`: math answers checked by Hugging Face's Math-Verify (LaTeX and symbolic equivalence).

`math_answer` (olingo/rewards/verifiers.py) compares numbers, and anything else as text; this
verifier hands both answers to Math-Verify (https://github.com/huggingface/Math-Verify, the
checker TRL's and open-r1's accuracy rewards use), which parses LaTeX into SymPy and accepts
equal values in any form: `\frac{\sqrt2}{2}` for `\frac{1}{\sqrt2}`, `x = 5` or `5 \text{ cm}`
for 5, `3 \times 10^{5}` for 300000, a reordered set or `\left( 3, -1 \right)` for a point.
It needs the optional package (`pip install 'olingo[math_verify]'`; `make extras` in a checkout);
naming the function without it stops the run at configuration time with that hint.

Math-Verify bounds each parse and comparison with `signal.alarm`, which Python allows only in
the main thread: there the timeout is TIMEOUT_S seconds; in any other thread (a thread pool, a
threaded Ray actor) it is off, so the function still works there, without a bound.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from types import ModuleType
from typing import Any

from olingo.errors import check_installed, require
from olingo.rewards.verifiers import _expected_answer  # the gold is read exactly as math_answer reads it

__all__ = ["TIMEOUT_S", "math_verify"]

TIMEOUT_S = 5  # seconds per parse and per comparison (Math-Verify's default), main thread only
_FEATURE = "the math_verify reward function"

# At import, so naming `math_verify` in a config fails when the config is checked, before any
# model loads; the package itself (SymPy, about a second) is imported on the first call.
check_installed("math_verify", _FEATURE)


def math_verify(prompt: str, response: str, gt_answer: str | None) -> float:
    r"""1.0 when Math-Verify finds the response's final answer equivalent to the ground truth, else 0.0.

    The ground truth is read as `math_answer` reads it: its last `\boxed{}`, else the text after
    a GSM8K '####', else all of it. The response's answer is what Math-Verify's `parse` extracts:
    the last `\boxed{}` first, else an answer after 'final answer is' or 'answer:', else the last
    LaTeX expression or number. The two are compared by Math-Verify's `verify` (numbers to 6
    decimals, symbolic equality, sets, intervals, equations). No ground truth, no parseable
    answer, or a failure inside Math-Verify (an exception, a timeout) scores 0.0, never an
    error: a reward must not stop a run on one odd response. Outside the main thread no
    timeout applies (Math-Verify's timeout uses `signal.alarm`).
    """
    if gt_answer is None:
        return 0.0
    expected = _expected_answer(str(gt_answer))
    if expected is None:
        return 0.0
    library = _library()
    # signal.alarm raises ValueError outside the main thread: no timeout there.
    timeout = TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    timed_out = library.errors.TimeoutException  # a BaseException, which `except Exception` misses
    try:
        gold = library.parse(f"${expected.strip('$')}$", parsing_timeout=timeout)
        answer = library.parse(response, extraction_config=_response_targets(), parsing_timeout=timeout)
        return 1.0 if gold and answer and library.verify(gold, answer, timeout_seconds=timeout) else 0.0
    except (Exception, timed_out):  # parse/verify catch their own errors; this is a second net
        return 0.0


@functools.cache
def _library() -> ModuleType:
    """Math-Verify, imported once (the missing-package error names the extra to install)."""
    library = require("math_verify", _FEATURE)
    require("math_verify.errors", _FEATURE)
    return library


@functools.cache
def _response_targets() -> tuple[Any, ...]:
    """What `parse` looks for in a response: LaTeX with boxes first (as math_answer and TRL's
    accuracy reward read a response), then plain numbers and expressions (GSM8K-style working).

    Boxes are normalised with boxed="last", not the default "all": "all" reads every box of the
    response as one set, so a response that boxes an intermediate result before its final
    answer would score 0. "last" still joins boxes listed together ('\\boxed{2} and
    \\boxed{3}', or boxes separated by a comma within 70 characters), Math-Verify's rule.
    """
    library = _library()
    latex = library.LatexExtractionConfig()
    latex = dataclasses.replace(latex, boxed_match_priority=0, normalization_config=dataclasses.replace(latex.normalization_config, boxed="last"))
    return (latex, library.ExprExtractionConfig())
