"""Headroom for the server's own state on a disk that a sandbox can fill.

Sandboxes write their files under the same data dir as the workspaces' SQLite state. A command that fills the disk
would otherwise leave every workspace unable to record a request — not even the `rm` that frees the space could
run. The server keeps a preallocated ballast file; when SQLite reports the disk full, the ballast is released so
state writes go on, and it is put back once the disk has room again (like ext4's root-reserved blocks, which a
tmpfs or an unprivileged server does not have).
"""

import logging
import os
import threading
import time
from pathlib import Path

log = logging.getLogger("flarebox.reserve")

RESERVE_BYTES = 16 * 1024 * 1024
RECHECK_SECONDS = 5.0


class DiskReserve:
    def __init__(self, path: Path, size: int = RESERVE_BYTES):
        self.path = Path(path)
        self.size = size
        self._lock = threading.Lock()
        self._checked = 0.0
        self.ensure()

    @property
    def held(self) -> bool:
        try:
            return self.path.stat().st_size >= self.size
        except FileNotFoundError:
            return False

    def ensure(self) -> bool:
        """Put the ballast (back) in place when the disk has room for it and as much again. True when held."""
        with self._lock:
            self._checked = time.monotonic()
            if self.held:
                return True
            try:
                stat = os.statvfs(self.path.parent)
                if stat.f_bavail * stat.f_frsize < 2 * self.size:
                    return False
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    os.posix_fallocate(fd, 0, self.size)
                finally:
                    os.close(fd)
            except OSError as exc:
                log.warning("could not place the disk reserve %s: %s", self.path, exc)
                self.path.unlink(missing_ok=True)
                return False
            return True

    def release(self) -> bool:
        """The disk is full: give the ballast's space to the server's state. True when there was one to give."""
        with self._lock:  # a thread lock: the worker processes sharing the data dir (workers.py) race at unlink
            try:
                self.path.unlink()
            except FileNotFoundError:  # spent earlier, or another worker process released it a moment ago
                return False
            log.warning("the data dir's disk is full: released the %d-byte reserve for workspace state", self.size)
            return True

    def recheck(self) -> None:
        """After a successful write: put a released ballast back, at most every RECHECK_SECONDS."""
        if time.monotonic() - self._checked < RECHECK_SECONDS:
            return
        self._checked = time.monotonic()
        if not self.path.exists():
            self.ensure()
