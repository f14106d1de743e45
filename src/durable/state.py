"""The persisted workspace record and its lifecycle state machine (DESIGN §4).

created → starting|restoring → running → saving → stopped → restoring|starting → …, plus lost. A failed start
goes back to where it came from (created, or stopped when the workspace booted before). `deleted` is never
stored: deleting wipes the record, and a wiped record reads as "no workspace".
"""

from typing import Any

from durable.ports import SnapshotInfo
from durable.store import Store
from durable.timefmt import iso_ms

STATES = ("created", "starting", "restoring", "running", "saving", "stopped", "lost", "deleted")

TRANSITIONS: dict[str, frozenset[str]] = {
    "created": frozenset({"starting"}),
    "starting": frozenset({"running", "created", "stopped"}),
    "restoring": frozenset({"running", "stopped"}),
    # from running: save, a noticed crash (restart / restore / lost), or a stop of a dead container
    "running": frozenset({"saving", "starting", "restoring", "stopped", "lost"}),
    "saving": frozenset({"running", "stopped", "lost"}),
    "stopped": frozenset({"starting", "restoring", "lost"}),
    "lost": frozenset(),
}


class IllegalTransition(RuntimeError):
    """A bug: the workspace logic tried a transition the state machine does not have."""


def snapshot_object(info: dict[str, Any] | None) -> dict[str, Any] | None:
    if info is None:
        return None
    return {"id": info["id"], "created_at": iso_ms(info["created_at_ms"]), "size": info["size"]}


class WorkspaceState:
    """Reads go to storage every time: the record is small and storage is local, and no cache can go stale
    after a wipe or a restart of the runtime."""

    def __init__(self, store: Store):
        self._store = store

    # --- the record ---------------------------------------------------------------------------------------

    @property
    def exists(self) -> bool:
        return self.config is not None

    @property
    def config(self) -> dict[str, Any] | None:
        return self._store.get("config")

    @property
    def persistent(self) -> bool:
        return bool((self.config or {}).get("persistent"))

    @property
    def state(self) -> str | None:
        return self._store.get("state")

    @property
    def booted(self) -> bool:
        return bool(self._store.get("booted", False))

    def create(self, config: dict[str, Any], now_ms: int) -> None:
        self._store.put("config", config)
        self._store.put("state", "created")
        self._store.put("booted", False)
        self._store.put("created_at_ms", now_ms)
        self._store.put("last_activity_ms", now_ms)

    def set_state(self, new: str) -> None:
        old = self.state
        if new == old:
            return
        if old is None or new not in TRANSITIONS.get(old, ()):
            raise IllegalTransition(f"{old} -> {new}")
        self._store.put("state", new)

    def mark_booted(self) -> None:
        self._store.put("booted", True)

    def touch(self, now_ms: int) -> None:
        self._store.put("last_activity_ms", now_ms)

    # --- snapshots -------------------------------------------------------------------------------------------

    def add_snapshot(self, info: SnapshotInfo) -> None:
        self._store.sql(
            "INSERT OR REPLACE INTO snapshots (id, created_at_ms, size) VALUES (?, ?, ?)",
            info.id,
            int(info.created_at_ms),
            int(info.size),
        )

    def remove_snapshot(self, snapshot_id: str) -> None:
        self._store.sql("DELETE FROM snapshots WHERE id = ?", snapshot_id)

    def snapshots(self) -> list[dict[str, Any]]:
        """Newest first."""
        return self._store.sql("SELECT id, created_at_ms, size FROM snapshots ORDER BY created_at_ms DESC, id DESC")

    def newest_snapshot(self) -> dict[str, Any] | None:
        rows = self._store.sql(
            "SELECT id, created_at_ms, size FROM snapshots ORDER BY created_at_ms DESC, id DESC LIMIT 1"
        )
        return rows[0] if rows else None

    # --- the status object (docs/protocol.md) ---------------------------------------------------------------

    def status_object(self, namespace: str, name: str, *, running: bool, busy: bool) -> dict[str, Any]:
        return {
            "namespace": namespace,
            "workspace": name,
            "state": self.state,
            "config": self.config,
            "running": running,
            "busy": busy,
            "last_snapshot": snapshot_object(self.newest_snapshot()),
            "created_at": iso_ms(self._store.get("created_at_ms")),
            "last_activity_at": iso_ms(self._store.get("last_activity_ms")),
            "booted": self.booted,
        }
