"""One runtime alarm multiplexes the workspace's deadlines: idle (save and stop), checkpoint (periodic
snapshot), retry (a failed save) and backup (BACKUP_INTERVAL_SECONDS, while the workspace runs). Deadlines
persist in storage, so a restarted runtime re-arms them."""

from durable.ports import Alarm
from durable.store import Store

IDLE = "idle"
CHECKPOINT = "checkpoint"
RETRY = "retry"
BACKUP = "backup"

RETRY_FIRST_SECONDS = 30
RETRY_MAX_SECONDS = 15 * 60


class Schedule:
    def __init__(self, store: Store):
        self._store = store

    def deadlines(self) -> dict[str, int]:
        return dict(self._store.get("deadlines", {}))

    def get(self, name: str) -> int | None:
        return self.deadlines().get(name)

    def set_at(self, name: str, at_ms: int) -> None:
        deadlines = self.deadlines()
        deadlines[name] = int(at_ms)
        self._store.put("deadlines", deadlines)

    def clear(self, *names: str) -> None:
        deadlines = self.deadlines()
        for name in names:
            deadlines.pop(name, None)
        self._store.put("deadlines", deadlines)

    def clear_all(self) -> None:
        self._store.put("deadlines", {})

    def due(self, now_ms: int) -> set[str]:
        return {name for name, at in self.deadlines().items() if at <= now_ms}

    def next_at(self) -> int | None:
        deadlines = self.deadlines()
        return min(deadlines.values()) if deadlines else None

    def push_idle(self, at_ms: int) -> None:
        """Activity: the idle deadline moves to `at_ms`, and a pending save retry is superseded by it."""
        self.set_at(IDLE, at_ms)
        self.clear(RETRY)

    def retry_save(self, now_ms: int) -> None:
        """After a failed save: the next attempt with backoff; a due periodic checkpoint waits for that one."""
        self.clear(IDLE, RETRY)
        at = now_ms + self.next_retry_delay() * 1000
        self.set_at(RETRY, at)
        if self.get(CHECKPOINT) is not None:
            self.set_at(CHECKPOINT, at)

    def postpone_until(self, at_ms: int) -> None:
        """Move every deadline before `at_ms` to it."""
        for name, at in self.deadlines().items():
            if at <= at_ms:
                self.set_at(name, at_ms)

    def next_retry_delay(self) -> int:
        """Seconds until the next save attempt: 30 s, doubling to at most 15 min; reset by a successful save."""
        delay = int(self._store.get("retry_delay", RETRY_FIRST_SECONDS))
        self._store.put("retry_delay", min(delay * 2, RETRY_MAX_SECONDS))
        return delay

    def reset_retry(self) -> None:
        self._store.delete("retry_delay")

    async def arm(self, alarm: Alarm) -> None:
        """Point the runtime's one alarm at the earliest deadline, or clear it."""
        at = self.next_at()
        if at is None:
            await alarm.clear()
        else:
            await alarm.set(at)
