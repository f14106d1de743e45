"""ports.Clock in the Workers runtime: JS time, asyncio sleeps, and tasks that may outlive a request."""

import asyncio
from collections.abc import Awaitable
from typing import Any

import js


class JsClock:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Future] = set()

    def now_ms(self) -> int:
        return int(js.Date.now())

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def spawn(self, coro: Awaitable[Any]) -> None:
        # A Durable Object stays in memory while it has pending work, so a task needs no ctx.waitUntil; the set
        # only keeps the task from being garbage-collected mid-flight.
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
