"""One boot shared by every request that needs the container while it starts.

The first caller starts the boot; later callers join it. All of them get the same outcome (or the same error),
and each listener receives the boot's status events — a late joiner first gets the phase the boot is in.
"""

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from durable.ports import BackupInfo, SnapshotInfo
from durable.state import BootMode

Listener = Callable[[dict], Awaitable[None]]


@dataclass(frozen=True)
class BootOutcome:
    container: BootMode
    snapshot: SnapshotInfo | None = None  # the snapshot a `restored` container came from
    backup: BackupInfo | None = None  # ...or the backup, when every snapshot had expired


class SharedBoot:
    def __init__(self) -> None:
        self._future: asyncio.Future | None = None
        self._phase: dict | None = None  # the current status event, replayed to listeners that join late
        self._listeners: list[Listener] = []

    @property
    def in_progress(self) -> bool:
        return self._future is not None and not self._future.done()

    def start(self, boot: Callable[[], Awaitable[BootOutcome]]) -> None:
        """Begin a boot (none may be in progress). `boot` reports its phases through `emit`."""
        assert not self.in_progress, "one boot at a time"
        self._future = asyncio.ensure_future(self._run(boot))
        self._future.add_done_callback(lambda f: f.cancelled() or f.exception())  # always retrieved

    async def _run(self, boot: Callable[[], Awaitable[BootOutcome]]) -> BootOutcome:
        try:
            return await boot()
        finally:
            self._phase = None

    async def join(self, listener: Listener | None = None) -> BootOutcome:
        """Wait for the current (or just finished) boot. A cancelled joiner leaves the boot running for the others."""
        future = self._future
        assert future is not None, "join before start"
        if listener is not None:
            self._listeners.append(listener)
            if self._phase is not None:
                await listener(self._phase)
        try:
            return await asyncio.shield(future)
        finally:
            if listener is not None and listener in self._listeners:
                self._listeners.remove(listener)

    async def emit(self, event: dict[str, Any]) -> None:
        """Called by the boot: record its phase and tell every listener."""
        self._phase = event
        for listener in list(self._listeners):
            await listener(event)
