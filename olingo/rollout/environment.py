"""Environments for multi-turn episodes: the `Environment` protocol, the `EnvStep` it answers
with, a registry of environments by name, and the runner that calls them concurrently.

An episode starts from one dataset row: `reset(row)` gets the row's `gt_answer` and its other
fields (its first context is the row's own prompt, already chat-templated, so reset adds no
tokens), then each `step(assistant_text)` answers the policy's turn with messages, a reward and
whether the episode is done. Either method may be `async def`.

Naming an environment (a *spec*):
    "calculator"              a registered name (`@register_environment("calculator")`)
    "my_pkg.envs:Calculator"  the class `Calculator` of module `my_pkg.envs` (imported)
A run's `EnvironmentCatalog` holds its default environment and the aliases a prompt row may
name in its `environment` field (`ROW_FIELD`), so one batch may mix environments.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import math
import numbers
import os
import queue
import threading
import time
from collections.abc import Callable, Collection, Coroutine, Sequence
from concurrent.futures import Executor, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy

from olingo.config_errors import did_you_mean
from olingo.errors import OlingoError
from olingo.rewards.registry import one_line

T = TypeVar("T", bound=type)
R = TypeVar("R")


@dataclass
class EnvStep:
    """The environment's answer to one assistant turn."""

    messages: list[dict] = field(default_factory=list)
    """The reply: tool results `{"role": "tool", "content": ...}` or user/observation turns."""
    reward: float = 0.0
    """This step's reward; an episode's reward is the sum over its steps."""
    done: bool = False
    """True ends the episode (its reply, if any, is not rendered)."""


@runtime_checkable
class Environment(Protocol):
    """One episode's environment. Either method may be `async def`."""

    def reset(self, row: dict) -> Any:
        """Start an episode for one dataset row: `{"gt_answer": ..., **the row's other fields}`."""
        ...

    def step(self, assistant: str) -> Any:
        """The policy's assistant turn as text -> an `EnvStep` (or an awaitable of one)."""
        ...


class EnvironmentSpecError(OlingoError, ValueError):
    """An environment name or import path that names no environment class."""


# ---- registry ------------------------------------------------------------------------------
ENVIRONMENTS: dict[str, type] = {}  # registered name -> class
_PATH_EXAMPLE = "'package.module:Class'"


def register_environment(name: str) -> Callable[[T], T]:
    """Class decorator: register an environment under `name` (no ':', which marks import paths)."""
    if not name or ":" in name or name != name.strip():
        raise EnvironmentSpecError(f"bad environment name {name!r}: a registered name is non-empty, without ':' or surrounding spaces")

    def register(cls: T) -> T:
        taken = ENVIRONMENTS.get(name)
        # Re-importing (or reloading) the defining module registers the same class again.
        if taken is not None and _qualified(taken) != _qualified(cls):
            raise EnvironmentSpecError(f"environment name '{name}' is taken by {_qualified(taken)}; register {_qualified(cls)} under another name")
        ENVIRONMENTS[name] = cls
        return cls

    return register


BUILTIN_ENVIRONMENTS = {  # imported when named
    "arithmetic_retry": "olingo.rollout.retry:RetryArithmetic",
    "calculator": "olingo.rollout.calculator:CalculatorEnvironment",
    "python_tests": "olingo.rollout.python_tests:PythonTestsEnvironment",  # model-written code in a sandbox (bubblewrap)
    "reasoning_gym": "olingo.rollout.reasoning_gym:ReasoningGymEnvironment",  # requirements-agents.txt
    "textarena": "olingo.rollout.textarena:TextArenaEnvironment",  # requirements-agents.txt
    "tools": "olingo.rollout.tools:ConfiguredTools",  # tools named by import path in a config
}


def resolve_environment(spec: str, extra: Collection[str] = ()) -> type:
    """The class a spec names: a registered or built-in name, or 'package.module:Class' (imported).
    `extra`: other names the caller accepts (aliases), offered in the did-you-mean."""
    if ":" in spec:
        return _import_class(spec)
    if spec in BUILTIN_ENVIRONMENTS and spec not in ENVIRONMENTS:
        return _import_class(BUILTIN_ENVIRONMENTS[spec])
    if spec in ENVIRONMENTS:
        return ENVIRONMENTS[spec]
    hint = did_you_mean(spec, [*ENVIRONMENTS, *BUILTIN_ENVIRONMENTS, *extra])
    if not hint and "." in spec:  # 'my_pkg.envs.Calculator' is a common way to mean a path
        module, _, attr = spec.rpartition(".")
        hint = f" (did you mean '{module}:{attr}'?)"
    registered = ", ".join(sorted({*ENVIRONMENTS, *BUILTIN_ENVIRONMENTS}))
    raise EnvironmentSpecError(f"unknown environment '{spec}'{hint}; registered: {registered}; name a class of your own by its import path, {_PATH_EXAMPLE}")


ROW_FIELD = "environment"  # the prompt-row field that names a row's own environment


def check_params(cls: type, params: dict[str, Any], key: str) -> None:
    """One-line EnvironmentSpecError naming `key` when `cls(**params)` cannot be built: the class's
    own `check_params(params, key)` classmethod where it has one (it may check values too, before
    any episode), else a parameter its constructor does not take or a required one missing."""
    own = getattr(cls, "check_params", None)
    if callable(own):
        own(params, key)
        return
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # no readable signature: only building it can tell
        return
    names = [n for n, p in signature.parameters.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    for name in params:
        if name not in names and not takes_any:
            taken = ", ".join(names) or "none"
            raise EnvironmentSpecError(f"{key}.{name}: {cls.__name__} takes no parameter '{name}'{did_you_mean(name, names)}; its parameters: {taken}")
    try:
        signature.bind(**params)
    except TypeError as err:
        raise EnvironmentSpecError(f"{key}: {cls.__name__}({', '.join(params)}) cannot be built: {err}") from None


class EnvironmentCatalog:
    """The environments a run builds: the default one, for rows without an `environment` field,
    and those a row may name there, either an alias of `choices` (`{alias: (spec, params)}`) or
    any spec (built without parameters; the default's spec gets the default's parameters).
    Classes are resolved once; `factory(name)` makes one environment per call. `key` is the
    config section the messages name."""

    def __init__(self, default: str, params: dict[str, Any], choices: dict[str, tuple[str, dict[str, Any]]] | None = None, key: str = "environment") -> None:
        self.default, self.params, self.choices, self.key = default, dict(params), dict(choices or {}), key
        self._classes: dict[str, type] = {}

    def factory(self, name: str | None = None) -> Callable[[], Any]:
        """A factory of no arguments for the environment `name` names (None: the default)."""
        spec, params = self.entry(name)
        if spec not in self._classes:
            self._classes[spec] = resolve_environment(spec, extra=self.choices)
        return functools.partial(self._classes[spec], **params)

    def entry(self, name: str | None) -> tuple[str, dict[str, Any]]:
        """(spec, params) of `name`: an alias, the default's spec, or any other spec."""
        if name is None or name == self.default:
            return self.default, self.params
        if name in self.choices:
            return self.choices[name]
        return name, {}

    def configured(self) -> list[tuple[str, str, str, dict[str, Any]]]:
        """(name key, params key, spec, params) of the default environment and of every choice."""
        entries = [(f"{self.key}.name", f"{self.key}.params", self.default, self.params)]
        for alias, (spec, params) in self.choices.items():
            entries.append((f"{self.key}.choices.{alias}.name", f"{self.key}.choices.{alias}.params", spec, params))
        return entries

    def check_all(self) -> None:
        """One-line EnvironmentSpecErrors naming the config field: every configured environment
        resolves and takes its parameters (run when the config is built, before any episode)."""
        for name_key, params_key, spec, params in self.configured():
            try:
                cls = resolve_environment(spec)
            except EnvironmentSpecError as err:
                raise EnvironmentSpecError(f"{name_key}: {err}") from None
            check_params(cls, params, params_key)

    def check_name(self, name: Any, where: str) -> None:
        """One-line EnvironmentSpecError, starting with `where`, unless `name` names an
        environment this catalog can build."""
        if not isinstance(name, str) or not name.strip():
            raise EnvironmentSpecError(f"{where}: field '{ROW_FIELD}' must be an environment name or 'package.module:Class', got {one_line_repr(name)}")
        if name in self.choices or name == self.default:
            return
        try:
            check_params(resolve_environment(name, extra=self.choices), {}, f"{ROW_FIELD} '{name}' (built without params; name an alias of {self.key}.choices)")
        except (EnvironmentSpecError, ValueError) as err:
            reason = " ".join(str(err).split())
            raise EnvironmentSpecError(f"{where}: field '{ROW_FIELD}': {reason}") from None


def _import_class(spec: str) -> type:
    """The class at 'package.module:Class'."""
    module, module_name, attr = import_path(spec, f"environment '{spec}'", f"an import path {_PATH_EXAMPLE}", EnvironmentSpecError)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            choices = [n for n in dir(obj) if not n.startswith("_") and inspect.isclass(getattr(obj, n, None))]
            raise EnvironmentSpecError(f"environment '{spec}': '{module_name}' has no attribute '{attr}'{did_you_mean(part, choices)}")
        obj = getattr(obj, part)
    if not inspect.isclass(obj):
        raise EnvironmentSpecError(f"environment '{spec}' is {type(obj).__name__}, not a class")
    return obj


def import_path(spec: str, label: str, expected: str, error: type[Exception]) -> tuple[Any, str, str]:
    """The module 'package.module:name' names, its name and `name`; a one-line `error` starting with
    `label` when the spec has no ':' part or the import fails."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise error(f"{label}: expected {expected}" + ("" if label.endswith(f"'{spec}'") else f", got '{spec}'"))
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # not found, or its own code failed
        raise error(f"{label}: importing '{module_name}' failed: {one_line(err)} (is its directory on PYTHONPATH?)") from None
    return module, module_name, attr


def _qualified(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"


# ---- checking what an environment returns -------------------------------------------------
class EnvironmentReturnError(OlingoError, ValueError):
    """An environment whose reset or step returns what the protocol does not take, or a reply the
    chat template cannot render: a programming mistake that would fail every episode, so the run
    stops with one line (an exception raised inside a step is a runtime failure instead: counted)."""


def environment_name(env: Any) -> str:
    """'module:Class', the way a config names the environment's class."""
    cls = type(env)
    return f"{cls.__module__}:{cls.__qualname__}"


def check_reset(result: Any, env: Any, row: int) -> None:
    """Nothing unless `result` (what reset returned) is not None: the episode's first context is
    the row's prompt and reset adds no tokens, so a returned observation would be silently lost."""
    if result is not None:
        raise EnvironmentReturnError(
            f"environment {environment_name(env)} (row {row}): reset must return None, got {type(result).__name__} {one_line_repr(result)}: "
            "the episode's first context is the row's own prompt (reset adds no messages), so put what the policy should see first into the prompt rows"
        )


def check_step(result: Any, env: Any, row: int) -> EnvStep:
    """`result` if it is a well-formed `EnvStep`, else a one-line EnvironmentReturnError naming the
    environment class and the row: a wrong return is a programming error and stops the run."""
    where = f"environment {environment_name(env)} (row {row})"
    if not isinstance(result, EnvStep):
        got = f"{type(result).__name__} {one_line_repr(result)}"
        raise EnvironmentReturnError(f"{where}: step must return an olingo.rollout.EnvStep, got {got}")
    if not isinstance(result.messages, list):
        raise EnvironmentReturnError(f"{where}: EnvStep.messages must be a list of {{'role', 'content'}} dicts, got {type(result.messages).__name__}")
    for message in result.messages:
        if not (isinstance(message, dict) and isinstance(message.get("role"), str) and "content" in message):
            raise EnvironmentReturnError(f"{where}: EnvStep.messages must be a list of {{'role', 'content'}} dicts, got {one_line_repr(message)}")
    reward = result.reward
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
        raise EnvironmentReturnError(f"{where}: EnvStep.reward must be a finite number, got {type(reward).__name__} {one_line_repr(reward)}")
    if not isinstance(result.done, bool | numpy.bool_):
        raise EnvironmentReturnError(f"{where}: EnvStep.done must be True or False, got {type(result.done).__name__} {one_line_repr(result.done)}")
    return result


def one_line_repr(value: Any, limit: int = 80) -> str:
    """`repr(value)` on one line, cut to `limit` characters."""
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---- running environment calls concurrently -----------------------------------------------
class EnvFailure:
    """What an environment call that raised or timed out gives instead of its result."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __repr__(self) -> str:
        return f"EnvFailure({one_line(self.error)})"


def call_all(calls: Sequence[tuple[Callable[..., Any], tuple]], timeout_s: float) -> list[Any]:
    """Run `fn(*args)` for every call concurrently, each bounded by `timeout_s` seconds.

    Returns the results in order; a call that raised or ran past its timeout gives an
    `EnvFailure`. Plain functions run in a thread pool, `async def` ones on an event loop (on a
    thread of its own). A call past its timeout cannot be stopped: it is abandoned, its thread
    left to finish on its own, and the pool it holds is retired (no later call waits behind it).
    Every thread is a daemon: an abandoned call that never returns neither holds the caller nor
    keeps the process from exiting (it is not joined; it runs until the process exits).

    The pools are kept between calls (`_Pools`): starting a thread costs ~50 us, and a run
    makes a `call_all` per turn, each environment step a nested one for its tools.
    """
    if not calls:
        return []
    depth = getattr(_POOLS.local, "depth", 0)
    pool = _POOLS.get(depth)
    has_async = any(inspect.iscoroutinefunction(fn) for fn, _ in calls)
    calls = [(fn, args) if inspect.iscoroutinefunction(fn) else (_at_depth, (depth + 1, fn, args)) for fn, args in calls]
    results = _on_event_loop(calls, timeout_s, pool, depth) if has_async else _threads(calls, timeout_s, pool, depth)
    if any(isinstance(r, EnvFailure) and isinstance(r.error, TimeoutError | asyncio.TimeoutError) for r in results):
        _POOLS.retire(depth, pool)
    return results


def _at_depth(depth: int, fn: Callable[..., Any], args: tuple) -> Any:
    """`fn(*args)` on a pool thread that knows its nesting depth: a `call_all` it makes (an
    environment step calling its tools) uses the next depth's pool, never waiting on its own."""
    _POOLS.local.depth = depth
    return fn(*args)


class DaemonPool(Executor):
    """A thread pool whose threads are daemons, which the interpreter does not join at exit.

    The stdlib's ThreadPoolExecutor joins its workers when the process exits, even after
    `shutdown(wait=False)`, so one stuck call would keep a finished run alive forever. Like it,
    this pool starts a thread for a call only when no idle one is waiting, up to `max_workers`,
    and reuses idle threads. Once shut down, its threads end when they are idle, and a call
    still submitted (by a caller that got the pool before) runs on a thread of its own."""

    def __init__(self, max_workers: int, name: str) -> None:
        self._max_workers, self._name = max_workers, name
        self._queue: queue.SimpleQueue = queue.SimpleQueue()  # calls, and None: one thread ends
        self._idle = threading.Semaphore(0)  # released by each thread that waits for work
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._closed = False

    def submit(self, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> Future[R]:
        """Run `fn(*args, **kwargs)` on a pool thread; its `Future`."""
        future: Future[R] = Future()
        with self._lock:
            self._queue.put((future, fn, args, kwargs))
            if self._closed:  # a thread for this call alone, ended by the None after it
                self._queue.put(None)
                self._start_thread()
            elif not self._idle.acquire(blocking=False) and len(self._threads) < self._max_workers:
                self._start_thread()
        return future

    def _start_thread(self) -> None:
        thread = threading.Thread(target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as err:  # the call's own error, handed to its caller
                    future.set_exception(err)
            del item, future, fn, args, kwargs  # no reference to the last call's objects while idle
            self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Each thread ends once the calls queued before are taken (a busy one after its call);
        `cancel_futures` cancels those not started; `wait` joins the threads (never a stuck one's
        pool: call_all does not wait)."""
        with self._lock:
            if self._closed:
                return
            self._closed, threads = True, list(self._threads)
            while cancel_futures:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
            for _ in threads:
                self._queue.put(None)
        for thread in threads if wait else ():
            thread.join()


class _Pools:
    """The thread pools of `call_all`, one per nesting depth, kept for the process.

    A pool grows to as many threads as calls run at once (up to `MAX_WORKERS`) and reuses idle
    ones. One whose call ran past its timeout is retired: the stuck thread stays with it, and the
    next `call_all` at that depth gets a fresh pool, so no call ever queues behind a stuck one. A
    forked child starts with none: its copies of the parent's pools have no threads."""

    MAX_WORKERS = 256

    def __init__(self) -> None:
        self.local = threading.local()
        self._lock = threading.Lock()
        self._pools: dict[int, DaemonPool] = {}

    def get(self, depth: int) -> DaemonPool:
        with self._lock:
            if depth not in self._pools:
                self._pools[depth] = DaemonPool(self.MAX_WORKERS, f"olingo-env{depth}")
            return self._pools[depth]

    def retire(self, depth: int, pool: DaemonPool) -> None:
        with self._lock:
            if self._pools.get(depth) is pool:
                del self._pools[depth]
        pool.shutdown(wait=False)  # calls other callers queued on it still run

    def forget(self) -> None:
        """In a forked child: start again with no pools (and a lock no parent thread holds)."""
        self.local, self._lock, self._pools = threading.local(), threading.Lock(), {}


_POOLS = _Pools()
os.register_at_fork(after_in_child=_POOLS.forget)
# How long past the calls' own timeout an event loop may run before it is abandoned: its
# `wait_for`s end every call by then, unless a call blocks the loop itself (time.sleep in async code).
_LOOP_GRACE_S = 1.0
_PENDING = object()  # a result not in yet


class _Abandoned(Exception):
    """An event loop that did not finish in its time: its thread is left running."""


def _threads(calls: Sequence[tuple[Callable[..., Any], tuple]], timeout_s: float, pool: DaemonPool, depth: int) -> list[Any]:
    """Plain functions on the pool, without an event loop: starting one per call costs about a
    millisecond, which a tool environment (a `call_all` inside each step) would pay per step.
    All calls are submitted at once, so one deadline bounds each by `timeout_s` from its
    submission, as the event loop's `wait_for` does; a result that is awaitable is awaited in the
    time left."""
    deadline = time.monotonic() + timeout_s
    futures = [pool.submit(fn, *args) for fn, args in calls]
    results: list[Any] = []
    for future in futures:
        try:
            result = future.result(timeout=max(0.0, deadline - time.monotonic()))
            if inspect.isawaitable(result):
                left = max(0.0, deadline - time.monotonic())
                result = _run_coroutine(asyncio.wait_for(_awaited(result), left), left + _LOOP_GRACE_S, depth)
        except (KeyboardInterrupt, SystemExit):
            raise  # a stop asked for inside a step stops the run, as on the event loop
        except (FutureTimeout, _Abandoned):
            result = EnvFailure(TimeoutError())
        except BaseException as err:  # the call's own error, returned in its place
            result = EnvFailure(err)
        results.append(result)
    return results


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _on_event_loop(calls: Sequence[tuple[Callable[..., Any], tuple]], timeout_s: float, pool: DaemonPool, depth: int) -> list[Any]:
    """The calls on an event loop; a call that blocks the loop past the calls' timeout (and the
    grace) leaves every call not finished by then a timeout, and the loop's thread running."""
    results: list[Any] = [_PENDING] * len(calls)
    try:
        _run_coroutine(_gather(calls, timeout_s, pool, results), timeout_s + _LOOP_GRACE_S, depth)
    except _Abandoned:
        pass  # what finished is in `results`
    return [EnvFailure(TimeoutError()) if r is _PENDING else r for r in list(results)]


async def _gather(calls: Sequence[tuple[Callable[..., Any], tuple]], timeout_s: float, pool: DaemonPool, results: list[Any]) -> None:
    """Each call's result (or EnvFailure) into `results` as soon as it is in."""

    async def one(index: int, fn: Callable[..., Any], args: tuple) -> None:
        try:
            results[index] = await _call(fn, args, timeout_s, pool)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:  # the call's own error or its timeout, returned in its place
            results[index] = EnvFailure(err)

    await asyncio.gather(*(one(i, fn, args) for i, (fn, args) in enumerate(calls)))


async def _call(fn: Callable[..., Any], args: tuple, timeout_s: float, pool: DaemonPool) -> Any:
    """One call, async or not, within `timeout_s` (a sync function that returns an awaitable
    has it awaited in the time left)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    if inspect.iscoroutinefunction(fn):
        return await asyncio.wait_for(fn(*args), timeout_s)
    result = await asyncio.wait_for(asyncio.wrap_future(pool.submit(fn, *args)), timeout_s)
    if inspect.isawaitable(result):
        result = await asyncio.wait_for(result, max(0.0, deadline - loop.time()))
    return result


def _run_coroutine(coroutine: Coroutine[Any, Any, R], timeout_s: float, depth: int) -> R:
    """Run `coroutine` to completion on a fresh event loop on a daemon thread (also from code
    inside a running event loop, where `asyncio.run` refuses), waiting at most `timeout_s`:
    past it, `_Abandoned`, and the thread is left running (a coroutine that blocks its loop).
    A `call_all` the coroutine makes uses the pools of the next depth, as `_at_depth`'s do."""
    box: dict[str, Any] = {}

    def target() -> None:
        _POOLS.local.depth = depth + 1
        try:
            box["value"] = asyncio.run(coroutine)
        except BaseException as err:  # handed to the caller's thread below
            box["error"] = err

    thread = threading.Thread(target=target, name=f"olingo-env{depth}-loop", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise _Abandoned()
    if "error" in box:
        raise box["error"]
    return box["value"]
