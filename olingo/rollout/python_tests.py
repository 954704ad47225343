"""A built-in environment, `python_tests` (docs/agents.md, "Running model-written code"): the
policy writes a Python function, and its reply runs in the sandbox (olingo/rollout/sandbox.py)
against the prompt row's hidden tests.

    user       Write a Python function add(a, b) that returns a + b.
    assistant  ```python
               def add(a, b):
                   return a - b
               ```                                              2 of 4 tests pass: reward 0.5
    user       Test failed: assert add(1, 2) == 3 (AssertionError). Fix the function.
    assistant  ```python ...                                    4 of 4 pass: reward +0.5, done

A row is `{"prompt": ..., "tests": ["assert add(1, 2) == 3", ...]}` (the packaged problems:
`builtin:python_tests_train`, olingo/tasks/python_tests.py). The code is the reply's first
```python block (else its first ``` block, else the whole reply). An attempt scores the fraction
of the tests it passes (`reward: all`: 1 when it passes all, else 0); each step's reward is the
change of the score, so an episode's reward is the score of its last graded attempt. An attempt
that passes every test ends the episode; otherwise the reply shows the first failure and the
policy may try again, up to `environment.max_turns`.

A run the sandbox stops (timeout, CPU, memory, output) or that exits before its tests finish (a
crash, `os._exit`) raises `SandboxRunError`: a runtime failure of the episode, which ends with
reward 0 and is counted in `rollout/env_errors` (and in this environment's `code_sandbox_failures`).
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationError

from olingo.config import StrictModel
from olingo.config_errors import did_you_mean
from olingo.rollout.environment import EnvironmentSpecError, EnvStep, register_environment
from olingo.rollout.sandbox import SandboxConfig, SandboxResult, check_sandbox, run_python

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)

# The program the sandbox runs: it reads the reply's code, the tests and a per-run token from
# stdin (the tests are in no file the code could read), runs each test in the code's namespace
# and reports on lines that start with the token, so printing a report is not enough to pass.
_HARNESS = """\
def _harness():
    import json, os, sys
    data = json.loads(sys.stdin.read())
    token, tests, out = data.pop("token"), data.pop("tests"), os.dup(1)

    def report(*fields):
        os.write(out, (token + " " + json.dumps(fields) + "\\n").encode())

    def describe(error):
        return type(error).__name__ + (": " + str(error) if str(error) else "")

    namespace = {"__name__": "solution", "__builtins__": __builtins__}
    try:
        exec(compile(data.pop("source"), "solution.py", "exec"), namespace)
    except BaseException as error:
        report("source", describe(error))
    for index, test in enumerate(tests):
        try:
            exec(compile(test, "test", "exec"), namespace)
            report(index, True, "")
        except BaseException as error:
            report(index, False, describe(error))
    report("done")


_harness()
"""


class SandboxRunError(RuntimeError):
    """A sandboxed run a limit stopped, or that ended before its tests finished: the episode fails."""


class PythonTestsParams(StrictModel):
    """The parameters of the built-in environment `python_tests` (`environment.params`)."""

    sandbox: SandboxConfig = Field(
        default_factory=SandboxConfig,
        description="limits of each run: timeout_s, cpu_s, memory_mb, max_processes, max_output_bytes, scratch_mb (keep timeout_s "
        "below environment.step_timeout_s)",
    )
    reward: Literal["fraction", "all"] = Field(
        "fraction", description="an attempt's score: the fraction of the row's tests it passes, or (all) 1 when it passes every test and 0 otherwise",
    )
    feedback_chars: int = Field(200, ge=0, le=4000, description="characters of the first failure shown after a failed attempt (0: 'Some tests failed.' only)")


@dataclass
class TestOutcome:
    """One attempt's test results."""

    passed: list[bool]
    """Per test, in order: whether it passed."""
    failure: str
    """The first failure as the reply shows it ('' when every test passed)."""
    result: SandboxResult


def extract_code(text: str) -> str:
    """The code of a reply: its first ```python (or py) block, else its first ``` block, else the
    whole text. A block cut off at the token limit runs to the end of the text."""
    blocks = _FENCE.findall(text)
    for language, body in blocks:
        if language.lower() in ("python", "py", "python3"):
            return body
    return blocks[0][1] if blocks else text


def run_tests(source: str, tests: list[str], config: SandboxConfig) -> TestOutcome:
    """Run `source` and then each test in its namespace, in one sandboxed program. A
    `SandboxRunError` when a limit stopped the run or it ended before reporting every test."""
    token = secrets.token_hex(16)
    result = run_python(_HARNESS, json.dumps({"token": token, "tests": tests, "source": source}), config)
    reports = [json.loads(line[len(token) + 1:]) for line in result.stdout.splitlines() if line.startswith(token + " ")]
    if result.killed is not None:
        raise SandboxRunError(f"the sandbox stopped the program: {_limit_text(result.killed, config)}")
    if not reports or reports[-1] != ["done"]:
        said = " ".join(result.stderr.split())[-200:]
        raise SandboxRunError(f"the program exited (status {result.exit_code}) before its tests finished" + (f": {said}" if said else ""))
    passed = [False] * len(tests)
    failures = [f"{fields[1]} (the code itself)" for fields in reports if fields[0] == "source"]
    for fields in reports:
        if isinstance(fields[0], int):
            passed[fields[0]] = fields[1]
            if not fields[1]:
                failures.append(f"{tests[fields[0]]} ({fields[2]})")
    return TestOutcome(passed, failures[0] if failures and not all(passed) else "", result)


def _limit_text(killed: str, config: SandboxConfig) -> str:
    return {
        "timeout": f"it ran past {config.timeout_s:g} s (sandbox.timeout_s)", "cpu": f"it used {config.cpu_s} CPU seconds (sandbox.cpu_s)",
        "memory": f"it ran out of its {config.memory_mb} MiB (sandbox.memory_mb)",
        "output": f"it wrote more than {config.max_output_bytes} bytes (sandbox.max_output_bytes)",
    }[killed]


@register_environment("python_tests")
class PythonTestsEnvironment:
    """Model-written Python against a row's hidden tests, in the sandbox (module docstring);
    the keyword arguments are `PythonTestsParams`' fields (`environment.params` in a config)."""

    def __init__(self, **params: Any) -> None:
        self.params = self.checked(params, "environment.params")
        check_sandbox()  # once per process: a probe run
        self.runs = self.tests_passed = self.sandbox_failures = 0
        self.tests: list[str] = []

    @classmethod
    def check_params(cls, params: dict[str, Any], key: str) -> None:
        """One-line errors, when the config is built: a parameter that is unknown or out of range
        (naming `key`'s field), a machine where the sandbox does not run (saying how to fix it)."""
        cls.checked(params, key)
        check_sandbox()

    @staticmethod
    def checked(params: dict[str, Any], key: str) -> PythonTestsParams:
        """`params` validated; the first problem as a one-line EnvironmentSpecError naming its field."""
        fields = list(PythonTestsParams.model_fields)
        for name in params:
            if name not in fields:
                hint = did_you_mean(name, fields)
                raise EnvironmentSpecError(f"{key}.{name}: python_tests takes no parameter '{name}'{hint}; its parameters: {', '.join(fields)}")
        try:
            return PythonTestsParams(**params)
        except ValidationError as err:
            first = err.errors()[0]
            where = "".join(f".{part}" for part in first["loc"])
            if first["type"] == "value_error":  # StrictModel's unknown key: its message names it, with a did-you-mean
                raise EnvironmentSpecError(f"{key}{where}: {first['msg'].removeprefix('Value error, ')}") from None
            got = "" if first["type"] == "missing" else f", got {json.dumps(first.get('input'), default=str)[:60]}"
            raise EnvironmentSpecError(f"{key}{where}: {first['msg']}{got}") from None

    def reset(self, row: dict) -> None:
        """Start an episode for a row with `tests`, a non-empty list of Python statements (asserts)."""
        tests = row.get("tests")
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise ValueError(f"python_tests needs a prompt-row field 'tests', a non-empty list of Python statements (asserts), got {str(tests)[:60]}")
        self.tests, self.score = tests, 0.0

    def step(self, assistant: str) -> EnvStep:
        """Run the reply's code against the tests; the reward is the change of the score."""
        self.runs += 1
        try:
            outcome = run_tests(extract_code(assistant), self.tests, self.params.sandbox)
        except SandboxRunError:
            self.sandbox_failures += 1
            raise
        self.tests_passed += sum(outcome.passed)
        passed = sum(outcome.passed) / len(self.tests)
        score = passed if self.params.reward == "fraction" else float(passed == 1.0)
        reward, self.score = score - self.score, score
        if all(outcome.passed):
            return EnvStep(reward=reward, done=True)
        return EnvStep([{"role": "user", "content": self.feedback(outcome.failure)}], reward=reward)

    def feedback(self, failure: str) -> str:
        """The reply to a failed attempt: its first failure, cut to `feedback_chars`."""
        if self.params.feedback_chars == 0:
            return "Some tests failed."
        text = f"Test failed: {' '.join(failure.split())}."
        text = text if len(text) <= self.params.feedback_chars else text[: max(0, self.params.feedback_chars - 3)] + "..."
        return f"{text} Fix the function."

    def metrics(self) -> dict[str, float]:
        """This episode's counters: sandboxed runs, tests passed, runs that failed in the sandbox."""
        return {"code_runs": self.runs, "code_tests_passed": self.tests_passed, "code_sandbox_failures": self.sandbox_failures}


__all__ = ["PythonTestsEnvironment", "PythonTestsParams", "SandboxRunError", "TestOutcome", "extract_code", "run_tests"]
