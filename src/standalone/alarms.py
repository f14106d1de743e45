"""ports.Alarm: one alarm per workspace, persisted in the workspace's SQLite file and run by an asyncio timer.

Cloudflare semantics: setting replaces the previous alarm; the alarm is cleared just before `alarm()` runs (so the
handler may set the next one); a handler that raises is retried with backoff. A persisted alarm survives a restart:
`rearm()` schedules it again (an overdue one fires at once).
"""

import asyncio
import logging
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path

from standalone.clock import AsyncioClock
from standalone.storage import SqliteStorage

log = logging.getLogger("flarebox.alarms")

_TABLE = "_standalone_alarm"
RETRY_DELAYS_S = (2, 4, 8, 16, 32, 64)  # like Cloudflare's alarm retries


class PersistentAlarm:
    def __init__(self, storage: SqliteStorage, clock: AsyncioClock, fire: Callable[[], Awaitable[None]], label: str):
        self._storage = storage
        self._clock = clock
        self._fire = fire
        self._label = label
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        storage.sql(f"CREATE TABLE IF NOT EXISTS {_TABLE} (id INTEGER PRIMARY KEY CHECK (id = 1), at_ms INTEGER)")

    def scheduled_at(self) -> int | None:
        rows = self._storage.sql(f"SELECT at_ms FROM {_TABLE} WHERE id = 1")
        return rows[0]["at_ms"] if rows else None

    async def set(self, at_ms: int) -> None:
        self._storage.sql(f"INSERT OR REPLACE INTO {_TABLE} (id, at_ms) VALUES (1, ?)", int(at_ms))
        self._schedule(int(at_ms), attempt=0)

    async def clear(self) -> None:
        self._storage.sql(f"DELETE FROM {_TABLE} WHERE id = 1")
        self._cancel_timer()

    def rearm(self) -> bool:
        """Schedule the persisted alarm, if any (server start). True when one was armed."""
        at_ms = self.scheduled_at()
        if at_ms is None:
            return False
        self._schedule(at_ms, attempt=0)
        return True

    def close(self) -> None:
        """Stop the timer without touching the persisted alarm (shutdown; `rearm` picks it up next start)."""
        self._closed = True
        self._cancel_timer()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule(self, at_ms: int, attempt: int) -> None:
        if self._closed:
            return
        self._cancel_timer()
        delay = max(0.0, (at_ms - self._clock.now_ms()) / 1000)
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(delay, lambda: self._clock.spawn(self._run(at_ms, attempt)))

    async def _run(self, at_ms: int, attempt: int) -> None:
        self._timer = None
        if self._closed or self.scheduled_at() != at_ms:
            return  # replaced or cleared meanwhile
        self._storage.sql(f"DELETE FROM {_TABLE} WHERE id = 1 AND at_ms = ?", at_ms)
        try:
            await self._fire()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("alarm handler of %s failed (attempt %d)", self._label, attempt + 1)
            if attempt < len(RETRY_DELAYS_S) and not self._closed and self.scheduled_at() is None:
                retry_at = self._clock.now_ms() + RETRY_DELAYS_S[attempt] * 1000
                self._storage.sql(f"INSERT OR REPLACE INTO {_TABLE} (id, at_ms) VALUES (1, ?)", retry_at)
                self._schedule(retry_at, attempt + 1)


def persisted_alarm_at(db_path: Path) -> int | None:
    """The alarm stored in a workspace's SQLite file, read without loading the workspace (server start)."""
    try:
        db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    except sqlite3.Error:
        return None
    try:
        rows = db.execute(f"SELECT at_ms FROM {_TABLE} WHERE id = 1").fetchall()  # noqa: S608 - fixed name
    except sqlite3.Error:
        return None  # no alarm table yet: never armed
    finally:
        db.close()
    return rows[0][0] if rows else None
