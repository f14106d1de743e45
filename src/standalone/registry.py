"""The in-process Workspaces: one Workspace object per (namespace, workspace), built lazily with its adapters.

Data layout (everything under the data dir):
    workspaces/<ns>/<ws>/state.sqlite3   config, state, ledger and the persisted alarm (one file per workspace)
    workspaces/<ns>/<ws>/root/            the sandbox's live files: workspace/, home/, tmp/ (sandbox_driver.py)
    workspaces/<ns>/<ws>/uid              the workspace's own host uid (root server; uids.py), never reused
    snapshots/<ns>/<ws>/                  the snapshot store's archives and manifests
    uid-range, uid-next                   the server's block of host uids and the next one to hand out (root server)
    secrets.key                           the key secrets are sealed with (mode 0600; unless SECRETS_KEY is set)
    run/<key>/sv.sock                     the supervisors' sockets, reachable by the server only (0700; a fresh
                                          private dir under the system temp dir when this path is too long)
Backups live outside the data dir, in BACKUP_DIR when it is set (backups.py; config.backup_dir).
Objects are forgotten (and their directory removed) once deleted. At shutdown the running sandboxes are stopped
but their files stay, so the next exec reports `container: restarted`.
"""

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from durable.ports import BackupStore, Cipher, Container, Response
from durable.settings import Settings
from standalone.alarms import PersistentAlarm, persisted_alarm_at
from standalone.backups import DirectoryBackupStore
from standalone.cipher import AesGcmCipher, load_or_create_key
from standalone.clock import AsyncioClock
from standalone.config import backup_dir
from standalone.reserve import DiskReserve
from standalone.storage import SqliteStorage
from standalone.streams import QueueStreams

log = logging.getLogger("flarebox.registry")

STATE_FILE = "state.sqlite3"
RESERVE_FILE = "disk-reserve"

# (namespace, workspace, workspace_dir) → the workspace's container (a bubblewrap sandbox)
ContainerFactory = Callable[[str, str, Path], Container]


@dataclass
class _Entry:
    namespace: str
    name: str
    directory: Path
    storage: SqliteStorage
    alarm: PersistentAlarm
    container: Any
    workspace: Any = None
    inflight: int = 0  # calls and alarms running on the object: it is only forgotten when idle


class _EntryClock:
    """The server's clock as one workspace sees it: work the workspace spawns (an exec's relay, which outlives the
    request that started it) counts as in flight, so the object — its SQLite file, its directory — is never
    forgotten under a task still using it (a DELETE racing an exec then ends that exec with workspace_not_found)."""

    def __init__(self, clock: AsyncioClock, registry: "WorkspaceRegistry", holder: dict):
        self._clock = clock
        self._registry = registry
        self._holder = holder

    def now_ms(self) -> int:
        return self._clock.now_ms()

    async def sleep(self, seconds: float) -> None:
        await self._clock.sleep(seconds)

    def spawn(self, coro: Any) -> asyncio.Task:
        entry = self._holder["entry"]
        entry.inflight += 1

        async def tracked() -> Any:
            try:
                return await coro
            finally:
                entry.inflight -= 1
                self._registry.forget_if_gone(entry)

        return self._clock.spawn(tracked())


class _Stub:
    """ports.WorkspaceStub: an in-process call (a Durable Object stub's fetch on Cloudflare)."""

    def __init__(self, registry: "WorkspaceRegistry", namespace: str, name: str):
        self._registry = registry
        self._key = (namespace, name)

    async def call(self, op: str, args: dict[str, Any], body: Any = None) -> Response:
        entry = self._registry.entry(*self._key)
        entry.inflight += 1
        try:
            return await entry.workspace.call(op, args, body)
        finally:
            entry.inflight -= 1
            self._registry.forget_if_gone(entry)


class WorkspaceRegistry:
    def __init__(
        self,
        data_dir: Path,
        settings: Settings,
        clock: AsyncioClock,
        container_factory: ContainerFactory,
        stop_container: Callable[[Any], Any] | None = None,
        cipher: Cipher | None = None,
        backups: BackupStore | None = None,
        owns: Callable[[str, str], bool] | None = None,
    ):
        self.data_dir = Path(data_dir)
        # with several worker processes (standalone/workers.py), the workspaces this one owns; None: every one
        self._owns = owns
        self.settings = settings
        self.clock = clock
        self._container_factory = container_factory
        self._stop_container = stop_container
        self._streams = QueueStreams()
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._closing = False
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.reserve = DiskReserve(self.data_dir / RESERVE_FILE)
        # secrets at rest: SECRETS_KEY, else a key generated once into the data dir (cipher.py)
        self._cipher = cipher or AesGcmCipher(load_or_create_key(self.data_dir))
        # one store for every workspace: BACKUP_DIR, else one that is not available (backups_unavailable)
        self.backups = backups if backups is not None else DirectoryBackupStore(backup_dir())

    # --- ports.Workspaces ----------------------------------------------------------------------------

    def get(self, namespace: str, workspace: str) -> _Stub:
        return _Stub(self, namespace, workspace)

    # --- objects ---------------------------------------------------------------------------------------------

    def workspace_dir(self, namespace: str, name: str) -> Path:
        # names are validated by the edge (^[a-z0-9][a-z0-9_.-]{0,62}$): no `/`, no leading `.`, safe as path parts
        return self.data_dir / "workspaces" / namespace / name

    def entry(self, namespace: str, name: str) -> _Entry:
        if self._closing:
            from protocol.errors import ProtocolError

            raise ProtocolError("container_unavailable", "the server is shutting down")
        key = (namespace, name)
        entry = self._entries.get(key)
        if entry is None:
            if self._owns is not None and not self._owns(namespace, name):
                # a workspace lives in one process only: its owner (placement.py); shards.py routes calls there
                raise RuntimeError(f"{namespace}/{name} belongs to another worker process")
            entry = self._build(namespace, name)
            self._entries[key] = entry
        return entry

    def _build(self, namespace: str, name: str) -> _Entry:
        from durable.workspace import Workspace

        directory = self.workspace_dir(namespace, name)
        directory.mkdir(parents=True, exist_ok=True)
        storage = SqliteStorage(directory / STATE_FILE, self.reserve)
        holder: dict[str, _Entry] = {}

        async def fire() -> None:
            entry = holder["entry"]
            entry.inflight += 1
            try:
                await entry.workspace.alarm()
            finally:
                entry.inflight -= 1
                self.forget_if_gone(entry)

        alarm = PersistentAlarm(storage, self.clock, fire, f"{namespace}/{name}")
        container = self._container_factory(namespace, name, directory)
        entry = _Entry(namespace, name, directory, storage, alarm, container)
        holder["entry"] = entry
        entry.workspace = Workspace(
            namespace=namespace,
            name=name,
            settings=self.settings,
            storage=storage,
            alarm=alarm,
            clock=_EntryClock(self.clock, self, holder),
            container=container,
            streams=self._streams,
            cipher=self._cipher,
            backups=self.backups,
        )
        return entry

    # --- forgetting deleted workspaces -----------------------------------------------------------------------

    def forget_if_gone(self, entry: _Entry) -> None:
        """Drop an object with no workspace behind it (deleted, expired ephemeral, or never created) once nothing
        runs on it: its SQLite file and directory go, so unknown names and deleted workspaces leave nothing."""
        if entry.inflight == 0 and not self._closing and not self._exists(entry):
            self._forget(entry)

    @staticmethod
    def _exists(entry: _Entry) -> bool:
        state = getattr(entry.workspace, "state", None)
        return bool(getattr(state, "exists", True))

    def _forget(self, entry: _Entry) -> None:
        key = (entry.namespace, entry.name)
        if self._entries.get(key) is not entry:
            return
        del self._entries[key]
        entry.alarm.close()
        entry.storage.close()
        shutil.rmtree(entry.directory, ignore_errors=True)
        with contextlib.suppress(OSError):
            entry.directory.parent.rmdir()  # the namespace directory, once it holds no workspace
        log.debug("forgot workspace object %s/%s", entry.namespace, entry.name)

    # --- server start and stop -------------------------------------------------------------------------------

    def known_workspaces(self) -> list[tuple[str, str]]:
        return known_workspaces(self.data_dir)

    def rearm_alarms(self) -> int:
        """Re-arm the persisted alarm of every workspace on disk (server start); only workspaces with an alarm are
        loaded; with several workers, only the workspaces this one owns. Returns how many were armed."""
        armed = 0
        for namespace, name in self.known_workspaces():
            if self._owns is not None and not self._owns(namespace, name):
                continue  # armed by its owner
            try:
                if persisted_alarm_at(self.workspace_dir(namespace, name) / STATE_FILE) is None:
                    continue
                if self.entry(namespace, name).alarm.rearm():
                    armed += 1
            except Exception:
                log.exception("could not re-arm the alarm of %s/%s", namespace, name)
        return armed

    @property
    def loaded(self) -> int:
        return len(self._entries)

    async def shutdown(self) -> None:
        """Stop alarms and background work, stop running sandboxes (their files stay), close SQLite."""
        self._closing = True
        for entry in self._entries.values():
            entry.alarm.close()
        await self.clock.shutdown(grace=0.5)
        for entry in list(self._entries.values()):
            if self._stop_container is not None:
                try:
                    async with asyncio.timeout(10):
                        await _maybe_await(self._stop_container(entry.container))
                except Exception:
                    log.exception("could not stop the sandbox of %s/%s", entry.namespace, entry.name)
            entry.storage.close()
        self._entries.clear()


def known_workspaces(data_dir: Path) -> list[tuple[str, str]]:
    """Every (namespace, workspace) with a state file under the data dir."""
    root = Path(data_dir) / "workspaces"
    return sorted((p.parent.parent.name, p.parent.name) for p in root.glob(f"*/*/{STATE_FILE}"))


async def _maybe_await(value: Any) -> Any:
    if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
        return await value
    return value
