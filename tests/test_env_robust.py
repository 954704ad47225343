"""Nothing an environment does hangs the process or prints a traceback (docs/agents.md, "Failures"):
a call past its timeout is abandoned on a daemon thread, so the run still exits; a runtime
failure is counted and logged with its row and message; a wrong return or a chat template
without a tool role is one line and exit status 2 (docs/errors.md)."""

from __future__ import annotations

import copy
import logging
import math
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy
import pytest
import yaml

from olingo.dataset.chat_tokens import ChatTemplateError
from olingo.errors import OlingoError
from olingo.recipes.online_config import EnvironmentConfig, GenerationSection, warn_turn_cap
from olingo.rollout import EnvStep, ToolEnvironment
from olingo.rollout.environment import DaemonPool, EnvFailure, EnvironmentReturnError, call_all
from tests.conftest import olingo_cmd, read_jsonl
from tests.test_engines import tok  # noqa: F401 - the module's tokenizer fixture
from tests.test_multi_turn import ScriptedEnv, ids_of, run

CALCULATE = "olingo.rollout.calculator:calculate"


# ---- abandoned calls ------------------------------------------------------------------------------
def test_a_call_past_its_timeout_is_abandoned_on_a_daemon_thread():
    """A plain call that blocks and an async one that blocks its own event loop both come back as
    timeouts, and the threads left running them are daemons, which the interpreter does not join."""
    release = threading.Event()

    async def blocks_its_loop() -> None:
        release.wait(10.0)  # no await: the event loop itself is stuck

    try:
        started = time.perf_counter()
        plain = call_all([(release.wait, (10.0,)), (str, (1,))], 0.2)
        async_ = call_all([(blocks_its_loop, ())], 0.2)
        elapsed = time.perf_counter() - started
        assert isinstance(plain[0], EnvFailure) and isinstance(plain[0].error, TimeoutError) and plain[1] == "1"
        assert isinstance(async_[0], EnvFailure) and isinstance(async_[0].error, TimeoutError)
        assert elapsed < 3.0  # 0.2 s, then 0.2 s and the loop's 1 s grace: neither stuck call was waited for
        stuck = [t for t in threading.enumerate() if t.name.startswith("olingo-env")]
        assert stuck and all(t.daemon for t in stuck)
    finally:
        release.set()


def test_the_daemon_pool_reuses_idle_threads_and_a_shut_down_one_still_runs_what_it_is_given():
    pool = DaemonPool(2, "test-pool")
    names = [pool.submit(lambda: threading.current_thread().name).result(5.0) for _ in range(3)]
    assert len(set(names)) == 1 and names[0].startswith("test-pool")  # one thread, reused
    gate = threading.Event()
    busy = [pool.submit(gate.wait, 5.0) for _ in range(3)]  # the third waits for a thread: max 2
    assert len(pool._threads) == 2
    gate.set()
    assert all(f.result(5.0) for f in busy)
    pool.shutdown(wait=False)
    late = pool.submit(lambda: "ran")  # a caller that got the pool before it was retired
    assert late.result(5.0) == "ran"
    pool.shutdown(wait=True)  # a second shutdown returns at once
    deadline = time.monotonic() + 5.0
    while any(t.is_alive() for t in pool._threads) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.is_alive() for t in pool._threads)  # every thread ended once idle


@pytest.mark.slow  # a subprocess that imports olingo (torch): ~7 s
def test_a_process_whose_call_all_abandoned_a_call_that_never_returns_exits_promptly():
    script = textwrap.dedent("""
        import asyncio, threading, time
        from olingo.rollout.environment import EnvFailure, call_all

        async def blocks_its_loop():
            time.sleep(3600)

        results = call_all([(threading.Event().wait, ()), (time.sleep, (3600,))], 0.2) + call_all([(blocks_its_loop, ())], 0.2)
        assert all(isinstance(r, EnvFailure) and isinstance(r.error, TimeoutError) for r in results), results
        print("returned", flush=True)
    """)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "returned", done.stderr
    assert time.monotonic() - started < 60  # the import takes ~7 s on a loaded 2-core CPU; a joined thread would take an hour


# ---- runtime failures are logged ------------------------------------------------------------------
class KeyErrorStep(ScriptedEnv):
    def step(self, assistant: str) -> EnvStep:
        raise KeyError("boom")


class ValueErrorReset(ScriptedEnv):
    def reset(self, row: dict) -> None:
        raise ValueError("no such task")


def test_the_first_environment_error_of_each_kind_per_batch_is_logged_with_its_row_and_message(tok, caplog):  # noqa: F811
    envs = [KeyErrorStep([]), ValueErrorReset([]), KeyErrorStep([]), ScriptedEnv([EnvStep([], reward=1.0, done=True)])]
    scripts = [[ids_of(tok, c)] for c in "abcd"]
    with caplog.at_level(logging.WARNING, logger="olingo.rollout"):
        sampled, _, _ = run(tok, ["p0", "p1", "p2", "p3"], scripts, envs)
    assert sampled.info["env_errors"] == 3 and sampled.env_rewards.tolist() == [0.0, 0.0, 0.0, 1.0]
    messages = [r.getMessage() for r in caplog.records if r.name == "olingo.rollout"]
    assert len(messages) == 2, messages  # one per environment class and exception class, not one per episode
    reset, step = sorted(messages, key=lambda m: "step failed" in m)
    assert "ValueErrorReset: reset failed with ValueError in 1 of 4 episodes" in reset
    assert "prompt 1 of the batch, episode 0: ValueError: no such task (at test_env_robust.py:" in reset
    assert "KeyErrorStep: step failed with KeyError in 2 of 4 episodes" in step
    assert "prompt 0 of the batch, episode 0: KeyError: 'boom'" in step


# ---- a wrong return is the user's mistake: one line, the run stops --------------------------------
class Returns(ScriptedEnv):
    """Returns `value` from step (or from reset, with `in_reset`)."""

    def __init__(self, value, in_reset: bool = False) -> None:
        super().__init__([])
        self.value, self.in_reset = value, in_reset

    def reset(self, row: dict):
        return self.value if self.in_reset else None

    def step(self, assistant: str):
        return self.value


@pytest.mark.parametrize(("env", "expected"), [
    (Returns((EnvStep(), 1.0, True)), "step must return an olingo.rollout.EnvStep, got tuple (EnvStep("),
    (Returns(EnvStep(reward=math.nan, done=True)), "EnvStep.reward must be a finite number, got float nan"),
    (Returns(EnvStep(reward="1", done=True)), "EnvStep.reward must be a finite number, got str '1'"),
    (Returns(EnvStep(done="yes")), "EnvStep.done must be True or False, got str 'yes'"),
    (Returns("Welcome!", in_reset=True), "reset must return None, got str 'Welcome!'"),
], ids=["step-tuple", "reward-nan", "reward-str", "done-str", "reset-observation"])
def test_a_wrong_return_is_a_one_line_user_error_naming_the_environment_and_row(tok, env, expected):  # noqa: F811
    with pytest.raises(EnvironmentReturnError) as raised:
        run(tok, ["p0", "p1"], [[ids_of(tok, "a")], [ids_of(tok, "b")]], [ScriptedEnv([EnvStep([], done=True)]), env])
    message = str(raised.value)
    assert isinstance(raised.value, OlingoError) and "\n" not in message  # the CLI prints it as one line, exit 2
    assert message.startswith("environment tests.test_env_robust:Returns (row 1): ") and expected in message, message


def test_numpy_rewards_and_dones_are_accepted(tok):  # noqa: F811 - what a library environment may compute
    env = Returns(EnvStep(reward=numpy.float32(0.5), done=numpy.bool_(True)))
    sampled, _, _ = run(tok, ["p0"], [[ids_of(tok, "a")]], [env])
    assert sampled.env_rewards.tolist() == [0.5] and sampled.info["done_episodes"] == 1


def test_a_tool_may_return_any_value_its_message_holds_its_text():
    def nothing(a: int) -> None:
        """Return nothing.

        Args:
            a: Ignored.
        """

    def number(a: int) -> int:
        """Return a number.

        Args:
            a: The number.
        """
        return a

    env = ToolEnvironment([nothing, number])
    step = env.step('<tool_call>{"name": "nothing", "arguments": {"a": 1}}</tool_call><tool_call>{"name": "number", "arguments": {"a": 7}}</tool_call>')
    assert [m["content"] for m in step.messages] == ["None", "7"] and env.tool_errors == 0


# ---- a chat template without a tool role, found once the tokenizer is loaded ----------------------
def test_a_template_without_a_tool_role_is_found_by_a_probe_naming_the_field_to_set(tok):  # noqa: F811 - the tiny template: system/user/assistant
    cases = [
        (EnvironmentConfig(name="tools", params={"tools": [CALCULATE]}), "environment 'tools'", "environment.params.result_role"),
        (EnvironmentConfig(name="calculator"), "environment 'calculator'", "environment.params.result_role"),
        (EnvironmentConfig(name="arithmetic_retry", choices={"calc": {"name": "tools", "params": {"tools": [CALCULATE]}}}),
         "environment 'tools'", "environment.choices.calc.params.result_role"),
    ]
    for cfg, where, key in cases:
        with pytest.raises(ChatTemplateError) as raised:
            cfg.check_tokenizer(tok)
        assert str(raised.value) == (
            f"{where}: the chat template has no 'tool' role (rendering a tool result message raised: unknown role tool, "
            f"expected system/user/assistant): set {key}: user"
        )
    EnvironmentConfig(name="tools", params={"tools": [CALCULATE], "result_role": "user"}).check_tokenizer(tok)
    EnvironmentConfig(name="arithmetic_retry").check_tokenizer(tok)  # no tools: nothing to probe


def test_the_probe_passes_a_template_with_a_tool_role_and_refuses_one_that_drops_tool_results(tok):  # noqa: F811
    chatml, dropping = copy.deepcopy(tok), copy.deepcopy(tok)
    chatml.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    dropping.chat_template = chatml.chat_template.replace("{{ m['content'] }}", "{% if m['role'] != 'tool' %}{{ m['content'] }}{% endif %}")
    cfg = EnvironmentConfig(name="tools", params={"tools": [CALCULATE]})
    cfg.check_tokenizer(chatml)
    with pytest.raises(ChatTemplateError, match=r"leaves the content of 'tool' messages out.*set environment.params.result_role: user$"):
        cfg.check_tokenizer(dropping)


# ---- the turn cap ---------------------------------------------------------------------------------
def test_a_capped_environment_max_new_tokens_is_a_warning_naming_both_values(caplog):
    with caplog.at_level(logging.WARNING, logger="olingo.rollout"):
        warn_turn_cap(EnvironmentConfig(name="arithmetic_retry", max_new_tokens=64), GenerationSection(max_new_tokens=8))
        warn_turn_cap(EnvironmentConfig(name="arithmetic_retry", max_new_tokens=8), GenerationSection(max_new_tokens=8))
        warn_turn_cap(EnvironmentConfig(max_new_tokens=64), GenerationSection(max_new_tokens=8))  # no environment
    messages = [r.getMessage() for r in caplog.records if r.name == "olingo.rollout"]
    assert len(messages) == 1 and messages[0].startswith("environment.max_new_tokens=64 is capped by generation.max_new_tokens=8")


# ---- through the CLI ------------------------------------------------------------------------------
ENV_MODULE = '''
import time

from olingo.rollout import EnvStep


class Hangs:
    def reset(self, row):
        pass

    def step(self, assistant):
        while True:
            time.sleep(3600)


class ReturnsATuple:
    def reset(self, row):
        pass

    def step(self, assistant):
        return EnvStep(), 1.0, True
'''


def cli_config(tmp_path: Path, environment: str) -> Path:
    """grpo_agent_tiny.yaml for 2 short episodes with `environment`. The untrained tiny model
    writes random characters and almost never stops within its 8 tokens, so no step would be
    called: a stop string of every printable character ends each turn at its first token."""
    import string

    from olingo.config import packaged_config

    (tmp_path / "robust_env.py").write_text(ENV_MODULE)
    data = yaml.safe_load(packaged_config("grpo_agent_tiny.yaml").read_text())
    data["generation"]["stop_strings"] = list(string.ascii_letters + string.digits + string.punctuation)
    data["environment"].update(name=environment, step_timeout_s=0.5)
    data["loop"].update(episodes=2, rollout_batch_size=2, train_batch_size=4, save_interval=0)
    data["experience"]["num_generations"] = 2
    data["logging"]["progress"] = False
    data["run"].update(output_dir=str(tmp_path / "runs"))
    path = tmp_path / "robust.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_cli(tmp_path: Path, config: Path, *overrides: str, timeout: float = 240) -> tuple[int, list[tuple[float, str]], float]:
    """The CLI with `robust_env` importable: (status, (time, line) of its output, time it exited).
    A reader thread takes the output, so a process that does not exit is killed after `timeout`."""
    import os

    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen(olingo_cmd("grpo", "--config", str(config), *overrides), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), line) for line in proc.stdout))
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        reader.join()
        pytest.fail(f"olingo grpo did not exit within {timeout} s; its last lines: {''.join(line for _, line in lines[-5:])}")
    exited = time.monotonic()
    reader.join()
    return proc.returncode, lines, exited


@pytest.mark.slow
def test_a_grpo_run_whose_environment_step_never_returns_exits_when_training_ends(tmp_path):
    code, lines, exited = run_cli(tmp_path, cli_config(tmp_path, "robust_env:Hangs"))
    text = "".join(line for _, line in lines)
    assert code == 0, text
    final = next(at for at, line in lines if line.startswith("final actor:"))
    # Python's exit after the last line (freeing torch, the interpreter's teardown) takes well under
    # a second; 30 s leaves room for a loaded 2-core CPU. Before, the process never exited.
    assert exited - final < 30, text
    assert "robust_env:Hangs: step failed with TimeoutError" in text and "timed out after 0.5s (environment.step_timeout_s)" in text
    rows = [r for r in read_jsonl(tmp_path / "runs" / "grpo-agent-tiny" / "metrics.jsonl") if r["split"] == "train"]
    assert len(rows) == 2 and all(r["rollout/env_errors"] == 4 for r in rows)  # every step was called, and abandoned


@pytest.mark.slow
@pytest.mark.parametrize(("environment", "overrides", "expected"), [
    ("robust_env:ReturnsATuple", (), "olingo: environment robust_env:ReturnsATuple (row 0): step must return an olingo.rollout.EnvStep, got tuple"),
    ("tools", (f"environment.params={{tools: [{CALCULATE}]}}",), "olingo: environment 'tools': the chat template has no 'tool' role"),
], ids=["step-returns-a-tuple", "template-without-tool-role"])
def test_a_user_mistake_in_an_environment_is_one_line_and_exit_2_through_the_cli(tmp_path, environment, overrides, expected):
    code, lines, _ = run_cli(tmp_path, cli_config(tmp_path, environment), *overrides)
    text = "".join(line for _, line in lines)
    assert code == 2 and "Traceback" not in text, text
    errors = [line for _, line in lines if line.startswith("olingo:")]
    assert len(errors) == 1 and errors[0].startswith(expected) and lines[-1][1] == errors[0], text
