"""A restore that runs while its sandbox starts.

Extracting a large snapshot (hundreds of milliseconds) and starting a sandbox (its namespaces, mounts and
interpreter: ~150–250 ms) do not depend on each other, so they overlap. The chain is extracted into a staging
directory whose live subdirectories exist before the sandbox starts; the sandbox binds those (a bind mount holds
the directory, not its path), and once both are done the staging directory is swapped into the live dir's place,
so the sandbox's /workspace is the restored tree. A failed extraction is removed and the live dir is untouched, as
with `SnapshotStore.restore`.

Sound because nothing of the workspace's runs before the server's first command: until `start()` returns, the
sandbox holds only its supervisor, which reads nothing of the live files until asked (`python -I`: no user site,
no startup file), and the server sends it nothing but `/health`. So no process inside can race the host's `tar`
or ownership adoption while they write the tree.
"""

import asyncio
import contextlib
import os
import shutil
import threading
from collections.abc import Mapping
from pathlib import Path

from durable.ports import SnapshotInfo
from standalone.snapshots import SnapshotStore, swap_into_place


class BackgroundRestore:
    """Extracts `snapshot_id` into `staging` on a thread from construction on; `extracted()` waits for that,
    `finish()` swaps the tree into `target` once the sandbox binding `staging`'s subdirs has made its mounts, and
    `abandon()` has the thread remove it instead. The thread removes nothing before one of the two is called."""

    def __init__(
        self,
        store: SnapshotStore,
        namespace: str,
        workspace: str,
        snapshot_id: str,
        target: Path,
        subdirs: Mapping[str, int],
        decide_seconds: float,
    ):
        self._target = target
        self._decide_seconds = decide_seconds  # a start that never decides (its loop gone) holds no thread forever
        self.staging = store.staging_for(target)
        try:
            for sub, mode in subdirs.items():
                path = self.staging / sub
                path.mkdir(mode=mode)
                os.chmod(path, mode)  # past the umask (tmp is 1777)
            # what the sandbox binds; tar must leave these very directories in place (see extracted). Held open
            # until then, so that no inode number is freed and handed to a replacement that would pass for one
            self._bound = {
                sub: os.open(self.staging / sub, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC) for sub in subdirs
            }
        except BaseException:
            self._close_bound()
            shutil.rmtree(self.staging, ignore_errors=True)
            raise
        self._decided = threading.Event()
        self._swap = False
        loop = asyncio.get_running_loop()
        self._extracted: asyncio.Future[bool] = loop.create_future()
        self._future = loop.run_in_executor(None, self._run, loop, store, namespace, workspace, snapshot_id)

    def _run(
        self, loop: asyncio.AbstractEventLoop, store: SnapshotStore, namespace: str, workspace: str, snapshot_id: str
    ) -> SnapshotInfo | None:
        try:
            try:
                try:
                    info = store.extract(namespace, workspace, snapshot_id, self.staging)
                    replaced = not all(_is(self.staging / sub, fd) for sub, fd in self._bound.items())
                finally:
                    self._close_bound()
            except BaseException as exc:  # whatever it is, the start waiting in extracted() hears of it
                _settle(loop, self._extracted, exc)
                raise
            _settle(loop, self._extracted, replaced)
            # nothing is removed before the start decides: the sandbox may still be about to bind the subdirs
            if not self._decided.wait(self._decide_seconds) or not self._swap:
                shutil.rmtree(self.staging, ignore_errors=True)
                return None
            swap_into_place(self.staging, self._target)
            return info
        except BaseException:
            self._decided.wait(self._decide_seconds)
            shutil.rmtree(self.staging, ignore_errors=True)
            raise

    def _close_bound(self) -> None:
        for fd in getattr(self, "_bound", {}).values():
            os.close(fd)
        self._bound = {}

    async def extracted(self) -> bool:
        """Wait for the extraction (or raise its error: snapshot_damaged). True when the archive replaced one of
        the staged live subdirs (its top entry was no directory): the sandbox did not bind the tree's own."""
        return await asyncio.shield(self._extracted)

    async def finish(self) -> SnapshotInfo:
        """Swap the extracted tree into `target` (once the sandbox has its mounts, or is stopped)."""
        self._swap = True
        self._decided.set()
        info = await self._future
        assert info is not None
        return info

    def abandon(self) -> None:
        """The start failed: the thread removes the staging dir when its extraction ends; nothing waits for it."""
        self._decided.set()
        self._future.add_done_callback(_consume)
        self._extracted.add_done_callback(_consume)


def _settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future, outcome: object) -> None:
    def settle() -> None:
        if future.done():
            return
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
        loop.call_soon_threadsafe(settle)


def _is(path: Path, fd: int) -> bool:
    """Whether `path` is the directory open as `fd` (held open: its inode number cannot have been reused)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def _consume(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()  # an abandoned restore's error was already answered by the start's own
