"""Portable export/import archives ("flarebox-export" version 1) of /workspace and the sandbox user's home.

An archive is a zstd-compressed POSIX (pax) tar stream: members `workspace/…` and `home/…` (regular files,
directories, symlinks; directories before what they hold), then `manifest.json` last, listing every member with its
type, size, mode, sha256 (files) and target (symlinks), plus `skipped`: what could not be exported (unreadable,
sockets, FIFOs, devices) with the reason — those are left out of the members and of `files`. A file that vanishes
during the export is left out; one that changes is recorded as read: a file up to 1 MiB is read whole before its
header, a larger one that shrinks is padded with zeros to the size its header promised, and its sha256 is of what
the archive holds, so the archive always verifies.

The work runs in a worker process (`python -m flarebox_supervisor.archive export|import`) started with the sandbox
user's rights, so an export reads and an import writes only what that user could; the supervisor moves the bytes
between HTTP and the worker's pipes. The worker shells out to the `zstd` CLI (multithreaded) and writes or parses
the tar stream itself: large reads, one pass per file that hashes what it writes, a header built in a few
microseconds — tarfile's 16 KiB copy loop and per-member overhead would dominate on trees of many small files.

Import extracts into hidden staging directories inside each root (same filesystem, so the final swap is renames),
verifying every member against the manifest; it never follows a symlink (every path is opened component by
component from a directory descriptor with O_NOFOLLOW, and a member below a symlink member is refused). Any
mismatch removes the staging directories and leaves the live files untouched.

archive_tree.py makes one directory's plain tar.zst (GET and PUT /files/archive) from the same pieces: the exporter,
compress_to, the header reader (_headers), the importer's staging, extraction and swap, and the worker's answer.
"""

import argparse
import contextlib
import errno
import fcntl
import hashlib
import json
import os
import secrets
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from typing import NamedTuple

FORMAT = "flarebox-export"
VERSION = 1
MANIFEST = "manifest.json"
STAGING_PREFIX = ".flarebox-import-"
TRASH_PREFIX = ".flarebox-trash-"
ZSTD = shutil.which("zstd", path="/usr/local/bin:/usr/bin:/bin") or "zstd"
ZSTD_LEVEL = "-3"

_BLOCK = 512
_CHUNK = 1024 * 1024  # one read/hash/write step of a large file
_SMALL = 1024 * 1024  # files up to this size are read whole before their header (their real size is known)
_FLUSH = 1024 * 1024  # small members are batched into writes of about this size
_PIPE_SIZE = 1024 * 1024  # fewer wake-ups per MiB than the default 64 KiB pipe
_MAX_SKIPPED_LISTED = 1000
_MAX_MANIFEST_BYTES = 512 * 1024 * 1024  # the manifest is parsed whole; an import's memory bound
# protocol.limits.MAX_PATH_BYTES (a unit test keeps them equal): the worker does not import the protocol package,
# whose import is a third of the worker's start-up and is paid by every export and import
_MAX_PATH_BYTES = 4096
_MODE_BITS = 0o1777  # permission bits and sticky; never setuid/setgid
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW


def widen_pipe(fd: int) -> None:
    try:
        fcntl.fcntl(fd, _F_SETPIPE_SZ, _PIPE_SIZE)
    except OSError:
        pass  # not a pipe, or over the system's pipe-max-size: the default works, only slower


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


# --- tar headers -------------------------------------------------------------------------------------------------


_USTAR = struct.Struct("100s8s8s8s12s12s8sc100s8s32s32s8s8s167s")
_OCTAL_ZERO = b"0000000\0"
_ZEROS = bytes(_BLOCK)


def _header(name: str, kind: bytes, size: int, mode: int, mtime: int, target: str = "") -> bytes:
    """A ustar header block when every field fits (the common case, built directly), else a pax header pair from
    tarfile (long or non-ASCII names and targets, huge sizes, odd mtimes)."""
    if name.isascii() and target.isascii() and len(name) <= 100 and len(target) <= 100 and 0 <= size < 8**11:
        if 0 <= mtime < 8**11:
            head = _USTAR.pack(
                name.encode(),
                b"%07o\0" % mode,
                _OCTAL_ZERO,
                _OCTAL_ZERO,
                b"%011o\0" % size,
                b"%011o\0" % mtime,
                b"        ",
                kind,
                target.encode(),
                b"ustar\x0000",
                b"",
                b"",
                b"",
                b"",
                b"",
            )
            return head[:148] + b"%06o\0 " % sum(head) + head[156:]
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode, info.mtime, info.linkname = kind, size, mode, mtime, target
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _padding(size: int) -> bytes:
    return b"\0" * (-size % _BLOCK)


# --- export ------------------------------------------------------------------------------------------------------


class _Exporter:
    """Walks the roots and writes the tar stream to `out` (the zstd process's stdin)."""

    def __init__(self, out: int):
        self.out = out
        self.buffer = bytearray()
        self.entries: list[dict] = []
        self.skipped: list[dict] = []
        self.skipped_count = 0
        self.total = 0
        self.chunk = bytearray(_CHUNK)

    def flush(self) -> None:
        if self.buffer:
            _write_all(self.out, self.buffer)
            self.buffer.clear()

    def emit(self, data) -> None:
        self.buffer += data
        if len(self.buffer) >= _FLUSH:
            self.flush()

    def record(self, entry: dict) -> None:
        """A member written: kept for the manifest."""
        self.entries.append(entry)

    def skip(self, path: str, reason: str) -> None:
        self.skipped_count += 1
        if len(self.skipped) < _MAX_SKIPPED_LISTED:
            self.skipped.append({"path": path, "reason": reason})

    def walk_root(self, prefix: str, root: str, exclude: set[tuple[int, int]]) -> None:
        try:
            fd = os.open(root, _DIR_FLAGS)
        except FileNotFoundError:
            return  # no such root (a user without a home): nothing to export from it
        try:
            self.walk(fd, prefix, top=True, exclude=exclude)
        finally:
            os.close(fd)

    def walk(self, dir_fd: int, prefix: str, top: bool, exclude: set[tuple[int, int]]) -> None:
        try:
            with os.scandir(dir_fd) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            self.skip(prefix + "/", f"cannot list the directory ({os.strerror(exc.errno or 0)})")
            return
        for entry in entries:
            name = entry.name
            if top and (name.startswith(STAGING_PREFIX) or name.startswith(TRASH_PREFIX)):
                continue  # an import's leftovers, never user data
            path = f"{prefix}/{name}" if prefix else name  # no prefix: names relative to the walked directory
            try:
                # the entry's type comes with the listing (d_type): no stat before the open
                if entry.is_file(follow_symlinks=False):
                    self.file(dir_fd, name, path)
                elif entry.is_dir(follow_symlinks=False):
                    self.directory(dir_fd, name, path, exclude)
                elif entry.is_symlink():
                    self.symlink(dir_fd, name, path)
                else:
                    self.skip(path, "not a regular file, directory or symlink (a socket, FIFO or device)")
            except FileNotFoundError:
                continue  # vanished since it was listed
            except OSError as exc:
                if exc.errno in (errno.EPIPE, errno.ENOSPC, errno.EIO):
                    raise
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    continue  # replaced (by a symlink, a file) since it was listed: not this entry any more
                self.skip(path, f"cannot read it ({os.strerror(exc.errno or 0)})")

    def directory(self, dir_fd: int, name: str, path: str, exclude: set[tuple[int, int]]) -> None:
        sub = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        try:
            info = os.fstat(sub)
            if (info.st_dev, info.st_ino) in exclude:
                return  # the other root, nested in this one: exported under its own prefix
            mode = stat.S_IMODE(info.st_mode) & _MODE_BITS
            self.emit(_header(path, tarfile.DIRTYPE, 0, mode, int(info.st_mtime)))
            self.record({"path": path, "type": "dir", "size": 0, "mode": mode})
            self.walk(sub, path, top=False, exclude=exclude)
        finally:
            os.close(sub)

    def symlink(self, dir_fd: int, name: str, path: str) -> None:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISLNK(info.st_mode):
            return
        try:
            target = os.readlink(name, dir_fd=dir_fd)
        except OSError:
            return  # vanished or no longer a symlink
        self.emit(_header(path, tarfile.SYMTYPE, 0, 0o777, int(info.st_mtime), target))
        self.record({"path": path, "type": "symlink", "size": 0, "mode": 0o777, "target": target})

    def file(self, dir_fd: int, name: str, path: str) -> None:
        # O_NONBLOCK: a FIFO swapped in since the listing must not hang the export (a regular file ignores it)
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW, dir_fd=dir_fd)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                return
            mode, mtime, size = stat.S_IMODE(info.st_mode) & _MODE_BITS, int(info.st_mtime), info.st_size
            if size <= _SMALL:
                # read whole before the header, so the header carries what was really read if the file changes
                data = os.read(fd, size) if size else b""
                if len(data) < size:
                    parts = [data]
                    while sum(map(len, parts)) < size and (part := os.read(fd, size - sum(map(len, parts)))):
                        parts.append(part)
                    data = b"".join(parts)
                size = len(data)
                digest = hashlib.sha256(data)
                buffer = self.buffer
                buffer += _header(path, tarfile.REGTYPE, size, mode, mtime)
                buffer += data
                buffer += _ZEROS[: -size % _BLOCK]
                if len(buffer) >= _FLUSH:
                    self.flush()
            else:
                digest = hashlib.sha256()
                self.emit(_header(path, tarfile.REGTYPE, size, mode, mtime))
                self.flush()
                self.stream(fd, size, digest)
                self.emit(_padding(size))
        finally:
            os.close(fd)
        self.total += size
        self.record({"path": path, "type": "file", "size": size, "mode": mode, "sha256": digest.hexdigest()})

    def stream(self, fd: int, size: int, digest) -> None:
        """Copy `size` bytes of a large file, hashing each chunk as it goes out. A file that shrank meanwhile is
        padded with zeros (the header promised `size`); the manifest's sha256 is of what the archive holds."""
        view, left = memoryview(self.chunk), size
        while left:
            n = os.readv(fd, [view[: min(left, _CHUNK)]])
            if n == 0:
                zeros = bytes(min(left, _CHUNK))
                digest.update(zeros)
                _write_all(self.out, zeros)
                left -= len(zeros)
                continue
            digest.update(view[:n])
            _write_all(self.out, view[:n])
            left -= n

    def finish(self) -> None:
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "files": self.entries,
            "total_bytes": self.total,
            "skipped": self.skipped,
            "skipped_count": self.skipped_count,
        }
        data = json.dumps(manifest, separators=(",", ":")).encode()
        self.emit(_header(MANIFEST, tarfile.REGTYPE, len(data), 0o644, int(time.time())))
        self.emit(data)
        self.emit(_padding(len(data)))
        self.emit(b"\0" * (2 * _BLOCK))
        self.flush()


def _root_ids(roots: list[tuple[str, str]]) -> set[tuple[int, int]]:
    ids = set()
    for _prefix, path in roots:
        try:
            info = os.stat(path)
            ids.add((info.st_dev, info.st_ino))
        except OSError:
            pass
    return ids


def export_to(roots: list[tuple[str, str]], out: int) -> None:
    """Write the tar.zst of `roots` ([(prefix, directory)]) to the descriptor `out`, compressing with zstd."""

    def produce(tar: int) -> None:
        exporter = _Exporter(tar)
        exclude = _root_ids(roots)
        for prefix, path in roots:
            exporter.walk_root(prefix, path, exclude - _root_ids([(prefix, path)]))
        exporter.finish()

    compress_to(out, produce)


def compress_to(out: int, produce) -> None:
    """Run `produce(fd)`, which writes a tar stream to fd, through zstd into the descriptor `out`. zstd is stopped
    (its output left unfinished) when produce fails."""
    widen_pipe(out)
    zstd = subprocess.Popen([ZSTD, "-q", "-c", "-T0", ZSTD_LEVEL], stdin=subprocess.PIPE, stdout=out)
    ok = False
    try:
        widen_pipe(zstd.stdin.fileno())
        produce(zstd.stdin.fileno())
        ok = True
    finally:
        zstd.stdin.close()
        if not ok:
            zstd.kill()
        if zstd.wait() != 0 and ok:
            raise OSError(errno.EIO, f"zstd failed with exit status {zstd.returncode}")


# --- import ------------------------------------------------------------------------------------------------------


class ArchiveError(Exception):
    """The archive is not a valid flarebox export (→ invalid_archive) or over a limit (→ payload_too_large); `code`
    is the protocol error the worker answers with (a directory archive's worker also uses file_not_found, …)."""

    def __init__(self, message: str, code: str = "invalid_archive"):
        super().__init__(message)
        self.code, self.message = code, message


class _Reader:
    """Exact reads from the decompressed stream, with a count of the bytes consumed."""

    def __init__(self, stream):
        self.stream = stream
        self.offset = 0
        self.eof = False

    def read_exact(self, size: int, what: str) -> bytes:
        data = self.stream.read(size)
        if len(data) != size:
            self.eof = True
            raise ArchiveError(f"the archive ends inside {what} (truncated stream)")
        self.offset += size
        return data

    def readinto(self, view: memoryview, what: str) -> None:
        got = 0
        while got < len(view):
            n = self.stream.readinto(view[got:])
            if not n:
                self.eof = True
                raise ArchiveError(f"the archive ends inside {what} (truncated stream)")
            got += n
        self.offset += got


def _pax_records(data: bytes) -> dict[str, str]:
    """Parse a pax extended header: records `<length> <key>=<value>\\n`."""
    records, pos = {}, 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0 or not data[pos:space].isdigit():
            raise ArchiveError("a pax extended header is malformed")
        length = int(data[pos:space])
        record = data[space + 1 : pos + length]
        if length <= 0 or pos + length > len(data) or not record.endswith(b"\n") or b"=" not in record:
            raise ArchiveError("a pax extended header is malformed")
        key, value = record[:-1].split(b"=", 1)
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return records


_ALLOWED_TYPES = {tarfile.REGTYPE: "file", tarfile.AREGTYPE: "file", tarfile.DIRTYPE: "dir", tarfile.SYMTYPE: "symlink"}
_TYPE_NAMES = {
    tarfile.LNKTYPE: "a hard link",
    tarfile.CHRTYPE: "a character device",
    tarfile.BLKTYPE: "a block device",
    tarfile.FIFOTYPE: "a FIFO",
    tarfile.CONTTYPE: "a contiguous file",
    tarfile.GNUTYPE_SPARSE: "a sparse file",
    tarfile.GNUTYPE_LONGNAME: "a GNU long name",
    tarfile.GNUTYPE_LONGLINK: "a GNU long link",
    tarfile.XGLTYPE: "a pax global header",
}


class _Header(NamedTuple):
    """One member's header with its pax (or GNU long-name) extensions applied."""

    type: bytes
    name: str
    target: str
    size: int
    mode: int
    mtime: int


_GNU_LONG = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK)
_MAX_EXTENSION = 1024 * 1024  # a pax or GNU long-name header's data is held in memory


def _headers(reader: _Reader, foreign: bool = False) -> Iterator[_Header]:
    """The members' headers up to the end-of-archive block. The caller reads each member's data before it asks for
    the next. `foreign` also reads what other tar writers use: GNU tar's long-name members ('L', 'K') and pax
    global headers that only hold a comment (git archive's); a flarebox export has neither."""
    pax: dict[str, str] = {}
    gnu: dict[bytes, str] = {}
    while True:
        block = reader.read_exact(_BLOCK, "a header")
        if block == _ZEROS:
            return  # end of archive
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.HeaderError as exc:
            raise ArchiveError(f"a damaged tar header at byte {reader.offset - _BLOCK} ({exc})") from None
        if info.type == tarfile.XHDTYPE or (foreign and (info.type in _GNU_LONG or info.type == tarfile.XGLTYPE)):
            if info.size > _MAX_EXTENSION:
                raise ArchiveError("a pax extended header is larger than 1 MiB")
            data = reader.read_exact(info.size + (-info.size % _BLOCK), "a pax header")[: info.size]
            if info.type == tarfile.XHDTYPE:
                pax.update(_pax_records(data))
            elif info.type in _GNU_LONG:
                gnu[info.type] = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
            elif set(_pax_records(data)) - {"comment"}:
                raise ArchiveError("a pax global header sets more than a comment (not supported)")
            continue
        name = pax.get("path", gnu.get(tarfile.GNUTYPE_LONGNAME, info.name))
        target = pax.get("linkpath", gnu.get(tarfile.GNUTYPE_LONGLINK, info.linkname))
        size, mtime = info.size, info.mtime
        try:
            if "size" in pax:
                size = int(pax["size"])
            if "mtime" in pax:
                mtime = int(float(pax["mtime"]))
        except (ValueError, OverflowError):
            raise ArchiveError(f"member {name!r}: a pax size or mtime is not a number") from None
        if any(key.startswith("GNU.sparse") for key in pax):
            raise ArchiveError(f"member {name!r}: sparse files are not allowed")
        pax, gnu = {}, {}
        yield _Header(info.type, name, target, size, info.mode, mtime)


def _member_kind(head: _Header, allowed: dict[bytes, str], allowed_text: str) -> str:
    """The member's kind ("file", "dir", …) from `allowed`, refusing other types and data where none belongs."""
    kind = allowed.get(head.type)
    if kind is None:
        what = _TYPE_NAMES.get(head.type, f"an unknown member type {head.type!r}")
        raise ArchiveError(f"member {head.name!r} is {what}: only {allowed_text} are allowed")
    if head.size < 0 or (kind != "file" and head.size != 0):
        raise ArchiveError(f"member {head.name!r}: a {kind} with size {head.size}")
    return kind


@contextlib.contextmanager
def _extracting(name: str):
    """Creating a member: an OSError other than a full or failing disk means the archive's fault."""
    try:
        yield
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO):
            raise
        # a name the filesystem refuses, or a path that is not what the archive said it was
        raise ArchiveError(f"member {name!r} cannot be extracted ({os.strerror(exc.errno or 0)})") from None


def _check_trailer(stream) -> None:
    """The rest of the end-of-archive padding (read so zstd can finish): zeros only, and not an endless stream."""
    trailer = stream.read(_CHUNK + 1)
    if len(trailer) > _CHUNK or trailer.count(0) != len(trailer):
        raise ArchiveError("there is data after the end of the archive")


def _member_path(name: str) -> tuple[str, ...]:
    """The member's components, refusing anything that is not a normalized relative path below workspace/ or
    home/ (or the manifest)."""
    if not name:
        raise ArchiveError("a member has an empty name")
    if "\0" in name:
        raise ArchiveError(f"member {name!r}: the name contains NUL")
    if len(os.fsencode(name)) > _MAX_PATH_BYTES:
        raise ArchiveError(f"a member's name is longer than {_MAX_PATH_BYTES} bytes")
    if name.startswith("/"):
        raise ArchiveError(f"member {name!r}: absolute paths are not allowed")
    parts = tuple(name.split("/"))
    if any(part in ("", ".", "..") for part in parts):
        raise ArchiveError(f"member {name!r}: the path is not normalized (empty, '.' or '..' components)")
    if any(len(os.fsencode(part)) > 255 for part in parts):
        raise ArchiveError(f"member {name!r}: a path component is longer than 255 bytes")
    if parts[0] not in ("workspace", "home") or len(parts) < 2:
        raise ArchiveError(f"member {name!r}: every path must be below workspace/ or home/")
    if parts[1].startswith(STAGING_PREFIX) or parts[1].startswith(TRASH_PREFIX):
        raise ArchiveError(f"member {name!r}: that name is reserved for imports")
    return parts


class _Importer:
    def __init__(self, roots: dict[str, str], max_bytes: int, max_entries: int):
        self.roots = roots
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self.staging: dict[str, str] = {}  # prefix → staging directory path
        self.staging_fd: dict[str, int] = {}
        self.seen: dict[str, dict] = {}  # member path → what was extracted
        self.dirs: list[tuple[tuple[str, ...], int, int]] = []  # (parts, mode, mtime) applied at the end
        self.total = 0
        self.chunk = bytearray(_CHUNK)
        self._dir_cache: dict[tuple[str, ...], int] = {}

    # staging ---------------------------------------------------------------------------------------------------

    def prepare(self) -> None:
        for prefix, root in self.roots.items():
            if not os.path.isdir(root):
                raise ArchiveError(f"the {prefix} directory {root} does not exist", "internal_error")
            _remove_leftovers(root)
            path = os.path.join(root, STAGING_PREFIX + secrets.token_hex(6))
            os.mkdir(path, 0o700)
            self.staging[prefix] = path
            self.staging_fd[prefix] = os.open(path, _DIR_FLAGS)

    def discard(self) -> None:
        self._close_cache()
        for fd in self.staging_fd.values():
            os.close(fd)
        self.staging_fd.clear()
        for path in self.staging.values():
            _rmtree(path)
        self.staging.clear()

    def _close_cache(self) -> None:
        for fd in self._dir_cache.values():
            os.close(fd)
        self._dir_cache.clear()

    def parent_fd(self, parts: tuple[str, ...]) -> int:
        """A descriptor of the staged directory holding `parts`, opened one component at a time with
        O_NOFOLLOW from the staging root (never through a symlink)."""
        parent = parts[1:-1]
        if not parent:
            return self.staging_fd[parts[0]]
        key = parts[:-1]
        fd = self._dir_cache.get(key)
        if fd is not None:
            return fd
        if len(self._dir_cache) >= 64:
            self._close_cache()
        fd = os.open(parent[0], _DIR_FLAGS, dir_fd=self.staging_fd[parts[0]])
        try:
            for part in parent[1:]:
                next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = next_fd
        except BaseException:
            os.close(fd)
            raise
        self._dir_cache[key] = fd
        return fd

    # reading ---------------------------------------------------------------------------------------------------

    def run(self, stream, eof: list) -> dict:
        reader = _Reader(stream)
        try:
            return self._run(reader, stream)
        finally:
            if reader.eof:
                eof.append(True)

    def _run(self, reader: "_Reader", stream) -> dict:
        manifest = None
        for head in _headers(reader):
            if manifest is not None:
                raise ArchiveError(f"member {head.name!r} comes after {MANIFEST}, which must be the last member")
            kind = _member_kind(head, _ALLOWED_TYPES, "files, directories and symlinks")
            name = head.name.rstrip("/") if kind == "dir" else head.name
            if name == MANIFEST and kind == "file":
                if head.size > _MAX_MANIFEST_BYTES:
                    raise ArchiveError(f"{MANIFEST} is larger than {_MAX_MANIFEST_BYTES} bytes")
                manifest = reader.read_exact(head.size, MANIFEST)
                reader.read_exact(-head.size % _BLOCK, MANIFEST)
                continue
            with _extracting(name):
                self.member(reader, kind, head._replace(name=name, mode=head.mode & _MODE_BITS))
        if manifest is None:
            raise ArchiveError(f"the archive has no {MANIFEST} (it must be the last member)")
        _check_trailer(stream)
        self.check_manifest(manifest)
        return {"files": sum(1 for e in self.seen.values() if e["type"] == "file"), "bytes": self.total}

    def member(self, reader: _Reader, kind: str, head: _Header) -> None:
        name, size, target = head.name, head.size, head.target
        parts = _member_path(name)
        if parts[0] not in self.staging_fd:
            raise ArchiveError(f"member {name!r}: this workspace has no {parts[0]} directory to import it into")
        if name in self.seen:
            raise ArchiveError(f"member {name!r} appears twice")
        if len(self.seen) >= self.max_entries:
            raise ArchiveError(f"the archive has more than {self.max_entries} entries", "payload_too_large")
        if kind == "file" and self.total + size > self.max_bytes:
            raise ArchiveError(f"the archive's files hold more than {self.max_bytes} bytes", "payload_too_large")
        if len(parts) > 2:
            parent = self.seen.get("/".join(parts[:-1]))
            if parent is None or parent["type"] != "dir":
                raise ArchiveError(f"member {name!r}: its parent directory is not an earlier directory member")
        if kind == "symlink" and (not target or len(os.fsencode(target)) > _MAX_PATH_BYTES):
            raise ArchiveError(f"symlink {name!r}: the target is empty or longer than {_MAX_PATH_BYTES} bytes")
        self.seen[name] = self.extract(reader, parts, kind, head)

    def extract(self, reader: _Reader, parts: tuple[str, ...], kind: str, head: _Header) -> dict:
        """Create one checked member in staging (`parts`: its root's prefix, then its path below the root; `head`:
        its mode already without setuid/setgid); a file's data is read from `reader`. Returns what was extracted
        (with a file's sha256)."""
        name, size, mode, mtime, target = head.name, head.size, head.mode, head.mtime, head.target
        entry = {"type": kind, "size": size, "mode": mode}
        parent_fd = self.parent_fd(parts)
        leaf = parts[-1]
        if kind == "dir":
            os.mkdir(leaf, 0o700, dir_fd=parent_fd)  # writable while staging; its own mode is applied last
            self.dirs.append((parts, mode, mtime))
        elif kind == "symlink":
            os.symlink(target, leaf, dir_fd=parent_fd)
            os.utime(leaf, (mtime, mtime), dir_fd=parent_fd, follow_symlinks=False)
            entry["target"] = target
        else:
            fd = os.open(leaf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600, dir_fd=parent_fd)
            try:
                digest = hashlib.sha256()
                view, left = memoryview(self.chunk), size
                while left:
                    part = view[: min(left, _CHUNK)]
                    reader.readinto(part, f"member {name!r}")
                    digest.update(part)
                    _write_all(fd, part)
                    left -= len(part)
                os.fchmod(fd, mode)
                os.utime(fd, (mtime, mtime))
            finally:
                os.close(fd)
            reader.read_exact(-size % _BLOCK, f"member {name!r}")
            entry["sha256"] = digest.hexdigest()
            self.total += size
        return entry

    def check_manifest(self, raw: bytes) -> None:
        try:
            manifest = json.loads(raw)
        except ValueError:
            raise ArchiveError(f"{MANIFEST} is not JSON") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise ArchiveError(f"{MANIFEST} is not a {FORMAT} manifest")
        if manifest.get("version") != VERSION:
            raise ArchiveError(f"{MANIFEST} has version {manifest.get('version')!r}; this server reads {VERSION}")
        files = manifest.get("files")
        if not isinstance(files, list):
            raise ArchiveError(f"{MANIFEST} has no list of files")
        listed = set()
        for item in files:
            if not isinstance(item, dict) or not isinstance(item.get("path"), str):
                raise ArchiveError(f"{MANIFEST} has an entry without a path")
            path = item["path"]
            if path in listed:
                raise ArchiveError(f"{MANIFEST} lists {path!r} twice")
            listed.add(path)
            got = self.seen.get(path)
            if got is None:
                raise ArchiveError(f"{MANIFEST} lists {path!r}, which is not in the archive")
            for key in ("type", "size", "mode", "sha256", "target"):
                if item.get(key) != got.get(key):
                    raise ArchiveError(
                        f"{path!r}: the manifest says {key} {item.get(key)!r}, the archive holds {got.get(key)!r}"
                    )
        extra = [path for path in self.seen if path not in listed]
        if extra:
            raise ArchiveError(f"member {extra[0]!r} is not listed in {MANIFEST}")
        if manifest.get("total_bytes") != self.total:
            raise ArchiveError(
                f"{MANIFEST} says total_bytes {manifest.get('total_bytes')!r}, the files hold {self.total}"
            )

    # committing ------------------------------------------------------------------------------------------------

    def apply_dir_modes(self, top_level: bool) -> None:
        """Directories' modes and mtimes, deepest first (writing into a directory changes its mtime; a read-only
        one could not be filled). Top-level ones wait until they are in place: moving a directory needs it
        writable."""
        self._close_cache()
        for parts, mode, mtime in sorted(self.dirs, key=lambda d: len(d[0]), reverse=True):
            if (len(parts) == 2) != top_level:
                continue
            base = self.roots[parts[0]] if top_level else None
            parent = os.open(base, _DIR_FLAGS) if top_level else self.parent_fd(parts)
            try:
                fd = os.open(parts[-1], _DIR_FLAGS, dir_fd=parent)
                try:
                    os.fchmod(fd, mode)
                    os.utime(fd, (mtime, mtime))
                finally:
                    os.close(fd)
            finally:
                if top_level:
                    os.close(parent)
        self._close_cache()

    def commit(self) -> None:
        self.apply_dir_modes(top_level=False)
        for fd in self.staging_fd.values():
            os.close(fd)
        self.staging_fd.clear()
        for prefix, root in self.roots.items():
            _swap(root, self.staging[prefix])
        self.apply_dir_modes(top_level=True)
        for prefix in list(self.staging):
            _rmtree(self.staging.pop(prefix))


def _swap(root: str, staging: str) -> None:
    """Replace root's entries by staging's: old ones moved into a trash directory, staged ones moved up, the trash
    removed. A failed rename puts everything back as it was."""
    trash = os.path.join(root, TRASH_PREFIX + secrets.token_hex(6))
    os.mkdir(trash, 0o700)
    moved_out: list[str] = []
    moved_in: list[str] = []
    skip = {os.path.basename(staging), os.path.basename(trash)}
    try:
        for name in os.listdir(root):
            if name in skip:
                continue
            _make_movable(os.path.join(root, name))
            os.rename(os.path.join(root, name), os.path.join(trash, name))
            moved_out.append(name)
        for name in os.listdir(staging):
            os.rename(os.path.join(staging, name), os.path.join(root, name))
            moved_in.append(name)
    except OSError:
        for name in moved_in:
            os.rename(os.path.join(root, name), os.path.join(staging, name))
        for name in moved_out:
            os.rename(os.path.join(trash, name), os.path.join(root, name))
        os.rmdir(trash)
        raise
    _rmtree(trash)


def _make_movable(path: str) -> None:
    """Moving a directory to another parent needs write permission on it (its `..` changes)."""
    info = os.lstat(path)
    if stat.S_ISDIR(info.st_mode) and not info.st_mode & stat.S_IWUSR:
        os.chmod(path, stat.S_IMODE(info.st_mode) | stat.S_IWUSR)


def _rmtree(path: str) -> None:
    """Remove a tree we made, including read-only directories in it (made writable on the way)."""

    def fix(_func, failed, _exc):
        try:
            parent = os.path.dirname(failed)
            os.chmod(parent, 0o700)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, 0o700)
                _rmtree(failed)
            else:
                os.unlink(failed)
        except OSError:
            pass

    if os.path.lexists(path):
        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=fix)
        else:
            shutil.rmtree(path, onerror=fix)


def _remove_leftovers(root: str) -> None:
    """Staging and trash directories of an import that was killed before it cleaned up."""
    for name in os.listdir(root):
        if name.startswith(STAGING_PREFIX) or name.startswith(TRASH_PREFIX):
            _rmtree(os.path.join(root, name))


def import_from(roots: dict[str, str], source: int, max_bytes: int, max_entries: int) -> dict:
    """Read a tar.zst from descriptor `source`, verify it, and replace the roots' contents with it. Returns
    {"files", "bytes"}; raises ArchiveError (nothing changed) or OSError."""
    return extract_archive(_Importer(roots, max_bytes, max_entries), source)


def extract_archive(importer: _Importer, source: int) -> dict:
    """Decompress the tar.zst on descriptor `source` with zstd and let `importer` stage, check and commit it;
    anything short of a whole, valid stream discards the staging. Returns the importer's result."""
    zstd = subprocess.Popen(
        [ZSTD, "-q", "-d", "-c"], stdin=source, stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=_CHUNK
    )
    committed = False
    try:
        widen_pipe(zstd.stdout.fileno())
        importer.prepare()
        reader_eof = []
        try:
            result = importer.run(zstd.stdout, reader_eof)
        except ArchiveError:
            # the stream ended early: zstd's own complaint (damaged, truncated) says more than the tar parser's
            if reader_eof and zstd.wait() != 0:
                raise ArchiveError(f"the zstd stream is damaged or truncated ({_zstd_error(zstd)})") from None
            raise
        if zstd.wait() != 0:
            raise ArchiveError(f"the zstd stream is damaged or truncated ({_zstd_error(zstd)})")
        importer.commit()
        committed = True
        return result
    finally:
        if zstd.poll() is None:
            zstd.kill()
            zstd.wait()
        zstd.stdout.close()
        zstd.stderr.close()
        if not committed:
            importer.discard()


def _zstd_error(zstd: subprocess.Popen) -> str:
    text = zstd.stderr.read(4096).decode("utf-8", "replace").strip()
    return " ".join(text.split()) or f"zstd exit status {zstd.returncode}"


# --- the worker process ------------------------------------------------------------------------------------------


def _parse_roots(values: list[str]) -> list[tuple[str, str]]:
    roots = []
    for value in values:
        prefix, _, path = value.partition("=")
        roots.append((prefix, path))
    return roots


class _Terminated(Exception):
    pass


def _terminated(_signum, _frame):
    raise _Terminated()


def _error_result(code: str, message: str) -> dict:
    return {"error": code, "message": message}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flarebox_supervisor.archive")
    parser.add_argument("action", choices=("export", "import"))
    parser.add_argument("--root", action="append", default=[], help="PREFIX=DIR (workspace=…, home=…)")
    parser.add_argument("--max-bytes", type=int, default=0, help="import: the most bytes the files may hold")
    parser.add_argument("--max-entries", type=int, default=0, help="import: the most entries the archive may hold")
    args = parser.parse_args(argv)
    if args.action == "import" and (args.max_bytes <= 0 or args.max_entries <= 0):
        parser.error("an import needs --max-bytes and --max-entries")
    roots = _parse_roots(args.root)
    # SIGTERM (the supervisor giving up: a body over the limit, a client gone) unwinds through the cleanup that
    # stops zstd and removes an import's staging directories.
    signal.signal(signal.SIGTERM, _terminated)
    if args.action == "export":
        try:
            export_to(roots, sys.stdout.fileno())
        except (OSError, _Terminated) as exc:
            print(f"export failed: {exc!r}", file=sys.stderr)
            return 1
        return 0
    # import: the archive comes on stdin, the answer is one JSON line on stdout
    return answer_import(lambda: import_from(dict(roots), sys.stdin.fileno(), args.max_bytes, args.max_entries))


def answer_import(run_import) -> int:
    """Run an import and write its answer, one JSON line on stdout: its result, or the error it failed with."""
    try:
        result = run_import()
    except _Terminated:
        return 1
    except ArchiveError as exc:
        result = _error_result(exc.code, exc.message)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            result = _error_result(
                "storage_full", "the workspace's disk is full: nothing was imported and the files are untouched"
            )
        elif exc.errno == errno.ENAMETOOLONG:
            result = _error_result("invalid_archive", f"a member's path is too long for this filesystem ({exc})")
        else:
            result = _error_result("internal_error", f"the import failed: {exc}")
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


# --- the supervisor's side ---------------------------------------------------------------------------------------


def archive_roots(workdir: str, home: str) -> list[tuple[str, str]]:
    """The directories an archive holds: the workspace, and the sandbox user's home when it is a real directory of
    its own (not "/", not the workspace or one of its ancestors)."""
    roots = [("workspace", os.path.abspath(workdir))]
    home = os.path.abspath(home) if home else ""
    work = roots[0][1]
    if home and home != "/" and home != work and not work.startswith(home.rstrip("/") + "/") and os.path.isdir(home):
        roots.append(("home", home))
    return roots


STREAM_CHUNK = 1024 * 1024  # the supervisor's reads from a worker's stdout


def home_dir(identity_home: str, environ: dict | None = None) -> str:
    """The sandbox user's home; FLAREBOX_ARCHIVE_HOME overrides it (tests: the user's passwd home is elsewhere)."""
    env = os.environ if environ is None else environ
    return env.get("FLAREBOX_ARCHIVE_HOME") or identity_home


def import_limits(environ: dict | None = None) -> tuple[int, int]:
    """(max bytes, max entries) of an import: the protocol's, or lower ones an operator (or a test) sets with
    FLAREBOX_MAX_IMPORT_BYTES / FLAREBOX_MAX_IMPORT_ENTRIES."""
    from protocol import limits

    env = os.environ if environ is None else environ
    values = []
    for name, default in (
        ("FLAREBOX_MAX_IMPORT_BYTES", limits.MAX_IMPORT_BYTES),
        ("FLAREBOX_MAX_IMPORT_ENTRIES", limits.MAX_IMPORT_ENTRIES),
    ):
        raw = env.get(name)
        try:
            value = int(raw) if raw else default
        except ValueError:
            raise SystemExit(f"{name} must be an integer, got {raw!r}") from None
        if value <= 0:
            raise SystemExit(f"{name} must be > 0")
        values.append(min(value, default))
    return values[0], values[1]


WORKER = "flarebox_supervisor.archive"


def _worker_argv(action: str, roots: list[tuple[str, str]], extra: list[str] = (), module: str = WORKER) -> list[str]:
    flags = []
    if sys.flags.isolated:
        flags.append("-I")
    elif sys.flags.safe_path:
        flags.append("-P")
    if sys.dont_write_bytecode:
        flags.append("-B")
    if sys.flags.no_site:  # started without site (the standalone sandbox): the worker gets this interpreter's path
        run = f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
        boot = f"import sys; sys.path[:] = {sys.path!r}; import runpy; {run}"
        argv = [sys.executable, *flags, "-S", "-c", boot, action]
    else:
        argv = [sys.executable, *flags, "-m", module, action]
    for prefix, path in roots:
        argv += ["--root", f"{prefix}={path}"]
    return argv + list(extra)


def _worker_env() -> dict[str, str]:
    """Only what Python needs to find the package: the supervisor's own environment holds secrets, and the worker
    runs as the sandbox user, who can read a process's environment."""
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    for name in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


async def start_worker(
    identity, action: str, roots: list[tuple[str, str]], extra: list[str] = (), module: str = WORKER, **pipes
):
    """Start `python -m MODULE ACTION` (this module's worker, or another one's) as the sandbox user
    (identity.spawn)."""
    import asyncio  # here, not at the top: the worker process has no use for it (~30 ms of its start)

    argv, kwargs = identity.spawn(_worker_argv(action, roots, extra, module))
    return await asyncio.create_subprocess_exec(
        *argv, env=_worker_env(), cwd="/", stderr=asyncio.subprocess.PIPE, limit=STREAM_CHUNK, **pipes, **kwargs
    )


async def stop_worker(proc) -> None:
    """SIGTERM first (the worker then stops zstd and removes an import's staging directories), SIGKILL if it does
    not end soon. Its stdin is closed and its stdout drained: asyncio's wait() returns only once every pipe of the
    process is closed, and a stdout left paused (its reader full) would never see the end."""
    import asyncio

    if proc.returncode is None:
        try:
            proc.terminate()
        except ProcessLookupError:
            pass
    if proc.stdin is not None:
        proc.stdin.close()

    async def drain() -> None:
        if proc.stdout is not None:
            while await proc.stdout.read(STREAM_CHUNK):
                pass
        await proc.wait()

    try:
        async with asyncio.timeout(10):
            await drain()
    except TimeoutError:
        try:
            proc.kill()
        except ProcessLookupError:
            pass
        async with asyncio.timeout(10):
            await drain()


def check_import_result(answer: bytes, fields: tuple[str, ...] = ("files", "bytes")) -> dict:
    """The worker's one-line JSON answer as the route's body (its counts `fields`), or its error as a
    ProtocolError."""
    from protocol.errors import ERRORS, ProtocolError

    try:
        result = json.loads(answer)
    except ValueError:
        result = None
    if not isinstance(result, dict):
        raise ProtocolError("internal_error", "the import worker gave no answer")
    if "error" in result:
        code = result["error"] if result["error"] in ERRORS else "internal_error"
        raise ProtocolError(code, str(result.get("message", ""))[:2000])
    try:
        return {field: int(result[field]) for field in fields}
    except (KeyError, TypeError, ValueError):
        raise ProtocolError("internal_error", "the import worker gave no answer") from None


if __name__ == "__main__":
    sys.exit(main())
