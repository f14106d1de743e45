"""The file tree operations behind list, stat, delete, move and mkdir, run with the sandbox user's rights (agent.py).

Like fileops.py, they run in the file agent (or in-process when the supervisor is unprivileged), so the kernel's
permission checks and symlink resolution are the sandbox user's. On top of that:

- A listing never follows a symlink below the listed directory: entries are lstat'ed, and subdirectories are opened
  relative to their parent's descriptor with O_NOFOLLOW, so a symlink swapped in mid-walk is not descended either.
  The listed path itself is resolved like every other file route's path.
- A listing's order is depth first, each directory's children sorted by the bytes of their names, a directory
  before its contents. A page's cursor is the relative path of its last entry; the next page walks down that path
  again, skipping whatever sorts before it in each directory, so no page is ever built from the ones before it.
  Memory holds the sorted names of the directories on the current path (at most MAX_LIST_DEPTH) and the page.
- A page can hold 10,000 entries, far more than one message of the agent's socket (64 KiB), so it comes back in a
  memfd passed with the small answer, the way open_read passes a file.
- Names that are not valid UTF-8 cannot be named by any request (paths are UTF-8) and cannot be put in JSON, so a
  listing skips them (and what is below them); a symlink target that is not UTF-8 is shown with U+FFFD for the
  undecodable bytes.
- Delete and move refuse /, the workspace directory, the sandbox user's home and every directory holding one of
  them: by their (normalized) names, and by device and inode, which catches any other name for them.
- A recursive delete is shutil.rmtree, which works on directory descriptors on Linux and never follows a symlink.
  A move without overwrite is renameat2(RENAME_NOREPLACE), so a target that appears meanwhile is never replaced;
  where libc or the filesystem lacks it, check-then-rename (a target created in between would be replaced).
"""

import bisect
import contextlib
import ctypes
import datetime
import errno
import itertools
import json
import os
import shutil
import stat
import sys

from flarebox_supervisor.fileops import _fail
from protocol.errors import ProtocolError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_KINDS = ((stat.S_ISREG, "file"), (stat.S_ISDIR, "directory"), (stat.S_ISLNK, "symlink"))
_PROTECTED = (
    "is /, the workspace directory, the sandbox user's home or a directory that holds one of them, so it cannot be"
    " deleted, moved or replaced; delete or move what is inside it instead"
)


# --- entries ----------------------------------------------------------------------------------------------------


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "other")


# The wire's timestamps have four-digit years; a file's mtime is the sandbox user's to set (tmpfs keeps 64-bit
# seconds), so one outside years 1–9999 is shown as the nearest end of that range rather than breaking the answer.
_FIRST_SECOND = -62135596800  # 0001-01-01T00:00:00Z
_LAST_SECOND = 253402300799  # 9999-12-31T23:59:59Z


def _mtime(ns: int) -> str:
    seconds, nanos = divmod(ns, 10**9)
    if not _FIRST_SECOND <= seconds <= _LAST_SECOND:
        seconds, nanos = (_FIRST_SECOND, 0) if seconds < _FIRST_SECOND else (_LAST_SECOND, 999_999_999)
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
    return f"{moment.year:04d}" + moment.strftime("-%m-%dT%H:%M:%S") + f".{nanos // 10**6:03d}Z"


def _entry(path: str, info: os.stat_result, target: bytes | None) -> dict:
    entry = {
        "path": path,
        "name": os.path.basename(path) or path,  # "/" is its own name
        "type": _kind(info.st_mode),
        "size": info.st_size,
        "mode": f"{stat.S_IMODE(info.st_mode):04o}",
        "mtime": _mtime(info.st_mtime_ns),
    }
    if target is not None:
        entry["target"] = target.decode("utf-8", "replace")
    return entry


def stat_entry(path: str) -> tuple[dict, None]:
    try:
        info = os.lstat(path)
        target = os.readlink(os.fsencode(path)) if stat.S_ISLNK(info.st_mode) else None
    except OSError as exc:
        raise _fail(exc, "read") from None
    return {"entry": _entry(path, info, target)}, None


# --- listing ----------------------------------------------------------------------------------------------------


def list_page(path: str, depth: int, limit: int, cursor: str | None) -> tuple[dict, int]:
    """One page of the tree below `path`: the entries go into a memfd (see the module docstring), the cursor here."""
    after = _cursor_parts(cursor)
    top = _open_listed(path)
    try:
        page, next_cursor = _page(top, path, depth, limit, after)
    finally:
        os.close(top)
    return {"cursor": next_cursor}, _memfd(json.dumps(page).encode())


def _cursor_parts(cursor: str | None) -> list[bytes]:
    if cursor is None:
        return []
    try:
        return [part.encode() for part in cursor.split("/")]
    except UnicodeEncodeError:
        raise ProtocolError("invalid_query", "cursor must be the `cursor` of a previous page") from None


def _open_listed(path: str) -> int:
    try:
        return os.open(path, _DIR_FLAGS)
    except NotADirectoryError:
        pass  # the path, or one of its parents, is not a directory: stat says which
    except OSError as exc:
        raise _fail(exc, "list") from None
    try:
        info = os.stat(path)
    except OSError as exc:
        raise _fail(exc, "list") from None
    raise ProtocolError(
        "not_a_directory",
        f"{path} is a {_kind(info.st_mode)}, not a directory: GET /files/stat describes it, GET /files reads a file",
    )


def _page(top: int, path: str, depth: int, limit: int, after: list[bytes]) -> tuple[list[dict], str | None]:
    # one entry more than the page: whether it exists says whether another page follows
    with contextlib.closing(_walk(top, path, "", depth, after)) as walk:
        found = list(itertools.islice(walk, limit + 1))
    page = found[:limit]
    next_cursor = page[-1][0] if len(found) > limit else None
    return [entry for _, entry in page], next_cursor


def _walk(fd: int, top: str, prefix: str, levels: int, after: list[bytes]):
    """Yield (relative path, entry) for the tree below the open directory `fd`, strictly after the relative path
    `after` (split into names), down to `levels` levels."""
    names = sorted(map(os.fsencode, os.listdir(fd)))
    start = 0
    if after:
        start = bisect.bisect_right(names, after[0])
        if start and names[start - 1] == after[0]:  # the cursor passed through (or ended at) this name
            yield from _descend(fd, top, f"{prefix}{after[0].decode()}/", after[0], levels, after[1:])
    for index in range(start, len(names)):
        name = names[index]
        listed = _listed(fd, top, prefix, name)
        if listed is None:
            continue
        yield listed
        if listed[1]["type"] == "directory":
            yield from _descend(fd, top, f"{listed[0]}/", name, levels, [])


def _descend(fd: int, top: str, prefix: str, name: bytes, levels: int, after: list[bytes]):
    if levels <= 1:
        return
    try:
        # O_NOFOLLOW: never into a symlink, even one that replaced the directory since it was lstat'ed
        sub = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
    except OSError:
        return  # unreadable, gone, or not a directory (any more): listed, not descended
    try:
        yield from _walk(sub, top, prefix, levels - 1, after)
    finally:
        os.close(sub)


def _listed(fd: int, top: str, prefix: str, name: bytes) -> tuple[str, dict] | None:
    try:
        relative = prefix + name.decode()
    except UnicodeDecodeError:
        return None  # not UTF-8: skipped (see the module docstring)
    try:
        info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        target = os.readlink(name, dir_fd=fd) if stat.S_ISLNK(info.st_mode) else None
    except OSError:
        return None  # removed since the directory was read, or the directory is readable but not searchable
    return relative, _entry(os.path.join(top, relative), info, target)


def _memfd(data: bytes) -> int:
    fd = os.memfd_create("flarebox-list", os.MFD_CLOEXEC)
    try:
        with open(fd, "wb", closefd=False) as page:
            page.write(data)
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


# --- protected directories --------------------------------------------------------------------------------------


def _protected_error(path: str) -> ProtocolError:
    return ProtocolError("path_protected", f"{path} {_PROTECTED}")


def _protected_ids(protected: list[str]) -> set[tuple[int, int]]:
    """(st_dev, st_ino) of each protected directory and every directory above it, as the kernel resolves them."""
    ids: set[tuple[int, int]] = set()
    for path in protected:
        while len(path) < 8192:  # "/a/b/.." grows by 3 bytes a level: far more levels than a path can have
            try:
                info = os.stat(path)
            except OSError:
                break
            if (info.st_dev, info.st_ino) in ids:
                break  # reached a directory counted already (/ is its own parent)
            ids.add((info.st_dev, info.st_ino))
            path = os.path.join(path, "..")
    return ids


def _protected_lstat(path: str, protected: list[str], what: str) -> os.stat_result | None:
    """lstat a path about to be deleted, moved or replaced (None when it does not exist), refusing a protected one:
    by its normalized name first, then by identity."""
    if any(path == other or other.startswith(path.rstrip("/") + "/") for other in protected):
        raise _protected_error(path)
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise _fail(exc, what) from None
    if stat.S_ISDIR(info.st_mode) and (info.st_dev, info.st_ino) in _protected_ids(protected):
        raise _protected_error(path)
    return info


# --- delete -----------------------------------------------------------------------------------------------------


def remove(path: str, recursive: bool, protected: list[str]) -> tuple[dict, None]:
    """Unlink a file or symlink (never its target), remove an empty directory, or a whole tree with `recursive`."""
    info = _protected_lstat(path, protected, "delete")
    if info is None:
        raise ProtocolError("file_not_found", f"nothing exists at {path}, so there is nothing to delete")
    try:
        if not stat.S_ISDIR(info.st_mode):
            os.unlink(path)
        elif recursive:
            _rmtree(path)
        else:
            os.rmdir(path)
    except OSError as exc:
        raise _delete_failed(exc, path) from None
    return {}, None


def _rmtree(path: str) -> None:
    """shutil.rmtree works on directory descriptors on Linux (rmtree.avoids_symlink_attacks): it unlinks symlinks
    instead of following them, even one swapped in mid-walk. It stops at the first failure."""

    def failed(function, name: str, exc: OSError) -> None:
        if isinstance(exc, FileNotFoundError) and name != path:
            return  # removed by someone else meanwhile
        raise _delete_failed(exc, name)

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=failed)
    else:
        shutil.rmtree(path, onerror=lambda function, name, info: failed(function, name, info[1]))


def _delete_failed(exc: OSError, path: str) -> ProtocolError:
    if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
        return ProtocolError(
            "directory_not_empty", f"{path} is not empty: send recursive=true to delete it with what it holds"
        )
    if exc.errno == errno.EBUSY:
        return ProtocolError("permission_denied", f"{path} is a mount point (or in use) and cannot be deleted")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return ProtocolError(
            "permission_denied",
            f"the sandbox user may not delete {path} (deleting needs write access to its directory); in a recursive"
            " delete, what came before it is deleted already",
        )
    return _fail(exc, "delete")


# --- move -------------------------------------------------------------------------------------------------------

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)  # glibc 2.28 and later
if _renameat2 is not None:
    _renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    _renameat2.restype = ctypes.c_int


def _rename_noreplace(source: str, target: str) -> None:
    """rename(2) that fails with EEXIST instead of replacing the target, atomically where the kernel, the
    filesystem and libc allow (renameat2 RENAME_NOREPLACE); otherwise check, then rename."""
    if _renameat2 is not None:
        if _renameat2(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), _RENAME_NOREPLACE) == 0:
            return
        code = ctypes.get_errno()
        # EINVAL is also a directory moved into itself: the plain rename below reports that again
        if code not in (errno.EINVAL, errno.ENOSYS):
            raise OSError(code, os.strerror(code), source, None, target)
    if os.path.lexists(target):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), target)
    os.rename(source, target)


def move(source: str, target: str, overwrite: bool, protected: list[str]) -> tuple[dict, None]:
    """Rename within one filesystem; a target is replaced only with `overwrite`, and never by another kind."""
    moved = _protected_lstat(source, protected, "move")
    if moved is None:
        raise ProtocolError("file_not_found", f"nothing exists at {source}, so there is nothing to move")
    replaced = _protected_lstat(target, protected, "replace")
    if source == target or (replaced is not None and os.path.samestat(moved, replaced)):
        raise ProtocolError("invalid_move", f"{source} and {target} are the same file; nothing was moved")
    if stat.S_ISDIR(moved.st_mode) and target.startswith(source + "/"):
        raise ProtocolError("invalid_move", f"{target} is inside {source}: a directory cannot be moved into itself")
    if replaced is not None:
        _check_replace(target, moved, replaced, overwrite)
    try:
        if overwrite:
            os.rename(source, target)
        else:
            _rename_noreplace(source, target)
    except OSError as exc:
        raise _move_failed(exc, source, target, overwrite) from None
    return {}, None


def _check_replace(target: str, moved: os.stat_result, replaced: os.stat_result, overwrite: bool) -> None:
    if not overwrite:
        raise ProtocolError("file_exists", f"{target} already exists: send overwrite=true to replace it")
    if stat.S_ISDIR(replaced.st_mode) and not stat.S_ISDIR(moved.st_mode):
        raise ProtocolError(
            "file_exists",
            f"{target} is a directory, which only a directory can replace: delete it first, or move into it"
            f" by naming a path inside it",
        )
    if stat.S_ISDIR(moved.st_mode) and not stat.S_ISDIR(replaced.st_mode):
        raise ProtocolError(
            "file_exists", f"{target} is not a directory, so a directory cannot replace it: delete it first"
        )


def _move_failed(exc: OSError, source: str, target: str, overwrite: bool) -> ProtocolError:
    code = exc.errno
    if code in (errno.EEXIST, errno.ENOTEMPTY):
        if overwrite:
            return ProtocolError(
                "directory_not_empty",
                f"{target} is a directory that is not empty: delete it first (DELETE /files?recursive=true)",
            )
        return ProtocolError("file_exists", f"{target} already exists: send overwrite=true to replace it")
    if code == errno.EXDEV:
        return ProtocolError(
            "invalid_move",
            f"{source} and {target} are on different filesystems, and a move must stay on one: copy it instead"
            " (GET, then PUT /files) and delete the original",
        )
    if code == errno.EINVAL:
        return ProtocolError("invalid_move", f"{target} is inside {source}: a directory cannot be moved into itself")
    if code == errno.EBUSY:
        return ProtocolError("permission_denied", f"{source} or {target} is a mount point and cannot be moved")
    if code in (errno.ENOENT, errno.ENOTDIR):
        if not os.path.lexists(source):
            return ProtocolError("file_not_found", f"nothing exists at {source}, so there is nothing to move")
        return ProtocolError(
            "file_not_found",
            f"{os.path.dirname(target)} is not an existing directory: create it first (POST /files/mkdir)",
        )
    if code == errno.EISDIR:
        return ProtocolError("file_exists", f"{target} is a directory, which only a directory can replace")
    return _fail(exc, "move")


# --- mkdir ------------------------------------------------------------------------------------------------------


def make_dir(path: str, parents: bool, mode: int) -> tuple[dict, None]:
    """mkdir, or mkdir -p with `parents`; every directory it creates gets `mode` exactly (whatever the umask)."""
    try:
        existing, info, missing = _missing_dirs(path)
    except OSError as exc:
        raise _fail(exc, "create") from None
    if not missing:
        if stat.S_ISDIR(info.st_mode) and parents:
            return {"created": False}, None
        raise _exists(path, info)
    if not stat.S_ISDIR(info.st_mode):
        raise ProtocolError("not_a_directory", f"{existing} is not a directory, so nothing can be created in it")
    if len(missing) > 1 and not parents:
        raise ProtocolError(
            "file_not_found",
            f"the directory {os.path.dirname(path)} does not exist: send parents=true to create it as well",
        )
    try:
        created = _create(missing, parents, mode)
    except FileExistsError:
        raise ProtocolError("file_exists", f"something (perhaps a broken symlink) already exists at {path}") from None
    except OSError as exc:
        raise _fail(exc, "create") from None
    return {"created": path in created}, None


def _missing_dirs(path: str) -> tuple[str, os.stat_result, list[str]]:
    """The deepest existing path of `path` and its parents (stat: a symlink to a directory counts, as in mkdir -p),
    and the paths below it that are missing, top first."""
    missing: list[str] = []
    while True:
        try:
            return path, os.stat(path), missing[::-1]
        except (FileNotFoundError, NotADirectoryError):
            missing.append(path)
            path = os.path.dirname(path)


def _exists(path: str, info: os.stat_result) -> ProtocolError:
    if stat.S_ISDIR(info.st_mode):
        return ProtocolError(
            "file_exists", f"{path} already exists as a directory: send parents=true to accept an existing one"
        )
    return ProtocolError("file_exists", f"{path} already exists and is a {_kind(info.st_mode)}, not a directory")


def _create(missing: list[str], parents: bool, mode: int) -> list[str]:
    created = []
    for directory in missing:
        try:
            os.mkdir(directory, 0o700)  # private until its mode is set below
        except FileExistsError:
            if (parents or directory != missing[-1]) and os.path.isdir(directory):
                continue  # created by someone else meanwhile
            raise
        created.append(directory)
    # the umask cannot narrow a chmod; deepest first, as a mode without search permission would block the way down
    for directory in reversed(created):
        os.chmod(directory, mode)
    return created


OPERATIONS = {
    "tree_list": list_page,
    "tree_stat": stat_entry,
    "tree_remove": remove,
    "tree_move": move,
    "tree_mkdir": make_dir,
}
