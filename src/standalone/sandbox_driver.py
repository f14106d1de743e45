"""Builds each workspace's container: a bubblewrap SandboxContainer, with the server's one snapshot store and cgroup
manager, and its files at <data>/workspaces/<ns>/<ws>/root (the registry keeps state.sqlite3 beside it). A root
server runs each workspace as its own host uid from the server's range (uids.py)."""

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

from durable.ports import StartSpec
from durable.settings import Settings
from protocol.errors import ProtocolError
from standalone import seccomp
from standalone.cgroups import Cgroups
from standalone.sandbox import SandboxContainer
from standalone.snapshots import SnapshotStore
from standalone.uids import CLAIM_DIR, UidRange, UidRangeError, private_dir

ROOT_DIR = "root"
RUN_DIR = "run"
# the sandbox's unix socket lives at <runtime>/<12 hex>/sv.sock and must stay under 100 bytes
MAX_RUNTIME_DIR = 70


def runtime_dir(data_dir: Path) -> Path:
    """<data>/run (private to the server), or, when the data dir's path is too long for socket paths, a fresh private
    directory under the system temp dir: unpredictable, so nobody can plant it beforehand (the caller removes it)."""
    preferred = Path(data_dir) / RUN_DIR
    if len(str(preferred)) <= MAX_RUNTIME_DIR:
        return private_dir(preferred, 0o700)
    return Path(tempfile.mkdtemp(prefix="flarebox-run-"))


class OwnUidSandbox(SandboxContainer):
    """A root server's sandbox, run as its workspace's own host uid. The uid is taken at the first start, not when
    the container is built: the registry builds one for every name looked up, and uids are never reused."""

    def __init__(self, *args, host_uid: Callable[[], int], **kwargs):
        super().__init__(*args, **kwargs)
        self._host_uid = host_uid
        self._has_uid = False

    async def start(self, spec: StartSpec) -> None:
        if not self._has_uid:
            try:
                uid = self._host_uid()
            except (OSError, UidRangeError) as err:
                raise ProtocolError("container_unavailable", f"the sandbox could not start: {err}") from None
            self.ids = replace(self.ids, host_uid=uid, host_gid=uid)
            self._has_uid = True
        await super().start(spec)


class ServerClaim:
    """What a server takes once per data dir: a root server's uid range (its host-wide flock) and the private
    runtime dir. With several worker processes the parent takes it and every worker shares it (workers.py)."""

    def __init__(self, data_dir: Path, uid_claims: Path = CLAIM_DIR):
        data_dir = Path(data_dir)
        # first: a range claimed by another server stops the start before anything is made
        self.uids = UidRange(data_dir, uid_claims) if os.geteuid() == 0 else None
        self.data_dir = data_dir
        try:
            self.runtime_dir = runtime_dir(data_dir)
        except BaseException:
            if self.uids is not None:
                self.uids.close()
            raise

    def close(self) -> None:
        """Remove a per-process runtime dir (<data>/run stays) and let go of the uid range."""
        if self.runtime_dir != self.data_dir / RUN_DIR:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
        if self.uids is not None:
            self.uids.close()


class SandboxDriver:
    def __init__(
        self, data_dir: Path, settings: Settings, uid_claims: Path = CLAIM_DIR, claim: ServerClaim | None = None
    ):
        """`claim`: the one a parent process took for its workers (kept by it); else the driver takes its own."""
        self.data_dir = Path(data_dir)
        self.settings = settings
        self._own_claim = claim is None
        self.claim = ServerClaim(self.data_dir, uid_claims) if claim is None else claim
        self.uids = self.claim.uids
        try:
            os.close(seccomp.filter_fd())  # no sandbox runs without its filter: fail at start, not at the first exec
            self.store = SnapshotStore(self.data_dir / "snapshots")
            self.cgroups, self.limits_report = Cgroups.detect()
        except BaseException:
            if self._own_claim:
                self.claim.close()
            raise
        self.runtime_dir = self.claim.runtime_dir

    def make(self, namespace: str, name: str, directory: Path) -> SandboxContainer:
        args = (namespace, name, Path(directory) / ROOT_DIR, self.runtime_dir, self.store)
        if self.uids is None:  # an unprivileged server runs every sandbox as itself
            return SandboxContainer(*args, cgroups=self.cgroups)
        return OwnUidSandbox(*args, cgroups=self.cgroups, host_uid=partial(self.uids.uid_for, Path(directory)))

    @staticmethod
    async def stop(container: SandboxContainer) -> None:
        """Server shutdown: stop the sandbox and keep its files (the next start reports `restarted`)."""
        await container.stop()

    def close(self) -> None:
        """Server exit, after the sandboxes are stopped: remove a per-process runtime dir (<data>/run stays) and let
        go of the uid range — unless a parent process holds them for its workers."""
        if self._own_claim:
            self.claim.close()
