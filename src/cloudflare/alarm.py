"""ports.Alarm over the Durable Object alarm: one per object, setting it replaces the previous one.

When it fires the runtime calls `Workspace.alarm()` in entry.py, which hands it to the workspace logic.
"""

from typing import Any


class DurableAlarm:
    def __init__(self, ctx_storage: Any):
        self._storage = ctx_storage

    async def set(self, at_ms: int) -> None:
        await self._storage.setAlarm(int(at_ms))

    async def clear(self) -> None:
        await self._storage.deleteAlarm()
