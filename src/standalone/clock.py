"""ports.Clock on asyncio, with the spawned tasks tracked so shutdown can cancel them (Cloudflare: ctx.waitUntil)."""

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any

log = logging.getLogger("flarebox.clock")


class AsyncioClock:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def spawn(self, coro: Awaitable[Any]) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed", exc_info=task.exception())

    @property
    def pending(self) -> int:
        return len(self._tasks)

    async def shutdown(self, grace: float = 0.0) -> None:
        """Give background tasks `grace` seconds, then cancel what is left and wait for it to unwind."""
        if grace > 0 and self._tasks:
            await asyncio.wait(set(self._tasks), timeout=grace)
        tasks = set(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
