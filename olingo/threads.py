"""How many threads torch computes with on the CPU, and how its idle OpenMP workers wait (docs/scaling.md).

torch runs its CPU kernels on an OpenMP pool (libgomp). A worker that has finished its share spins for
a while (GOMP_SPINCOUNT; 300,000 turns by default) before it sleeps. Alone on the machine that keeps the
pool quick; beside another busy process every parallel region waits for the worker that lost its core,
while the spinning ones take the cores that worker needs: a tiny GRPO run on 2 cores took 7x as long
beside one busy process (bench/threads_bench.py). libgomp reads OMP_WAIT_POLICY and GOMP_SPINCOUNT once,
when torch loads it, so the olingo command decides them from its raw command line before anything
imports torch (`prepare`) and sets the thread count once torch is loaded (`apply`). A variable the user
set (OMP_NUM_THREADS, OMP_WAIT_POLICY, GOMP_SPINCOUNT) always wins.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import yaml
from pydantic import BeforeValidator, Field

from olingo.config import find_config_file, parse_override
from olingo.errors import OlingoError

logger = logging.getLogger(__name__)

WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")  # libgomp's, read when it loads
# "auto": idle workers spin this many turns (a few to tens of microseconds), then sleep. bench/threads_bench.py on a
# 2-core machine shared with other busy processes, 2 threads, tiny GRPO run: 1,000 and 100 turns ran within
# 12% of PASSIVE and of one thread; 10,000 turns ran 1.9-2.9x as long as one thread and the default 300,000
# 2.4-9x (tiny and SmolLM2 runs). A short spin still catches the quick hand-offs between small kernels, for
# which PASSIVE pays a futex wake-up each when the machine is idle.
AUTO_SPIN_COUNT = 1_000
WAIT_SETTINGS = {"active": {"OMP_WAIT_POLICY": "ACTIVE"}, "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
                 "auto": {"GOMP_SPINCOUNT": str(AUTO_SPIN_COUNT)}}


def thread_count(value: Any) -> Any:
    """`run.threads`: "auto" or a whole number >= 1, refused in one line (not one per branch of the union)."""
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError("expected a whole number >= 1 or 'auto'")


ThreadCount = Annotated[Annotated[int, Field(ge=1)] | Literal["auto"], BeforeValidator(thread_count)]


@dataclass(frozen=True)
class ThreadChoice:
    """What `decide` chose: the intra-op thread count (None: torch's own, from OMP_NUM_THREADS), the
    wait variables to set before torch loads, and why, for the log."""

    threads: int | None
    env: dict[str, str] = field(default_factory=dict)
    reason: str = ""


def decide(threads: int | str = "auto", wait: str = "auto", *, environ: Mapping[str, str]) -> ThreadChoice:
    """The thread count and wait policy from the run's settings (`run.threads`, `run.omp_wait`) and the
    environment; a variable the user set wins over all.

    "auto" leaves the count to torch (one thread per physical core), never to the machine's load:
    the count changes how some kernels split their sums, so a count read from the load would make
    a seeded run's numbers depend on what else ran when it started. The short spin of the "auto"
    wait policy is what keeps a run beside other work near its idle speed."""
    count: int | None
    if "OMP_NUM_THREADS" in environ:
        count, reasons = None, [f"OMP_NUM_THREADS={environ['OMP_NUM_THREADS']} from the environment"]
    elif threads == "auto":
        count, reasons = None, ["run.threads=auto: torch's default"]
    else:
        count, reasons = int(threads), [f"run.threads={threads}"]
    env: dict[str, str] = {}
    user_set = [f"{name}={environ[name]}" for name in WAIT_VARIABLES if name in environ]
    if user_set:
        reasons.append(f"{', '.join(user_set)} from the environment")
    else:
        env = dict(WAIT_SETTINGS[wait])
        reasons.append(f"run.omp_wait={wait}")
    return ThreadChoice(count, env, "; ".join(reasons))


def _run_section(argv: Sequence[str]) -> dict[str, Any]:
    """The `run` section the command line gives: its --config file's, then its `run.` overrides.
    Anything unreadable is left out: the typed config refuses it later with its own message."""
    section: dict[str, Any] = {}
    paths = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--config"]
    for path in paths + [arg.removeprefix("--config=") for arg in argv if arg.startswith("--config=")]:
        try:
            data = yaml.safe_load(find_config_file(path).read_text())
        except (OlingoError, OSError, yaml.YAMLError):
            continue
        if isinstance(data, dict) and isinstance(data.get("run"), dict):
            section.update(data["run"])
    for arg in argv:
        if arg.startswith(("run.threads=", "run.omp_wait=")):
            try:
                keys, value = parse_override(arg)
            except OlingoError:
                continue
            section[keys[1]] = value
    return section


def settings_from_argv(argv: Sequence[str]) -> tuple[int | str, str]:
    """(`run.threads`, `run.omp_wait`) as the command line sets them, read with PyYAML alone (no torch);
    "auto" for a value that is missing or invalid."""
    section = _run_section(argv)
    threads, wait = section.get("threads", "auto"), section.get("omp_wait", "auto")
    try:
        threads = thread_count(threads)
    except ValueError:
        threads = "auto"
    return threads, (wait if wait in WAIT_SETTINGS else "auto")


def prepare(argv: Sequence[str]) -> ThreadChoice:
    """Decide from the command line and put the wait variables into os.environ: call before torch loads."""
    threads, wait = settings_from_argv(argv)
    choice = decide(threads, wait, environ=os.environ)
    os.environ.update(choice.env)
    return choice


def apply(choice: ThreadChoice) -> int:
    """Set torch's intra-op thread count (when the run names one) and log the choice once; returns the count."""
    import torch

    if choice.threads is not None:
        torch.set_num_threads(choice.threads)
    count = torch.get_num_threads()
    policy = os.environ.get("OMP_WAIT_POLICY", "unset")
    spin = os.environ.get("GOMP_SPINCOUNT", "libgomp's default")
    logger.info("CPU threads: %d, OMP_WAIT_POLICY %s, GOMP_SPINCOUNT %s (%s)", count, policy, spin, choice.reason)
    return count
