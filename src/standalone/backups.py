"""ports.BackupStore of the standalone runtime: a directory (BACKUP_DIR), for example on another disk.

Layout: `<root>/<namespace>/<workspace>/<id>.tar.zst` (the export archive) and `<id>.json` (its manifest). Like the
snapshot store (snapshots.py) the archive is written under a `.tmp-` name while its sha256 is computed from the same
stream, fsynced, dropped from the page cache and read back from the disk; only when the read-back matched is it
renamed to its final name and the manifest written (`.tmp-`, fsync, rename, fsync of the directory) — the commit
point. So a crash, a full disk or a disk that gives back other bytes leaves nothing listed: an archive without a
manifest and any `.tmp-` file are leftovers that `list` ignores and `cleanup` (at construction) removes. A
BACKUP_DIR belongs to one server.

The root itself is never created: a BACKUP_DIR that is missing is a disk that is not mounted, and writing into the
empty mount point would fill the wrong disk. Each backup fails with backup_failed then, and the server still starts.

Without BACKUP_DIR the store exists but is not `available` (the backup routes answer backups_unavailable).
"""

import asyncio
import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from durable.ports import BackupInfo, ContainerGone
from protocol.errors import ProtocolError
from protocol.validate import validate_name
from standalone.snapshots import fsync_dir

ARCHIVE_SUFFIX = ".tar.zst"
MANIFEST_SUFFIX = ".json"
TMP_PREFIX = ".tmp-"
KIND = "flarebox-backup"
VERSION = 1
_ID = re.compile(r"^b-\d{13}-[0-9a-f]{6}$")
_CHUNK = 1 << 20  # disk writes and reads in 1 MiB steps, each in a worker thread (a slow disk never stalls the loop)

log = logging.getLogger("flarebox.backups")


async def _blocking(func: Any, *args: Any) -> Any:
    """`func(*args)` in a worker thread. A cancelled caller still waits for the thread to finish: it may be using
    a file descriptor the caller closes next (a closed and reused fd number would take the thread's bytes)."""
    fut = asyncio.get_running_loop().run_in_executor(None, func, *args)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await asyncio.wait({fut})
        raise


def _write_all(fd: int, data: bytes) -> None:
    """os.write until all of `data` is out (a module function: the fault tests replace it to inject EIO)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _open_read(path: Path) -> Any:
    return open(path, "rb")  # noqa: SIM115 - the caller's iterator closes it


def _make_dirs(path: Path) -> None:
    # one level at a time, never parents=True: a root that vanished (an unmounted disk) must not be re-created
    path.parent.mkdir(exist_ok=True)
    path.mkdir(exist_ok=True)


def _reason(exc: OSError, root: Path) -> str:
    """What the operator should read: the disk is full, gone, or failing."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"the backup directory {root} is full ({os.strerror(exc.errno)})"
    if exc.errno == errno.EIO:
        return f"the backup directory {root} gave an I/O error (is its disk failing?)"
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return f"the backup directory {root} is not writable ({os.strerror(exc.errno)})"
    if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ENODEV, errno.ENXIO, errno.ESTALE):
        return f"the backup directory {root} is gone ({os.strerror(exc.errno)}; is its disk mounted?)"
    return f"the backup directory {root} failed: {os.strerror(exc.errno) if exc.errno else exc}"


def _failed(reason: str) -> ProtocolError:
    return ProtocolError("backup_failed", f"the backup could not be written: {reason}; the workspace is unchanged")


class _Mismatch(Exception):
    pass


class DirectoryBackupStore:
    """`root`: the BACKUP_DIR, or None where none is configured (then `available` is False)."""

    def __init__(self, root: str | os.PathLike | None):
        self.root = None if root is None else Path(root)
        self.available = self.root is not None
        if self.root is not None and self.root.is_dir():
            try:
                self.cleanup()
            except OSError as exc:  # a failing disk must not stop the server; each backup then says why
                log.warning("backup store cleanup failed: %s", _reason(exc, self.root))

    # ---- layout -------------------------------------------------------------------------------------------
    def _need_root(self) -> Path:
        if self.root is None:
            raise ProtocolError("backups_unavailable")
        return self.root

    def _dir(self, namespace: str, workspace: str) -> Path:
        validate_name(namespace, "namespace")
        validate_name(workspace, "workspace")
        return self._need_root() / namespace / workspace

    @staticmethod
    def valid_id(backup_id: Any) -> bool:
        return isinstance(backup_id, str) and _ID.fullmatch(backup_id) is not None

    def cleanup(self) -> int:
        """Remove crash leftovers: `.tmp-*` files and archives whose manifest was never written. Returns the count."""
        if self.root is None or not self.root.is_dir():
            return 0
        removed = 0
        for ws_dir in self.root.glob("*/*"):
            if not ws_dir.is_dir() or ws_dir.is_symlink():
                continue
            for entry in ws_dir.iterdir():
                name = entry.name
                orphan = (
                    name.endswith(ARCHIVE_SUFFIX)
                    and not (ws_dir / (name[: -len(ARCHIVE_SUFFIX)] + MANIFEST_SUFFIX)).exists()
                )
                if name.startswith(TMP_PREFIX) or orphan:
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        entry.unlink(missing_ok=True)
                    removed += 1
        return removed

    # ---- reading ------------------------------------------------------------------------------------------
    @staticmethod
    def _manifest(ws_dir: Path, backup_id: str) -> BackupInfo | None:
        try:
            raw = json.loads((ws_dir / (backup_id + MANIFEST_SUFFIX)).read_text("utf-8"))
            if raw.get("kind") != KIND or raw.get("version") != VERSION or raw.get("id") != backup_id:
                return None
            return BackupInfo(
                id=backup_id,
                size=int(raw["size"]),
                created_at_ms=int(raw["created_at_ms"]),
                sha256=str(raw["sha256"]),
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
            return None  # a torn or edited manifest: not a backup

    def _list(self, namespace: str, workspace: str) -> list[BackupInfo]:
        ws_dir = self._dir(namespace, workspace)
        try:
            names = [entry.name for entry in ws_dir.iterdir()]
        except (FileNotFoundError, NotADirectoryError):
            return []
        found = []
        for name in names:
            if name.startswith(TMP_PREFIX) or not name.endswith(MANIFEST_SUFFIX):
                continue
            backup_id = name[: -len(MANIFEST_SUFFIX)]
            if self.valid_id(backup_id) and (info := self._manifest(ws_dir, backup_id)) is not None:
                found.append(info)
        found.sort(key=lambda b: (b.created_at_ms, b.id), reverse=True)
        return found

    async def list(self, namespace: str, workspace: str) -> list[BackupInfo]:
        """The committed backups, newest first ([] without a BACKUP_DIR). Raises ProtocolError('backup_failed')
        when the directory cannot be read (a failing disk)."""
        if self.root is None:
            return []
        try:
            return await _blocking(self._list, namespace, workspace)
        except OSError as exc:
            raise ProtocolError("backup_failed", f"the backups cannot be listed: {_reason(exc, self.root)}") from None

    async def open(self, namespace: str, workspace: str, backup_id: str) -> tuple[BackupInfo, AsyncIterator[bytes]]:
        """The backup and its archive as an async iterator of bytes (a request body for SandboxContainer.fetch:
        httpx streams it). The iterator checks the sha256 as it goes and raises ProtocolError('backup_failed')
        instead of ending when the bytes on disk no longer match, so the request breaks rather than completes."""
        ws_dir = self._dir(namespace, workspace)
        root = self._need_root()
        if not self.valid_id(backup_id):
            raise ProtocolError("backup_not_found", f"no backup {backup_id!r}")
        info = await _blocking(self._manifest, ws_dir, backup_id)
        if info is None:
            raise ProtocolError("backup_not_found", f"no backup {backup_id} of {namespace}/{workspace}")
        try:
            f = _open_read(ws_dir / (backup_id + ARCHIVE_SUFFIX))
        except FileNotFoundError:
            raise self._damaged(info, "has lost its archive") from None
        except OSError as exc:
            raise ProtocolError("backup_failed", f"backup {backup_id} cannot be read: {_reason(exc, root)}") from None
        size = os.fstat(f.fileno()).st_size
        if size != info.size:
            f.close()
            raise self._damaged(info, f"has {size} bytes where its manifest says {info.size}")
        return info, self._stream(f, info)

    @staticmethod
    def _damaged(info: BackupInfo, why: str) -> ProtocolError:
        return ProtocolError("backup_failed", f"backup {info.id} {why}: it is damaged and cannot be restored")

    async def _stream(self, f: Any, info: BackupInfo) -> AsyncIterator[bytes]:
        digest = hashlib.sha256()
        size = 0
        try:
            while chunk := await _blocking(f.read, _CHUNK):
                digest.update(chunk)
                size += len(chunk)
                if size > info.size:
                    break  # grew on disk: never send more than the manifest promised
                yield chunk
            if size != info.size or digest.hexdigest() != info.sha256:
                raise self._damaged(info, "failed its sha256 check while it was read")
        finally:
            f.close()

    # ---- writing ------------------------------------------------------------------------------------------
    async def write(self, namespace: str, workspace: str, backup_id: str, body: Any, created_at_ms: int) -> BackupInfo:
        """Store the export stream `body` (an async iterator of bytes) as backup `backup_id`. Raises
        ProtocolError('backup_failed') when the directory is full, gone, failing or gives back other bytes; an
        error of `body` itself (the sandbox stopped mid-export: ContainerGone) is raised as it is. Either way
        nothing is listed and no file of this backup is left."""
        ws_dir = self._dir(namespace, workspace)
        root = self._need_root()
        if not self.valid_id(backup_id):
            raise ValueError(f"not a backup id: {backup_id!r}")
        tmp_archive = ws_dir / (TMP_PREFIX + backup_id + ARCHIVE_SUFFIX)
        archive = ws_dir / (backup_id + ARCHIVE_SUFFIX)
        tmp_manifest = ws_dir / (TMP_PREFIX + backup_id + MANIFEST_SUFFIX)
        manifest = ws_dir / (backup_id + MANIFEST_SUFFIX)
        if manifest.exists() or archive.exists():
            raise ValueError(f"backup {backup_id} exists already")  # ids are fresh: a caller's bug, never a retry
        committed = False
        try:
            if not root.is_dir():
                raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), str(root))
            await _blocking(_make_dirs, ws_dir)
            size, sha = await self._write_archive(body, tmp_archive)
            await _blocking(self._verify, tmp_archive, size, sha)
            info = BackupInfo(id=backup_id, size=size, created_at_ms=int(created_at_ms), sha256=sha)
            await _blocking(self._commit, ws_dir, tmp_archive, archive, tmp_manifest, manifest, info)
            committed = True
            return info
        except OSError as exc:
            raise _failed(_reason(exc, root)) from None
        except _Mismatch as exc:
            raise _failed(f"the backup directory {root} gave back other bytes than were written ({exc})") from None
        finally:
            if not committed:
                for leftover in (tmp_archive, archive, tmp_manifest, manifest):
                    with contextlib.suppress(OSError):
                        leftover.unlink(missing_ok=True)

    async def _write_archive(self, body: Any, target: Path) -> tuple[int, str]:
        digest = hashlib.sha256()
        size = 0
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            pending: list[bytes] = []
            pending_size = 0
            chunks = body.__aiter__()
            while True:
                try:
                    chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    break
                except OSError as exc:  # the source's failure (a ConnectionError), never the backup disk's
                    raise ContainerGone(f"the export stream broke: {exc}") from None
                if not chunk:
                    continue
                digest.update(chunk)
                size += len(chunk)
                pending.append(chunk)
                pending_size += len(chunk)
                if pending_size >= _CHUNK:
                    await _blocking(_write_all, fd, b"".join(pending))
                    pending, pending_size = [], 0
            if pending:
                await _blocking(_write_all, fd, b"".join(pending))
            await _blocking(os.fsync, fd)
        except BaseException:
            aclose = getattr(body, "aclose", None)
            if aclose is not None:  # stop the export now (its connection is dropped), not when it is collected
                with contextlib.suppress(Exception):
                    await aclose()
            raise
        finally:
            os.close(fd)
        return size, digest.hexdigest()

    @staticmethod
    def _verify(path: Path, size: int, sha: str) -> None:
        """Read the archive back from the disk (its pages dropped from the cache first: a read from memory would
        only prove the cache right) and compare it with what was written."""
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            with contextlib.suppress(OSError, AttributeError):  # not every filesystem has a cache to drop
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            digest = hashlib.sha256()
            seen = 0
            while chunk := os.read(fd, _CHUNK):
                digest.update(chunk)
                seen += len(chunk)
        finally:
            os.close(fd)
        if seen != size:
            raise _Mismatch(f"{seen} bytes where {size} were written")
        if digest.hexdigest() != sha:
            raise _Mismatch("the sha256 differs")

    @staticmethod
    def _commit(
        ws_dir: Path, tmp_archive: Path, archive: Path, tmp_manifest: Path, manifest: Path, info: BackupInfo
    ) -> None:
        os.rename(tmp_archive, archive)
        data = json.dumps(
            {"kind": KIND, "version": VERSION, **info.__dict__}, separators=(",", ":"), sort_keys=True
        ).encode("utf-8")
        fd = os.open(tmp_manifest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp_manifest, manifest)
        fsync_dir(ws_dir)  # the commit point is durable once the directory entry is

    async def delete(self, namespace: str, workspace: str, backup_id: str) -> None:
        """Remove a backup (manifest first: it stops being listed before its archive goes). Missing is fine."""
        ws_dir = self._dir(namespace, workspace)
        if not self.valid_id(backup_id):
            return
        root = self._need_root()

        def remove() -> None:
            (ws_dir / (backup_id + MANIFEST_SUFFIX)).unlink(missing_ok=True)
            (ws_dir / (backup_id + ARCHIVE_SUFFIX)).unlink(missing_ok=True)

        try:
            await _blocking(remove)
        except (NotADirectoryError, FileNotFoundError):
            return
        except OSError as exc:
            raise ProtocolError(
                "backup_failed", f"backup {backup_id} cannot be deleted: {_reason(exc, root)}"
            ) from None
