"""On-disk snapshot store of the standalone runtime: one tar+zstd archive and one manifest per snapshot.

Layout: `<root>/<namespace>/<workspace>/<id>.tar.zst` and `<id>.json`. The archive is written under a `.tmp-` name
while its sha256 is computed from the same stream, fsynced and renamed; the manifest is written the same way and
last, so it is the commit point: an archive without a manifest, or any `.tmp-` file, is a crash leftover that the
store ignores and removes on startup. A restore runs `zstd -d | tar -x` into a fresh
directory next to the target while it hashes the archive in parallel, and swaps that directory in only when the
checksum matched and both tools succeeded, so a damaged snapshot never replaces anything.

GNU tar and zstd do the work (multithreaded zstd); Python only hashes and copies the compressed stream.
"""

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from durable.ports import SnapshotInfo
from protocol.errors import ProtocolError
from protocol.validate import validate_name

FORMAT = "tar+zstd"
ARCHIVE_SUFFIX = ".tar.zst"
MANIFEST_SUFFIX = ".json"
TMP_PREFIX = ".tmp-"
ZSTD_LEVEL = 3
_ID = re.compile(r"^s-\d{13}-[0-9a-f]{6}$")
_CHUNK = 1 << 20
_F_SETPIPE_SZ = 1031  # fcntl: bigger pipe buffer → fewer, larger reads of the compressed stream


@dataclass(frozen=True)
class Manifest:
    id: str
    created_at_ms: int
    size: int
    sha256: str
    format: str = FORMAT

    def info(self) -> SnapshotInfo:
        return SnapshotInfo(id=self.id, size=self.size, created_at_ms=self.created_at_ms)


def new_snapshot_id(now_ms: int | None = None) -> str:
    """Time-sortable (13-digit milliseconds) plus random, e.g. `s-1764406800123-9f2c1a`."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    return f"s-{ms:013d}-{secrets.token_hex(3)}"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _tail(data: bytes, limit: int = 400) -> str:
    return data.decode("utf-8", "replace").strip()[-limit:]


def _read_tail_bytes(f, limit: int = 4096) -> bytes:
    with f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - limit))
        return f.read()


def _read_tail(f) -> str:
    return _tail(_read_tail_bytes(f))


def _is_root() -> bool:
    return os.geteuid() == 0


class SnapshotStore:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.cleanup()

    # ---- layout -------------------------------------------------------------------------------------------
    def _dir(self, namespace: str, workspace: str) -> Path:
        validate_name(namespace, "namespace")
        validate_name(workspace, "workspace")
        return self.root / namespace / workspace

    @staticmethod
    def _check_id(snapshot_id: str) -> str:
        if not isinstance(snapshot_id, str) or not _ID.fullmatch(snapshot_id):
            raise ValueError(f"not a snapshot id: {snapshot_id!r}")
        return snapshot_id

    def cleanup(self) -> int:
        """Remove crash leftovers: `.tmp-*` files and archives whose manifest was never written. Returns the count."""
        removed = 0
        for ws_dir in self.root.glob("*/*"):
            if not ws_dir.is_dir():
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
    def _manifest(self, ws_dir: Path, snapshot_id: str) -> Manifest | None:
        try:
            raw = json.loads((ws_dir / (snapshot_id + MANIFEST_SUFFIX)).read_text("utf-8"))
            return Manifest(
                id=str(raw["id"]),
                created_at_ms=int(raw["created_at_ms"]),
                size=int(raw["size"]),
                sha256=str(raw["sha256"]),
                format=str(raw["format"]),
            )
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            # a torn or edited manifest: listed as nothing, refused by verify
            return None

    def list(self, namespace: str, workspace: str) -> list[SnapshotInfo]:
        """Committed snapshots, newest first."""
        ws_dir = self._dir(namespace, workspace)
        if not ws_dir.is_dir():
            return []
        found = []
        for entry in ws_dir.iterdir():
            name = entry.name
            if name.startswith(TMP_PREFIX) or not name.endswith(MANIFEST_SUFFIX):
                continue
            snapshot_id = name[: -len(MANIFEST_SUFFIX)]
            if not _ID.fullmatch(snapshot_id):
                continue
            manifest = self._manifest(ws_dir, snapshot_id)
            if manifest is not None and manifest.id == snapshot_id:
                found.append(manifest.info())
        found.sort(key=lambda s: (s.created_at_ms, s.id), reverse=True)
        return found

    def _damaged(self, snapshot_id: str, why: str) -> ProtocolError:
        return ProtocolError(
            "snapshot_damaged",
            f"snapshot {snapshot_id} {why}; none of its files were restored and nothing ran. No route chooses an "
            "older snapshot yet: delete the workspace to start over, or ask the operator to look at the store.",
        )

    def _committed(self, ws_dir: Path, snapshot_id: str) -> Manifest:
        manifest = self._manifest(ws_dir, snapshot_id)
        if manifest is None or manifest.id != snapshot_id:
            if (ws_dir / (snapshot_id + MANIFEST_SUFFIX)).exists():
                raise self._damaged(snapshot_id, "has an unreadable manifest")
            raise self._damaged(snapshot_id, "does not exist")
        if manifest.format != FORMAT:
            raise self._damaged(snapshot_id, f"has unknown format {manifest.format!r}")
        archive = ws_dir / (snapshot_id + ARCHIVE_SUFFIX)
        try:
            size = archive.stat().st_size
        except FileNotFoundError:
            raise self._damaged(snapshot_id, "has lost its archive") from None
        if size != manifest.size:
            raise self._damaged(snapshot_id, f"has {size} bytes where its manifest says {manifest.size}")
        return manifest

    def verify(self, namespace: str, workspace: str, snapshot_id: str) -> SnapshotInfo:
        """Check the archive against its manifest (size and sha256). Raises ProtocolError('snapshot_damaged')."""
        ws_dir = self._dir(namespace, workspace)
        self._check_id(snapshot_id)
        manifest = self._committed(ws_dir, snapshot_id)
        digest = hashlib.sha256()
        with open(ws_dir / (snapshot_id + ARCHIVE_SUFFIX), "rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
        if digest.hexdigest() != manifest.sha256:
            raise self._damaged(snapshot_id, "failed its sha256 check")
        return manifest.info()

    # ---- writing ------------------------------------------------------------------------------------------
    def create(self, namespace: str, workspace: str, source_dir: str | os.PathLike) -> SnapshotInfo:
        """Archive `source_dir` (its contents, owners and modes) as a new snapshot.

        Raises ProtocolError('snapshot_failed') (e.g. disk full); nothing is left under a final name then."""
        ws_dir = self._dir(namespace, workspace)
        source = Path(source_dir)
        if not source.is_dir():
            raise ProtocolError("snapshot_failed", "the workspace has no files to snapshot")
        snapshot_id = new_snapshot_id()
        archive = ws_dir / (snapshot_id + ARCHIVE_SUFFIX)
        tmp_archive = ws_dir / (TMP_PREFIX + snapshot_id + ARCHIVE_SUFFIX)
        try:
            ws_dir.mkdir(parents=True, exist_ok=True)
            size, sha = self._write_archive(source, tmp_archive)
            os.rename(tmp_archive, archive)
            manifest = Manifest(id=snapshot_id, created_at_ms=int(time.time() * 1000), size=size, sha256=sha)
            self._write_manifest(ws_dir, manifest)
        except (OSError, subprocess.SubprocessError, _PipelineError) as exc:
            # best-effort cleanup: the failure may be that ws_dir itself is unusable (e.g. a file in its place)
            for leftover in (tmp_archive, archive, ws_dir / (TMP_PREFIX + snapshot_id + MANIFEST_SUFFIX)):
                with contextlib.suppress(OSError):
                    leftover.unlink(missing_ok=True)
            raise ProtocolError("snapshot_failed", f"the snapshot could not be written: {_describe(exc)}") from None
        return manifest.info()

    def _write_archive(self, source: Path, target: Path) -> tuple[int, str]:
        tar_cmd = ["tar", "-C", str(source), "--numeric-owner", "--sparse", "--warning=no-file-changed"]
        tar_cmd += ["--ignore-failed-read", "-cf", "-", "."]
        zstd_cmd = ["zstd", "-T0", f"-{ZSTD_LEVEL}", "-q", "-c"]
        digest = hashlib.sha256()
        size = 0
        # stderr goes to files, not pipes: thousands of tar warnings must not fill a pipe and stall the pipeline
        tar_err, zstd_err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        tar = subprocess.Popen(tar_cmd, stdout=subprocess.PIPE, stderr=tar_err, stdin=subprocess.DEVNULL)
        try:
            zstd = subprocess.Popen(zstd_cmd, stdin=tar.stdout, stdout=subprocess.PIPE, stderr=zstd_err)
        except BaseException:
            tar.kill()
            tar.wait()
            raise
        tar.stdout.close()  # zstd owns the read end now; tar gets SIGPIPE if zstd dies
        try:
            _grow_pipe(zstd.stdout.fileno())
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                while chunk := os.read(zstd.stdout.fileno(), _CHUNK):
                    digest.update(chunk)
                    view = memoryview(chunk)
                    while view:
                        written = os.write(fd, view)
                        view = view[written:]
                    size += len(chunk)
                os.fsync(fd)
            finally:
                os.close(fd)
        except BaseException:
            for proc in (tar, zstd):
                proc.kill()
            raise
        finally:
            zstd.stdout.close()
            tar_rc, zstd_rc = tar.wait(), zstd.wait()
        # tar exits 1 when files changed while it read them: a live workspace, still a consistent-enough snapshot
        if tar_rc not in (0, 1):
            raise _PipelineError(f"tar failed ({tar_rc}): {_read_tail(tar_err)}")
        if zstd_rc != 0:
            raise _PipelineError(f"zstd failed ({zstd_rc}): {_read_tail(zstd_err)}")
        return size, digest.hexdigest()

    def _write_manifest(self, ws_dir: Path, manifest: Manifest) -> None:
        tmp = ws_dir / (TMP_PREFIX + manifest.id + MANIFEST_SUFFIX)
        data = json.dumps(manifest.__dict__, separators=(",", ":")).encode("utf-8")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, ws_dir / (manifest.id + MANIFEST_SUFFIX))
        _fsync_dir(ws_dir)  # the commit point is durable once the directory entry is

    def delete(self, namespace: str, workspace: str, snapshot_id: str) -> None:
        """Remove a snapshot (manifest first: it stops being listed before its archive goes). Missing is fine."""
        ws_dir = self._dir(namespace, workspace)
        self._check_id(snapshot_id)
        (ws_dir / (snapshot_id + MANIFEST_SUFFIX)).unlink(missing_ok=True)
        (ws_dir / (snapshot_id + ARCHIVE_SUFFIX)).unlink(missing_ok=True)

    # ---- restoring ----------------------------------------------------------------------------------------
    def restore(self, namespace: str, workspace: str, snapshot_id: str, target_dir: str | os.PathLike) -> SnapshotInfo:
        """Replace `target_dir` with the snapshot's files, atomically. Raises ProtocolError('snapshot_damaged')
        (target untouched) when the archive does not match its manifest or does not unpack."""
        ws_dir = self._dir(namespace, workspace)
        self._check_id(snapshot_id)
        manifest = self._committed(ws_dir, snapshot_id)
        target = Path(target_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.parent / f"{TMP_PREFIX}restore-{target.name}-{secrets.token_hex(4)}"
        staging.mkdir(mode=0o700)
        try:
            self._extract(ws_dir / (snapshot_id + ARCHIVE_SUFFIX), manifest, staging)
            swap_into_place(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return manifest.info()

    def _extract(self, archive: Path, manifest: Manifest, staging: Path) -> None:
        """`zstd -d | tar -x` into `staging` while this thread hashes the same archive in parallel (hashlib drops
        the GIL); the caller only swaps `staging` in when the hash matched and both tools succeeded."""
        tar_cmd = ["tar", "-C", str(staging), "--numeric-owner", "-p", "--delay-directory-restore", "-xf", "-"]
        if _is_root():
            tar_cmd.insert(-2, "--same-owner")
        zstd_errf, tar_errf = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        digest = hashlib.sha256()
        with open(archive, "rb") as hashed, open(archive, "rb") as fed:
            if os.fstat(hashed.fileno()).st_ino != os.fstat(fed.fileno()).st_ino:
                raise self._damaged(manifest.id, "changed while being restored")
            zstd = subprocess.Popen(["zstd", "-d", "-q", "-c"], stdin=fed, stdout=subprocess.PIPE, stderr=zstd_errf)
            try:
                tar = subprocess.Popen(tar_cmd, stdin=zstd.stdout, stdout=subprocess.DEVNULL, stderr=tar_errf)
            except BaseException:
                zstd.kill()
                zstd.wait()
                raise
            zstd.stdout.close()
            try:
                while chunk := hashed.read(_CHUNK):
                    digest.update(chunk)
            finally:
                zstd_rc, tar_rc = zstd.wait(), tar.wait()
        zstd_err, tar_err = _read_tail_bytes(zstd_errf), _read_tail_bytes(tar_errf)
        if digest.hexdigest() != manifest.sha256:
            raise self._damaged(manifest.id, "failed its sha256 check")
        if zstd_rc != 0:
            raise self._damaged(manifest.id, f"does not decompress ({_tail(zstd_err, 200)})")
        if tar_rc != 0:
            if _is_disk_error(tar_err):
                raise ProtocolError("container_unavailable", f"restoring snapshot {manifest.id}: {_tail(tar_err)}")
            raise self._damaged(manifest.id, f"does not unpack ({_tail(tar_err, 200)})")


class _PipelineError(Exception):
    pass


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        return os.strerror(exc.errno)
    return str(exc)


def _is_disk_error(stderr: bytes) -> bool:
    text = stderr.decode("utf-8", "replace")
    return "No space left" in text or "Disk quota" in text


def _grow_pipe(fd: int) -> None:
    try:
        fcntl.fcntl(fd, _F_SETPIPE_SZ, _CHUNK)
    except OSError:
        pass  # a smaller pipe only costs more reads


_RENAME_EXCHANGE = 2
_libc = None


def _renameat2_exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE). False when the platform lacks it."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    func = getattr(_libc, "renameat2", None)
    if func is None:
        return False
    at_fdcwd = -100
    rc = func(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(err, os.strerror(err), str(b))


def swap_into_place(new: Path, target: Path) -> None:
    """Make `new` appear at `target` in one step; the previous `target` (if any) is removed afterwards."""
    if not target.exists():
        os.rename(new, target)
    elif _renameat2_exchange(new, target):
        shutil.rmtree(new, ignore_errors=True)  # `new` now holds the old contents
    else:
        old = target.parent / f"{TMP_PREFIX}old-{target.name}-{secrets.token_hex(4)}"
        os.rename(target, old)
        os.rename(new, target)
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(target.parent)
