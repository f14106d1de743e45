"""The persisted workspace record and its lifecycle state machine (DESIGN §4).

created → starting|restoring → running → saving → stopped → restoring|starting → …, plus lost. A failed start
goes back to where it came from (created, or stopped when the workspace booted before). A rollback, a fork or a
restored backup rests a workspace at stopped (from created, running or lost) with its next restore point set.
`deleted` is never stored: deleting wipes the record, and a wiped record reads as "no workspace".
"""

from collections.abc import Callable
from dataclasses import replace
from enum import StrEnum
from typing import Any

from durable.ports import SnapshotInfo
from durable.store import Store
from durable.timefmt import iso_ms


class Lifecycle(StrEnum):
    """A workspace's lifecycle state. The values are stored in SQLite and appear on the wire (`state`)."""

    CREATED = "created"  # configured, never booted: the first boot starts the image fresh
    STARTING = "starting"  # a container is starting from the image (or on its surviving disk)
    RESTORING = "restoring"  # a container is starting from the newest snapshot
    RUNNING = "running"  # the container is up (or was, until a request or the alarm notices otherwise)
    SAVING = "saving"  # a snapshot of the running container is being written
    STOPPED = "stopped"  # no container; a snapshot (or a surviving disk) brings the files back
    LOST = "lost"  # booted before, nothing to come back from (no snapshot, or all expired): boots answer workspace_lost
    DELETED = "deleted"  # never stored: a deleted workspace's record is wiped and reads as "no workspace"


class BootMode(StrEnum):
    """What a boot gave the request that waited for it (the `started` event's `container`)."""

    CONTINUING = "continuing"  # the container was already running: processes and files as they were
    FRESH = "fresh"  # a new container from the image: nothing survived (the first boot)
    RESTORED = "restored"  # files as of the newest snapshot, no processes
    RESTARTED = "restarted"  # the sandbox died but its disk survived: all files, no processes (standalone only)


STATES = tuple(Lifecycle)

TRANSITIONS: dict[Lifecycle, frozenset[Lifecycle]] = {
    # created → stopped: a fork, or a restore into a workspace that never ran, gives it files to come back to
    Lifecycle.CREATED: frozenset({Lifecycle.STARTING, Lifecycle.STOPPED}),
    Lifecycle.STARTING: frozenset({Lifecycle.RUNNING, Lifecycle.CREATED, Lifecycle.STOPPED}),
    Lifecycle.RESTORING: frozenset({Lifecycle.RUNNING, Lifecycle.STOPPED}),
    # from running: save, a noticed crash (restart / restore / lost), or a stop of a dead container
    Lifecycle.RUNNING: frozenset(
        {Lifecycle.SAVING, Lifecycle.STARTING, Lifecycle.RESTORING, Lifecycle.STOPPED, Lifecycle.LOST}
    ),
    Lifecycle.SAVING: frozenset({Lifecycle.RUNNING, Lifecycle.STOPPED, Lifecycle.LOST}),
    Lifecycle.STOPPED: frozenset({Lifecycle.STARTING, Lifecycle.RESTORING, Lifecycle.LOST}),
    Lifecycle.LOST: frozenset({Lifecycle.STOPPED}),  # a backup restored into it
}


class IllegalTransition(RuntimeError):
    """A bug: the workspace logic tried a transition the state machine does not have."""


def _snapshot(row: dict[str, Any]) -> SnapshotInfo:
    expires = row["expires_at_ms"]
    return SnapshotInfo(
        row["id"],
        row["size"],
        row["created_at_ms"],
        None if expires is None else int(expires),
        label=row["label"],
        kept=bool(row["kept"]),
    )


_COLUMNS = "id, created_at_ms, size, expires_at_ms, label, kept"
_NEWEST_FIRST = "ORDER BY created_at_ms DESC, id DESC"
_LIVE = "expires_at_ms IS NULL OR expires_at_ms > ?"  # SnapshotInfo.expired, in SQL


class WorkspaceState:
    """Reads go to storage every time: the record is small and storage is local, and no cache can go stale
    after a wipe or a restart of the runtime."""

    def __init__(self, store: Store):
        self._store = store

    # --- the record ---------------------------------------------------------------------------------------

    @property
    def exists(self) -> bool:
        return self._store.has("config")

    @property
    def config(self) -> dict[str, Any] | None:
        return self._store.get("config")

    @property
    def persistent(self) -> bool:
        return bool((self.config or {}).get("persistent"))

    @property
    def state(self) -> Lifecycle | None:
        value = self._store.get("state")
        return None if value is None else Lifecycle(value)

    @property
    def booted(self) -> bool:
        return bool(self._store.get("booted", False))

    def create(self, config: dict[str, Any], now_ms: int) -> None:
        self._store.put("config", config)
        self._store.put("state", Lifecycle.CREATED)
        self._store.put("booted", False)
        self._store.put("created_at_ms", now_ms)
        self._store.put("last_activity_ms", now_ms)

    def set_state(self, new: Lifecycle) -> None:
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
        """Record a snapshot, or its new expiry (a restore extends it on Cloudflare), label and pin."""
        self._store.sql(
            "INSERT OR REPLACE INTO snapshots (id, created_at_ms, size, expires_at_ms, label, kept)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            info.id,
            int(info.created_at_ms),
            int(info.size),
            None if info.expires_at_ms is None else int(info.expires_at_ms),
            info.label,
            1 if info.kept else 0,
        )

    def live_snapshot(self, snapshot_id: str, now_ms: int) -> SnapshotInfo | None:
        """One snapshot by id, None when unknown or expired (neither listed nor restorable)."""
        rows = self._store.sql(f"SELECT {_COLUMNS} FROM snapshots WHERE id = ? AND ({_LIVE})", snapshot_id, int(now_ms))
        return _snapshot(rows[0]) if rows else None

    def kept_count(self, now_ms: int) -> int:
        """Pinned snapshots still alive: the ones MAX_KEPT_SNAPSHOTS bounds."""
        rows = self._store.sql(f"SELECT COUNT(*) AS n FROM snapshots WHERE kept = 1 AND ({_LIVE})", int(now_ms))
        return int(rows[0]["n"])

    # --- the next boot's restore point (a rollback, a backup restore, a fork) ------------------------------------

    @property
    def restore_to(self) -> dict[str, str] | None:
        """{"snapshot": id} or {"backup": id}: what the next boot restores instead of the newest snapshot."""
        return self._store.get("restore_to")

    def set_restore_to(self, point: dict[str, str] | None) -> None:
        if point is None:
            self._store.delete("restore_to")
        else:
            self._store.put("restore_to", point)

    def rest(self, now_ms: int) -> None:
        """After a rollback: no container, files as of the chosen restore point at the next boot. A workspace
        that never booted (a fork's, a backup's) counts as booted from here on: its first boot restores."""
        self.set_state(Lifecycle.STOPPED)
        self._store.put("booted", True)
        self.touch(now_ms)

    def remove_snapshot(self, snapshot_id: str) -> None:
        self._store.sql("DELETE FROM snapshots WHERE id = ?", snapshot_id)

    def snapshots(self) -> list[SnapshotInfo]:
        """Every recorded snapshot, expired ones too (for retention and delete, which drop them), newest first."""
        rows = self._store.sql(f"SELECT {_COLUMNS} FROM snapshots {_NEWEST_FIRST}")
        return [_snapshot(row) for row in rows]

    def live_snapshots(self, now_ms: int) -> list[SnapshotInfo]:
        """The snapshots not expired at `now_ms`, newest first: the only ones listed or restored."""
        rows = self._store.sql(f"SELECT {_COLUMNS} FROM snapshots WHERE {_LIVE} {_NEWEST_FIRST}", int(now_ms))
        return [_snapshot(row) for row in rows]

    def newest_snapshot(self, now_ms: int) -> SnapshotInfo | None:
        """The newest snapshot not expired at `now_ms`."""
        query = f"SELECT {_COLUMNS} FROM snapshots WHERE {_LIVE} {_NEWEST_FIRST} LIMIT 1"
        rows = self._store.sql(query, int(now_ms))
        return _snapshot(rows[0]) if rows else None

    def fill_expiries(self, expiry_of: Callable[[int], int | None]) -> None:
        """Give the snapshots recorded before expiries were (their `expires_at_ms` is NULL) the one the platform
        gives a snapshot made at their `created_at_ms`: a restore since may have extended it, but the newest
        snapshot is almost always younger than the last restore (every restored workspace saves again)."""
        for snap in self.snapshots():
            if snap.expires_at_ms is None:
                expires = expiry_of(snap.created_at_ms)
                if expires is not None:
                    self.add_snapshot(replace(snap, expires_at_ms=expires))

    # --- the status object (docs/protocol.md) ---------------------------------------------------------------

    def status_object(self, namespace: str, name: str, *, running: bool, busy: bool, now_ms: int) -> dict[str, Any]:
        newest = self.newest_snapshot(now_ms)
        return {
            "namespace": namespace,
            "workspace": name,
            "state": self.state,
            "config": self.config,
            "running": running,
            "busy": busy,
            "last_snapshot": newest.to_wire() if newest is not None else None,
            "created_at": iso_ms(self._store.get("created_at_ms")),
            "last_activity_at": iso_ms(self._store.get("last_activity_ms")),
            "booted": self.booted,
        }
