"""Builds each workspace's container: a bubblewrap SandboxContainer, with the server's one snapshot store and cgroup
manager, and its files at <data>/workspaces/<ns>/<ws>/root (the registry keeps state.sqlite3 beside it)."""

import hashlib
import tempfile
from pathlib import Path

from durable.settings import Settings
from standalone.cgroups import Cgroups
from standalone.sandbox import SandboxContainer
from standalone.snapshots import SnapshotStore

ROOT_DIR = "root"
# the sandbox's unix socket lives at <runtime>/<12 hex>/sv.sock and must stay under 100 bytes
MAX_RUNTIME_DIR = 70


def runtime_dir(data_dir: Path) -> Path:
    """<data>/run, or a private directory under the system temp dir when the data dir's path is too long."""
    preferred = Path(data_dir) / "run"
    if len(str(preferred)) <= MAX_RUNTIME_DIR:
        return preferred
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"flarebox-run-{digest}"


class SandboxDriver:
    def __init__(self, data_dir: Path, settings: Settings):
        self.data_dir = Path(data_dir)
        self.settings = settings
        self.store = SnapshotStore(self.data_dir / "snapshots")
        self.cgroups, self.limits_report = Cgroups.detect()
        self.runtime_dir = runtime_dir(self.data_dir)
        self.runtime_dir.mkdir(parents=True, exist_ok=True, mode=0o755)

    def make(self, namespace: str, name: str, directory: Path) -> SandboxContainer:
        return SandboxContainer(
            namespace, name, Path(directory) / ROOT_DIR, self.runtime_dir, self.store, cgroups=self.cgroups
        )

    @staticmethod
    async def stop(container: SandboxContainer) -> None:
        """Server shutdown: stop the sandbox and keep its files (the next start reports `restarted`)."""
        await container.stop()
