"""A workspace's long-term backups: exports written to the deployment's backup store (durable/ports.BackupStore),
pruned by their own slots (durable/backup_retention.py), and the restore point a boot falls back to when every
container snapshot has expired.

The store is the truth about which backups exist; this object only records when the last one was written, so a
schedule (BACKUP_INTERVAL_SECONDS) knows when the next is due. No runtime imports.
"""

import logging
import secrets

from durable import backup_retention, supervisor_client
from durable.ports import BackupInfo, BackupStore, Container
from durable.store import Store
from protocol.errors import ProtocolError

log = logging.getLogger("flarebox.backups")

_LAST = "last_backup_ms"


def new_backup_id(now_ms: int) -> str:
    """Time-sortable like snapshot ids: `b-<13-digit ms>-<6 hex>`."""
    return f"b-{now_ms:013d}-{secrets.token_hex(3)}"


class BackupBook:
    def __init__(self, store: BackupStore, meta: Store, namespace: str, workspace: str, interval_seconds: int):
        self._store = store
        self._meta = meta
        self._namespace = namespace
        self._workspace = workspace
        self._interval_ms = interval_seconds * 1000

    @property
    def available(self) -> bool:
        return self._store.available

    def require(self) -> None:
        if not self._store.available:
            raise ProtocolError("backups_unavailable")

    def due(self, now_ms: int) -> bool:
        """A scheduled backup is owed: the interval is set, a store exists, and the last one is that old."""
        if self._interval_ms <= 0 or not self._store.available:
            return False
        last = self._meta.get(_LAST)
        return last is None or now_ms - int(last) >= self._interval_ms

    async def write(self, container: Container, now_ms: int) -> BackupInfo:
        """Export the running container into the store, then prune. Raises backup_failed (the workspace keeps
        running) or the export's own error."""
        self.require()
        resp = await supervisor_client.export_archive(container)
        info = await self._store.write(self._namespace, self._workspace, new_backup_id(now_ms), resp.body, now_ms)
        self._meta.put(_LAST, now_ms)
        await self._prune(now_ms)
        return info

    async def _prune(self, now_ms: int) -> None:
        for old in backup_retention.drop_backups(await self.list(), now_ms):
            try:
                await self._store.delete(self._namespace, self._workspace, old.id)
            except Exception:
                log.warning("dropping backup %s failed; kept for now", old.id, exc_info=True)

    async def list(self) -> list[BackupInfo]:
        if not self._store.available:
            return []
        return await self._store.list(self._namespace, self._workspace)

    async def find(self, backup_id: str) -> BackupInfo:
        for info in await self.list():
            if info.id == backup_id:
                return info
        raise ProtocolError("backup_not_found")

    async def newest(self) -> BackupInfo | None:
        """The newest good backup; None when there is none or the store cannot say (a boot then answers
        workspace_lost only if no snapshot is left either — never on a store outage: see Workspace._restore_point)."""
        listed = await self.list()
        return listed[0] if listed else None

    async def load_into(self, container: Container, backup_id: str) -> BackupInfo:
        """Import a backup into the (running, just started) container. Raises backup_not_found, and for a backup
        damaged in the store (nothing was changed) invalid_archive, backup_failed or ContainerGone — whichever end
        noticed first: the supervisor checking the archive, or the store checking what it read."""
        info, body = await self._store.open(self._namespace, self._workspace, backup_id)
        # its length is known: Cloudflare frames it as such (a stream of unknown length would be sent chunked)
        await supervisor_client.import_archive(container, body, info.size)
        return info

    async def delete_all(self) -> None:
        """A deleted workspace leaves no backups behind (best effort, like its snapshots)."""
        try:
            listed = await self.list()
        except Exception:
            log.warning("listing the backups of %s/%s to delete them failed", self._namespace, self._workspace)
            return
        for info in listed:
            try:
                await self._store.delete(self._namespace, self._workspace, info.id)
            except Exception:
                log.warning("deleting backup %s failed", info.id, exc_info=True)
        self._meta.delete(_LAST)
