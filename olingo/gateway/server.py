"""The gateway's HTTP server: an aiohttp application on an event loop of its own thread, and the
hand-off of its requests to the thread that runs the rollout engine.

Requests wait in a `Dispatcher` until a batch is served: with `lockstep` batching when every
running episode has a request waiting (the same batches, in the same order, on every run: exact
resume), with `window` batching also when the oldest has waited `batch_window_s`. The engine runs
only in the caller's thread (the trainer's), never on the event loop, which keeps answering
(and refusing) requests meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Coroutine, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from olingo.gateway.protocol import RequestError


@dataclass
class Job:
    """One request waiting for the engine."""

    episode: int
    prompt_ids: list[int]
    max_new_tokens: int
    stop: tuple[str, ...]
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    order: int = 0

    def settle(self, value: Any) -> None:
        """Hand the result (or an exception) to the waiting request, from any thread."""
        self.loop.call_soon_threadsafe(_settle, self.future, value)


def _settle(future: asyncio.Future, value: Any) -> None:
    if future.done():  # its request gave up (the episode timed out)
        return
    if isinstance(value, BaseException):
        future.set_exception(value)
    else:
        future.set_result(value)


@dataclass
class Dispatcher:
    """Requests waiting for the engine, between the server's loop and the engine's thread."""

    lockstep: bool = True
    window_s: float = 0.05
    jobs: list[Job] = field(default_factory=list)
    running: set[int] = field(default_factory=set)
    cond: threading.Condition = field(default_factory=threading.Condition)
    counter: int = 0

    def start(self, episodes: Iterable[int]) -> None:
        with self.cond:
            self.running = set(episodes)

    def submit(self, job: Job) -> None:
        with self.cond:
            self.counter += 1
            job.order = self.counter
            self.jobs.append(job)
            self.cond.notify_all()

    def finished(self, episode: int) -> None:
        with self.cond:
            self.running.discard(episode)
            self.cond.notify_all()

    def next_batch(self) -> list[Job] | None:
        """The next requests to serve, ordered by episode then arrival; None once every episode
        has ended and nothing waits."""
        with self.cond:
            since = None
            while True:
                self.jobs = [j for j in self.jobs if not j.future.done()]
                if not self.jobs and not self.running:
                    return None
                if self.jobs:
                    waiting = {j.episode for j in self.jobs}
                    since = since if since is not None else time.monotonic()
                    if waiting >= self.running or (not self.lockstep and time.monotonic() - since >= self.window_s):
                        batch, self.jobs = sorted(self.jobs, key=lambda j: (j.episode, j.order)), []
                        return batch
                self.cond.wait(timeout=self.window_s if self.jobs and not self.lockstep else 0.5)


class LoopThread:
    """An asyncio event loop running in a daemon thread, for the server and the agents."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="olingo-gateway", daemon=True)
        self.thread.start()

    def submit(self, coroutine: Coroutine) -> Future:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def close(self) -> None:
        """Cancel what still runs on the loop, stop it and join its thread."""
        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self.loop.is_running():
            self.submit(cancel_all()).result(timeout=30)
            self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()


def error_response(err: RequestError) -> Any:
    from aiohttp import web

    return web.json_response(err.body(), status=err.status)


async def read_json(request: Any, limit: int) -> Any:
    """The request's JSON body; a `RequestError` for a body that is not JSON (413 past the size
    limit, raised by aiohttp as `HTTPRequestEntityTooLarge`)."""
    from aiohttp import web

    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise RequestError(413, f"the request body is larger than agent.max_body_bytes ({limit} bytes)") from None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as err:
        raise RequestError(400, f"the request body is not valid JSON: {str(err)[:200]}") from None


class HttpServer:
    """The aiohttp application bound to host:port (0: a free port) on `loop_thread`'s loop."""

    def __init__(self, routes: list[tuple[str, str, Any]], host: str, port: int, max_body_bytes: int) -> None:
        self.routes, self.host, self.port, self.max_body_bytes = routes, host, port, max_body_bytes
        self.runner: Any = None

    async def start(self) -> None:
        from aiohttp import web

        app = web.Application(client_max_size=self.max_body_bytes)
        for method, path, handler in self.routes:
            app.router.add_route(method, path, handler)
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.port = self.runner.addresses[0][1]  # the port bound (port 0: one the OS chose)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"
