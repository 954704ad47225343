"""The sandbox for model-written code (olingo/rollout/sandbox.py) holds hostile programs in, and
the `python_tests` environment runs replies against hidden tests in it (olingo/rollout/python_tests.py).

Every hostile program runs with small limits (2 s, 256 MiB, 8 processes). bwrap is required:
`make test` installs it (`make sandbox`), so a machine without it fails here, with the hint."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from olingo.rollout.python_tests import PythonTestsEnvironment, SandboxRunError, extract_code, run_tests
from olingo.rollout.sandbox import SandboxConfig, SandboxUnavailableError, check_sandbox, run_python
from tests.conftest import olingo_cmd, read_jsonl

HOSTILE = SandboxConfig(timeout_s=2, cpu_s=5, memory_mb=256, max_processes=8)
ADD_TESTS = ["assert add(1, 2) == 3", "assert add(-4, 4) == 0", "assert add(0, 0) == 0", "assert add(10, 5) == 15"]


@pytest.fixture(scope="module", autouse=True)
def bwrap_works():
    """Fail (never skip) every test here when the sandbox cannot run, with how to fix it."""
    try:
        check_sandbox()
    except SandboxUnavailableError as err:
        pytest.fail(f"{err} (make test installs it: make sandbox)", pytrace=False)


def sandboxed_pids() -> list[int]:
    """Processes running a sandboxed program (their command line is `python -I -S /tmp/main.py`)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if argv[1:4] == [b"-I", b"-S", b"/tmp/main.py"]:
            found.append(int(entry))
    return found


def test_a_correct_function_passes_its_hidden_tests_and_a_wrong_one_is_shown_its_failure():
    env = PythonTestsEnvironment(sandbox={"timeout_s": 5})
    env.reset({"gt_answer": None, "tests": ADD_TESTS})
    wrong = env.step("Here it is:\n```python\ndef add(a, b):\n    return a - b\n```")
    assert wrong.reward == pytest.approx(0.25) and not wrong.done  # only add(0, 0) passes
    (reply,) = wrong.messages
    assert reply["role"] == "user" and "assert add(1, 2) == 3 (AssertionError)" in reply["content"]
    fixed = env.step("```py\ndef add(a, b):\n    return a + b\n```")
    assert fixed.done and fixed.reward == pytest.approx(0.75)  # the episode's reward: its last attempt's score, 1
    assert env.metrics() == {"code_runs": 2, "code_tests_passed": 5, "code_sandbox_failures": 0}


def test_the_code_is_the_python_block_else_the_first_block_else_the_whole_reply():
    assert extract_code("see:\n```\nx = 1\n```\n```python\ny = 2\n```") == "y = 2\n"
    assert extract_code("```\nx = 1\n```") == "x = 1\n"
    assert extract_code("```python\ndef f():\n    return 1") == "def f():\n    return 1"  # cut off at the token limit
    assert extract_code("def f(): return 1") == "def f(): return 1"


def test_all_or_nothing_scoring_and_a_code_that_does_not_parse():
    env = PythonTestsEnvironment(reward="all", feedback_chars=0)
    env.reset({"tests": ADD_TESTS})
    step = env.step("def add(a, b): return a - b")
    assert step.reward == 0.0 and step.messages == [{"role": "user", "content": "Some tests failed."}]
    outcome = run_tests("def add(a, b)", ADD_TESTS, HOSTILE)
    assert not any(outcome.passed) and "SyntaxError" in outcome.failure and "(the code itself)" in outcome.failure


def test_printing_a_fake_report_or_exiting_early_passes_nothing():
    fake = 'print(\'0 [0, true, ""]\')\nimport sys\nsys.exit(0)'
    assert run_tests(fake, ADD_TESTS[:1], HOSTILE).passed == [False]
    env = PythonTestsEnvironment(sandbox=HOSTILE.model_dump())
    env.reset({"tests": ADD_TESTS})
    with pytest.raises(SandboxRunError, match="before its tests finished"):
        env.step("import os\nos._exit(0)")
    assert env.metrics()["code_sandbox_failures"] == 1


def test_a_row_without_tests_fails_its_episode_with_the_field_named():
    env = PythonTestsEnvironment()
    with pytest.raises(ValueError, match="prompt-row field 'tests'"):
        env.reset({"gt_answer": "3"})


def test_every_packaged_problem_is_solvable_and_its_tests_check_it(olingo_home):
    """The reference solutions pass every hidden test of both splits; a constant answer does not."""
    from olingo.models.sources import resolve_path

    rows = read_jsonl(Path(resolve_path("builtin:python_tests_train"))) + read_jsonl(Path(resolve_path("builtin:python_tests_eval")))
    assert len(rows) == len(REFERENCE) == 48 and all(row["prompt"].startswith("Write a Python function ") for row in rows)
    tests = [test for row in rows for test in row["tests"]]
    assert all(outcome for outcome in run_tests(REFERENCE_SOURCE, tests, SandboxConfig()).passed)
    constant = "\n".join(f"def {name}(*args):\n    return 0" for name in REFERENCE)
    assert sum(run_tests(constant, tests, SandboxConfig()).passed) < len(tests) // 3


def test_a_memory_hog_is_stopped_at_its_limit():
    result = run_python("x = bytearray(1 << 30)\nprint('allocated')", config=HOSTILE)
    assert result.killed == "memory" and "allocated" not in result.stdout and result.exit_code == 1


def test_output_past_the_limit_kills_the_run_and_is_cut():
    config = HOSTILE.model_copy(update={"max_output_bytes": 4096})
    result = run_python("while True:\n    print('x' * 1000)", config=config)
    assert result.killed == "output" and result.exit_code is None and len(result.stdout) <= 4096


def test_the_run_directory_home_root_and_secrets_are_unreadable(tmp_path):
    run_dir = tmp_path / "runs" / "grpo-code"
    run_dir.mkdir(parents=True)
    (run_dir / "secret.txt").write_text("RUN-DIRECTORY-SECRET")
    paths = [str(run_dir / "secret.txt"), str(run_dir), "/root", os.path.expanduser("~/.ssh/id_rsa"), "/etc/shadow", "/etc/passwd", "/home", os.getcwd()]
    program = (
        "import os\n"
        f"for path in {paths!r}:\n"
        "    try:\n"
        "        print(path, 'READ', os.listdir(path) if os.path.isdir(path) else open(path).read())\n"
        "    except OSError as error:\n"
        "        print(path, 'DENIED', type(error).__name__)\n"
    )
    result = run_python(program, config=HOSTILE)
    assert result.ok, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert "RUN-DIRECTORY-SECRET" not in result.stdout
    for path in paths:
        if path == "/root":  # holds only the empty path to the Python install when that lies under /root
            assert lines[path].startswith("DENIED") or lines[path] in ("READ []", "READ ['.pyenv']"), lines[path]
        else:
            assert lines[path].startswith("DENIED"), (path, lines[path])


def test_nothing_outside_its_temp_directory_is_writable(tmp_path):
    outside = tmp_path / "written-by-the-sandbox"
    host_tmp = Path("/tmp") / f"olingo-sandbox-test-{os.getpid()}"
    targets = [str(outside), str(host_tmp), "/usr/lib/olingo-x", "/etc/olingo-x", "/olingo-x", sys.base_prefix + "/olingo-x"]
    program = (
        "import os\n"
        f"for path in {targets!r}:\n"
        "    try:\n"
        "        open(path, 'w').write('x')\n"
        "        print(path, 'WROTE')\n"
        "    except OSError as error:\n"
        "        print(path, 'DENIED')\n"
        "open('/tmp/scratch', 'w').write('ok')\n"
        "print('scratch', open('/tmp/scratch').read())\n"
    )
    result = run_python(program, config=HOSTILE)
    assert result.ok, result.stderr
    host_tmp_written = targets[1] + " WROTE" in result.stdout  # its own /tmp is a tmpfs: the host's sees nothing
    assert not outside.exists() and not host_tmp.exists() and "scratch ok" in result.stdout
    for path in targets:
        assert f"{path} DENIED" in result.stdout or (path == targets[1] and host_tmp_written)


def test_a_socket_reaches_no_listener_of_the_host():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.3)
        port = listener.getsockname()[1]
        program = (
            "import socket\n"
            f"for address in [('127.0.0.1', {port}), ('1.1.1.1', 53)]:\n"
            "    try:\n"
            "        socket.create_connection(address, timeout=1).sendall(b'leak')\n"
            "        print('CONNECTED')\n"
            "    except OSError as error:\n"
            "        print('REFUSED', type(error).__name__)\n"
        )
        result = run_python(program, config=HOSTILE)
        with pytest.raises(TimeoutError):
            listener.accept()
    assert result.ok and "CONNECTED" not in result.stdout and result.stdout.count("REFUSED") == 2, result.stdout


def test_killing_its_parent_or_every_process_reaches_nothing_outside():
    bystander = subprocess.Popen(["sleep", "30"])  # a process of the host the sandbox must not reach
    try:
        program = (
            "import os, subprocess\n"
            "for pid in (os.getppid(), 1, -1):\n"
            "    try:\n"
            "        os.kill(pid, 9)\n"
            "    except OSError as error:\n"
            "        print(pid, type(error).__name__, flush=True)\n"
            "subprocess.run(['/bin/sh', '-c', 'kill -9 -1'])\n"
        )
        result = run_python(program, config=HOSTILE)
        assert bystander.poll() is None  # alive, as is this test's own process
        assert result.exit_code == 128 + 9 and result.killed is None  # `kill -9 -1` killed the program, and only what is inside
    finally:
        bystander.kill()
        bystander.wait()


def test_processes_are_bounded_per_run_even_when_runs_overlap():
    """Each run's RLIMIT_NPROC counts its own processes: 4 runs at once each fork up to 7 children."""
    program = (
        "import os, time\n"
        "children = 0\n"
        "while children < 50:\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(30)\n"
        "        os._exit(0)\n"
        "    children += 1\n"
        "print(children)\n"
    )
    results: list = [None] * 4
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, run_python(program, config=HOSTILE))) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [r.stdout.strip() for r in results] == ["7"] * 4  # 8 processes: the program and 7 children
    assert sandboxed_pids() == []  # the sleeping children died with their sandbox


@pytest.mark.slow
def test_an_infinite_loop_is_killed_at_the_timeout():
    result = run_python("while True:\n    pass", config=HOSTILE)
    assert result.killed == "timeout" and result.exit_code is None and 2.0 <= result.seconds < 4.0


@pytest.mark.slow
def test_cpu_time_past_its_limit_kills_the_program():
    result = run_python("while True:\n    pass", config=HOSTILE.model_copy(update={"cpu_s": 1, "timeout_s": 20}))
    assert result.killed == "cpu" and result.exit_code == 128 + 24  # SIGXCPU


@pytest.mark.slow
def test_a_fork_bomb_is_bounded_and_killed_whole():
    """Every process forks forever: at most max_processes exist at any time, and none outlives the run."""
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    box: dict = {}
    runner = threading.Thread(target=lambda: box.setdefault("result", run_python(bomb, config=HOSTILE)))
    runner.start()
    most = 0
    while runner.is_alive():
        most = max(most, len(sandboxed_pids()))
        time.sleep(0.05)
    runner.join()
    assert box["result"].killed == "timeout" and 2 <= most <= HOSTILE.max_processes
    time.sleep(0.2)
    assert sandboxed_pids() == []


def test_the_environment_checks_its_params_and_the_sandbox_when_configured(monkeypatch):
    from olingo.config import ConfigError, load_config, packaged_config
    from olingo.recipes.grpo import GRPOConfig
    from olingo.rollout import sandbox

    with pytest.raises(ConfigError, match=r"environment.params.sandbox: unknown key 'timeout' \(did you mean 'timeout_s'\?\)"):
        load_config(GRPOConfig, packaged_config("grpo_code_tiny.yaml"), ["environment.params.sandbox.timeout=3"])
    check_sandbox.cache_clear()
    monkeypatch.setattr(sandbox.shutil, "which", lambda *args, **kwargs: None)
    try:
        with pytest.raises(SandboxUnavailableError) as raised:
            load_config(GRPOConfig, packaged_config("grpo_code_tiny.yaml"))
    finally:
        monkeypatch.undo()
        check_sandbox.cache_clear()
    message = str(raised.value)
    assert "\n" not in message and "'bwrap' is not on PATH" in message and "make sandbox" in message


@pytest.mark.slow
def test_a_grpo_run_with_python_tests_runs_code_in_the_sandbox(tmp_path):
    """grpo_code_tiny.yaml for 2 steps. The untrained tiny model rarely stops by itself: a stop
    string of every printable character ends each turn, so every turn's code runs (and fails)."""
    import string

    stops = "[" + ",".join(repr(c) for c in string.ascii_letters + string.digits) + "]"
    overrides = [
        f"run.output_dir={tmp_path}", "run.name=code", "loop.episodes=2", "loop.rollout_batch_size=2", "loop.train_batch_size=4",
        "experience.num_generations=2", "loop.save_interval=0", "loop.eval_interval=0", "data.eval_prompts=[]", "logging.progress=false",
        f"generation.stop_strings={stops}",
    ]
    proc = subprocess.run(olingo_cmd("grpo", "--config", "grpo_code_tiny.yaml", *overrides), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [r for r in read_jsonl(tmp_path / "code" / "metrics.jsonl") if r["split"] == "train"]
    assert len(rows) == 2
    for row in rows:
        assert "rollout/reward/environment" in row and row["rollout/code_runs"] >= 4 and row["rollout/env_errors"] == 0


REFERENCE = {
    "add": "return a + b", "sub": "return a - b", "mul": "return a * b", "is_even": "return n % 2 == 0", "is_odd": "return n % 2 == 1",
    "square": "return n * n", "cube": "return n ** 3", "double": "return 2 * n", "half": "return n // 2", "negate": "return -n",
    "absolute": "return abs(n)", "maximum": "return max(a, b)", "minimum": "return min(a, b)", "reverse": "return s[::-1]",
    "length": "return len(s)", "first": "return xs[0]", "last": "return xs[-1]", "total": "return sum(xs)", "count_char": "return s.count(c)",
    "upper": "return s.upper()", "lower": "return s.lower()", "is_empty": "return s == ''", "concat": "return a + b", "repeat": "return s * n",
    "is_positive": "return n > 0", "sign": "return (n > 0) - (n < 0)", "factorial": "return 1 if n < 2 else n * factorial(n - 1)",
    "fib": "return n if n < 2 else fib(n - 1) + fib(n - 2)", "is_palindrome": "return s == s[::-1]",
    "count_vowels": "return sum(ch in 'aeiou' for ch in s)", "mean": "return sum(xs) / len(xs)", "max_list": "return max(xs)",
    "min_list": "return min(xs)", "evens": "return [x for x in xs if x % 2 == 0]", "squares": "return [x * x for x in xs]",
    "contains": "return x in xs", "index_of": "return xs.index(x) if x in xs else -1", "clamp": "return max(lo, min(n, hi))",
    "gcd": "return a if b == 0 else gcd(b, a % b)", "is_prime": "return n > 1 and all(n % k for k in range(2, n))",
    "digit_sum": "return sum(int(d) for d in str(n))", "swap": "return (b, a)", "capitalize": "return s[:1].upper() + s[1:]",
    "remove_spaces": "return s.replace(' ', '')", "words": "return s.split()", "join_words": "return ' '.join(ws)",
    "average": "return (a + b) / 2", "is_divisible": "return a % b == 0",
}
ARGS = {
    "add": "a, b", "sub": "a, b", "mul": "a, b", "maximum": "a, b", "minimum": "a, b", "concat": "a, b", "gcd": "a, b", "swap": "a, b",
    "average": "a, b", "is_divisible": "a, b", "first": "xs", "last": "xs", "total": "xs", "mean": "xs", "max_list": "xs", "min_list": "xs",
    "evens": "xs", "squares": "xs", "contains": "xs, x", "index_of": "xs, x", "clamp": "n, lo, hi", "count_char": "s, c", "repeat": "s, n",
    "join_words": "ws", "reverse": "s", "length": "s", "upper": "s", "lower": "s", "is_empty": "s", "is_palindrome": "s", "count_vowels": "s",
    "capitalize": "s", "remove_spaces": "s", "words": "s",
}
REFERENCE_SOURCE = "\n".join(f"def {name}({ARGS.get(name, 'n')}):\n    {body}" for name, body in REFERENCE.items())
