"""The file operations behind GET/PUT /files, as plain functions that run with the caller's own rights.

They are executed either in the supervisor itself (when it is unprivileged) or inside the file agent, a process
running as the sandbox user (see agent.py), so the kernel's permission checks — symlinks included — are the sandbox
user's. Each returns a JSON-able result and possibly an open file descriptor.
"""

import errno
import os
import stat

from protocol.errors import ProtocolError

_OPEN_FLAGS = os.O_CLOEXEC | os.O_NOCTTY


def _fail(exc: OSError, what: str) -> ProtocolError:
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return ProtocolError("file_not_found", f"no file at that path ({what})")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ProtocolError("permission_denied", f"the sandbox user may not {what} that path")
    if exc.errno in (errno.ELOOP, errno.ENAMETOOLONG):
        return ProtocolError("invalid_path", f"cannot resolve that path ({os.strerror(exc.errno)})")
    if exc.errno == errno.EISDIR:
        return ProtocolError("not_a_file", "the path is a directory")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ProtocolError("storage_full", f"the workspace's disk is full: cannot {what} that path; free space")
    return ProtocolError("internal_error", f"cannot {what} that path ({os.strerror(exc.errno or 0)})")


def _not_a_file(info: os.stat_result) -> ProtocolError:
    what = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file (a device, socket or FIFO)"
    return ProtocolError("not_a_file", f"the path is {what}")


def open_read(path: str) -> tuple[dict, int]:
    """Open a regular file for reading. Checked before opening (opening a device can have effects, a socket cannot
    be opened at all) and again after (the path may have changed); O_NONBLOCK keeps a FIFO from hanging us."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise _not_a_file(info)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _OPEN_FLAGS)
    except OSError as exc:
        raise _fail(exc, "read") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ProtocolError("not_a_file", "the path is not a regular file")
    os.set_blocking(fd, True)
    return {"size": info.st_size}, fd


def create_temp(path: str) -> tuple[dict, int]:
    """Create parents, then a new temp file beside the target (same filesystem, so the final rename is atomic)."""
    parent, name = os.path.split(path)
    if not name:
        raise ProtocolError("not_a_file", "the path names a directory")
    try:
        os.makedirs(parent, mode=0o755, exist_ok=True)
    except FileExistsError:
        raise ProtocolError("not_a_file", "a parent of the path is not a directory") from None
    except NotADirectoryError:
        raise ProtocolError("not_a_file", "a parent of the path is not a directory") from None
    except OSError as exc:
        raise _fail(exc, "create") from None
    try:
        info = os.stat(path)
    except OSError:
        info = None  # missing (or unreadable: the rename below decides)
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise _not_a_file(info)  # renaming over a device, socket or FIFO would replace it (or fail with EBUSY)
    temp = os.path.join(parent, f".{name[:200]}.flarebox-{os.urandom(6).hex()}.tmp")
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS, 0o600)
    except OSError as exc:
        raise _fail(exc, "write") from None
    return {"temp": temp}, fd


def commit(temp: str, path: str, mode: int) -> tuple[dict, None]:
    try:
        os.chmod(temp, mode)
        os.rename(temp, path)
    except OSError as exc:
        _discard(temp)
        if exc.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
            raise ProtocolError("not_a_file", "the path is a directory") from None
        if exc.errno == errno.EBUSY:
            raise ProtocolError("permission_denied", "that path is a mount point and cannot be replaced") from None
        raise _fail(exc, "write") from None
    return {}, None


def abort(temp: str) -> tuple[dict, None]:
    _discard(temp)
    return {}, None


def _discard(temp: str) -> None:
    try:
        os.unlink(temp)
    except OSError:
        pass


OPERATIONS = {"open_read": open_read, "create_temp": create_temp, "commit": commit, "abort": abort}
