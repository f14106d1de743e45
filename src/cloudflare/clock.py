"""ports.Clock in the Workers runtime: JS time, asyncio sleeps, and tasks that may outlive a request."""

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

import js
from pyodide.ffi import create_once_callable

log = logging.getLogger("flarebox.cloudflare.clock")


def _promise_of(task: asyncio.Future) -> Any:
    """A JS Promise that settles when `task` is done (never rejects: the task handles its own errors)."""

    def executor(resolve: Any, _reject: Any) -> None:
        task.add_done_callback(lambda _task: resolve())

    return js.Promise.new(create_once_callable(executor))


class JsClock:
    def __init__(self, ctx: Any = None):
        self._wait_until = getattr(ctx, "waitUntil", None) if ctx is not None else None
        self._tasks: set[asyncio.Future] = set()

    def now_ms(self) -> int:
        return int(js.Date.now())

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)  # keeps the task from being garbage-collected mid-flight
        task.add_done_callback(self._tasks.discard)
        if self._wait_until is not None:
            # Tell the runtime work is still pending after the response was returned (the trailing bookkeeping of
            # an exec runs after its stream closed).
            try:
                self._wait_until(_promise_of(task))
            except Exception:
                log.debug("ctx.waitUntil refused a task", exc_info=True)
