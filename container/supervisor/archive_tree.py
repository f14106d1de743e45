"""Directory archives for GET and PUT /files/archive (dirarchive.py): one directory's contents as a plain tar.zst.

Unlike a workspace export (archive.py) the archive is what `tar --zstd -c -C DIR .` makes and `tar --zstd -x` reads:
members named relative to the directory, no manifest. The worker (`python -m flarebox_supervisor.archive_tree
export|import --dir DIR`) runs with the sandbox user's rights and is built from archive.py's pieces: the exporter's
walk (never following a symlink below DIR, storing symlinks as links, skipping sockets, FIFOs, devices and what it
cannot read), zstd, the header reader, extraction into staging opened component by component with O_NOFOLLOW, and
the swap. DIR itself is resolved like any path of the API, with the user's rights; an upload never writes through a
symlink at DIR (refused: the directory it points to may be anywhere).

An upload may come from any tar writer (GNU tar, bsdtar, Python's tarfile), so it is read leniently where that is
safe — "./" prefixes, GNU long names, parents without a member of their own, hard links between its own files — and
refused as a whole where it is not: absolute names, ".." components, devices and FIFOs, a member below a symlink or a
file, hard links to anything but an earlier file, symlinks with an absolute target or one that climbs above DIR, paths
over the protocol's limit, more bytes or entries than the import limits. A symlink target may hold ".." only as
leading components: one after a name could climb out through another symlink (a/b → .., x → a/b, y → x/..), which
no check of a single target can see; with leading ones only, every link resolves inside DIR.

Commit: the archive is extracted into a hidden staging directory inside DIR (same filesystem), read to its end and
checked whole, then swapped in with archive._swap: DIR's old entries are renamed into a trash directory, the staged
ones up, the trash removed; a failed rename puts everything back. DIR stays the same inode — a mount point (the
workspace), the cwd of running processes, its owner and mode are kept — and only write access to DIR is needed, not
to its parent; an exchange of whole directories (renameat2 RENAME_EXCHANGE) would keep neither. The swap is a few
renames, not one instant: a reader during the commit may see a mix for that moment; any refusal, damage or failure
before it leaves DIR untouched. A DIR that does not exist is created (its parent must exist) and removed on failure.
"""

import argparse
import errno
import json
import os
import signal
import stat
import sys
import tarfile
import time

from flarebox_supervisor import archive
from flarebox_supervisor.archive import STAGING_PREFIX, TRASH_PREFIX, ArchiveError

MODULE = "flarebox_supervisor.archive_tree"
RESULT_FIELDS = ("files", "directories", "symlinks", "bytes")
_ROOT = "dir"  # the importer's one root
_KINDS = {
    tarfile.REGTYPE: "file",
    tarfile.AREGTYPE: "file",
    tarfile.DIRTYPE: "dir",
    tarfile.SYMTYPE: "symlink",
    tarfile.LNKTYPE: "hardlink",
}
_KINDS_TEXT = "files, directories, symlinks and hard links"
_COUNTED = {"file": "files", "hardlink": "files", "dir": "directories", "symlink": "symlinks"}
_NEW_DIR_MODE = 0o755  # DIR, or a parent the archive has no member for, as tar -x would make it


def _path_error(exc: OSError, path: str) -> ArchiveError:
    """The protocol error for DIR (or its parent) that cannot be opened or created."""
    reason = os.strerror(exc.errno or 0)
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return ArchiveError(f"no directory at {path} ({reason})", "file_not_found")
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return ArchiveError(f"the sandbox user may not access {path} ({reason})", "permission_denied")
    if exc.errno in (errno.ELOOP, errno.ENAMETOOLONG):
        return ArchiveError(f"cannot resolve {path} ({reason})", "invalid_path")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return ArchiveError(f"the disk is full: cannot create {path}", "storage_full")
    return ArchiveError(f"cannot open {path} ({reason})", "internal_error")


def _short(message: str, keep: int = 500) -> str:
    return message if len(message) <= keep else message[: keep - 40] + " … " + message[-37:]


def _not_a_directory(path: str, info: os.stat_result) -> ArchiveError:
    if stat.S_ISLNK(info.st_mode):
        return ArchiveError(
            f"{path} is a symlink: an upload never writes through one (give the real path)", "not_a_directory"
        )
    return ArchiveError(f"{path} is not a directory", "not_a_directory")


# --- export ------------------------------------------------------------------------------------------------------


class _TreeExporter(archive._Exporter):
    """The exporter's walk, with names relative to DIR and no manifest: nothing is kept per member. It stays on
    DIR's filesystem, as `tar --one-file-system` does: a mount point below DIR (/proc, /sys, /dev, the image's
    read-only /usr under `/`) is skipped, so an archive of `/` is the sandbox's own files, never a walk through the
    kernel's virtual files."""

    def __init__(self, out: int, device: int):
        super().__init__(out)
        self.device = device

    def record(self, entry: dict) -> None:
        pass

    def directory(self, dir_fd: int, name: str, path: str, exclude: set[tuple[int, int]]) -> None:
        if os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_dev != self.device:
            self.skip(path + "/", "another filesystem (a mount point): archive it by its own path")
            return
        super().directory(dir_fd, name, path, exclude)

    def finish(self) -> None:
        self.emit(bytes(2 * archive._BLOCK))  # the end-of-archive blocks
        self.flush()


def open_dir(path: str) -> int:
    """DIR opened for listing (following symlinks on the way, like any path of the API) before anything is
    written, so that a missing, unreadable or non-directory DIR is an error answer rather than a broken archive."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # never opens a device: checked first
    except NotADirectoryError as exc:
        try:
            info = os.stat(path)
        except OSError:
            raise _path_error(exc, path) from None  # a component on the way is not a directory
        raise _not_a_directory(path, info) from None
    except OSError as exc:
        raise _path_error(exc, path) from None


def export_dir(path: str, out: int) -> _TreeExporter:
    """Write DIR's contents as a tar.zst to the descriptor `out`."""
    fd = open_dir(path)
    exporter = None

    def produce(tar: int) -> None:
        nonlocal exporter
        exporter = _TreeExporter(tar, os.fstat(fd).st_dev)
        exporter.walk(fd, "", top=True, exclude=set())
        exporter.finish()

    try:
        archive.compress_to(out, produce)
    finally:
        os.close(fd)
    return exporter


def _skipped_note(exporter: _TreeExporter) -> str:
    shown = "; ".join(f"{item['path']}: {item['reason']}" for item in exporter.skipped[:5])
    return f"skipped {exporter.skipped_count} entries ({shown})"


# --- import: member checks -----------------------------------------------------------------------------------------


def _components(path: str) -> tuple[str, ...]:
    """A relative tar path's components, without "." and empty ones (a "./" prefix, a directory's trailing "/")."""
    return tuple(part for part in path.split("/") if part not in ("", "."))


def _shown(name: str) -> str:
    return repr(name if len(name) <= 200 else name[:200] + "…")


def member_parts(name: str, dir_bytes: int) -> tuple[str, ...]:
    """The member's path below DIR as components; () is DIR itself ("./"). `dir_bytes`: the length of DIR's path,
    which the member's full path must fit in the protocol's limit with."""
    if not name:
        raise ArchiveError("a member has an empty name")
    if "\0" in name:
        raise ArchiveError(f"member {_shown(name)}: the name contains NUL")
    if name.startswith("/"):
        raise ArchiveError(f"member {_shown(name)}: absolute names are not allowed")
    parts = _components(name)
    if ".." in parts:
        raise ArchiveError(f"member {_shown(name)}: '..' components are not allowed (they could leave the directory)")
    size = dir_bytes + 1 + len(os.fsencode("/".join(parts)))
    if size > archive._MAX_PATH_BYTES:
        raise ArchiveError(f"member {_shown(name)}: its path would be {size} bytes, over {archive._MAX_PATH_BYTES}")
    if any(len(os.fsencode(part)) > 255 for part in parts):
        raise ArchiveError(f"member {_shown(name)}: a path component is longer than 255 bytes")
    if parts and parts[0].startswith((STAGING_PREFIX, TRASH_PREFIX)):
        raise ArchiveError(f"member {_shown(name)}: that name is reserved for uploads in progress")
    return parts


def check_symlink(name: str, parts: tuple[str, ...], target: str) -> None:
    """Refuse a symlink whose target leaves DIR: absolute, climbing above it, or with a ".." after a name."""
    if not target or len(os.fsencode(target)) > archive._MAX_PATH_BYTES:
        limit = archive._MAX_PATH_BYTES
        raise ArchiveError(f"symlink {_shown(name)}: the target is empty or longer than {limit} bytes")
    link = f"symlink {_shown(name)} → {_shown(target)}"
    if target.startswith("/"):
        raise ArchiveError(f"{link}: the target leaves the directory (it is absolute)")
    steps = _components(target)
    ups = next((i for i, step in enumerate(steps) if step != ".."), len(steps))
    if ".." in steps[ups:]:
        raise ArchiveError(f"{link}: the target leaves the directory ('..' after a name could climb out via a link)")
    if ups > len(parts) - 1:
        raise ArchiveError(f"{link}: the target leaves the directory (it climbs above it)")


# --- import: extraction ------------------------------------------------------------------------------------------


class _TreeImporter(archive._Importer):
    """archive._Importer's staging, extraction and swap for one root, DIR, with a plain tar's members."""

    def __init__(self, path: str, max_bytes: int, max_entries: int):
        super().__init__({_ROOT: path}, max_bytes, max_entries)
        self.path = path
        self.dir_bytes = len(os.fsencode(path))
        self.created = False  # DIR made by this import: removed again unless it commits
        self.own: tuple[int, int] | None = None  # the "./" member's mode and mtime, for a DIR made here
        self.counts = dict.fromkeys(("files", "directories", "symlinks"), 0)
        self.entries = 0

    # staging ---------------------------------------------------------------------------------------------------

    def prepare(self) -> None:
        self._make_root()
        try:
            super().prepare()
        except PermissionError as exc:
            message = f"the sandbox user may not write in {self.path} ({exc.strerror})"
            raise ArchiveError(message, "permission_denied") from None
        except OSError as exc:  # a read-only filesystem (EROFS), a full disk: the staging directory cannot be made
            raise _path_error(exc, self.path) from None

    def _make_root(self) -> None:
        try:
            os.mkdir(self.path, 0o700)  # writable while staging; its mode is applied once it is filled
            self.created = True
            return
        except FileExistsError:
            pass
        except FileNotFoundError:
            parent = os.path.dirname(self.path)
            raise ArchiveError(f"{parent} does not exist: a new directory's parent must", "file_not_found") from None
        except OSError as exc:
            raise _path_error(exc, self.path) from None
        try:
            info = os.lstat(self.path)
        except OSError as exc:
            raise _path_error(exc, self.path) from None
        if not stat.S_ISDIR(info.st_mode):
            raise _not_a_directory(self.path, info)

    def discard(self) -> None:
        super().discard()
        if self.created:
            try:
                os.rmdir(self.path)
            except OSError:
                pass  # someone else put something in it meanwhile: theirs
            self.created = False

    def parent_fd(self, parts: tuple[str, ...]) -> int:
        try:
            return super().parent_fd(parts)
        except FileNotFoundError:
            self._make_parents(parts)
            return super().parent_fd(parts)

    def _make_parents(self, parts: tuple[str, ...]) -> None:
        """Directories an archive has no member for (`tar -c a/b/file` holds no a/ or a/b/), made as tar -x does."""
        fd = os.dup(self.staging_fd[_ROOT])
        try:
            for depth in range(1, len(parts) - 1):
                try:
                    os.mkdir(parts[depth], 0o700, dir_fd=fd)
                    self._count("dir")
                    self.dirs.append((parts[: depth + 1], _NEW_DIR_MODE, int(time.time())))
                except FileExistsError:
                    pass  # made earlier; opened below without following a symlink, as any parent
                next_fd = os.open(parts[depth], archive._DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = next_fd
        finally:
            os.close(fd)

    def _count(self, kind: str) -> None:
        if self.entries >= self.max_entries:
            raise ArchiveError(f"the archive has more than {self.max_entries} entries", "payload_too_large")
        self.entries += 1
        self.counts[_COUNTED[kind]] += 1

    # reading ---------------------------------------------------------------------------------------------------

    def _run(self, reader, stream) -> dict:
        for head in archive._headers(reader, foreign=True):
            kind = archive._member_kind(head, _KINDS, _KINDS_TEXT)
            with archive._extracting(head.name):
                self._member(reader, head, kind)
        archive._check_trailer(stream)
        return {**self.counts, "bytes": self.total}

    def _member(self, reader, head: archive._Header, kind: str) -> None:
        name, mode = head.name, head.mode & archive._MODE_BITS
        parts = member_parts(name, self.dir_bytes)
        if not parts:
            if kind != "dir":
                raise ArchiveError(f"member {_shown(name)} names the directory itself but is a {kind}")
            self.own = (mode, head.mtime)
            return
        if kind == "file" and self.total + head.size > self.max_bytes:
            raise ArchiveError(f"the archive's files hold more than {self.max_bytes} bytes", "payload_too_large")
        if kind == "symlink":
            check_symlink(name, parts, head.target)
        staged = (_ROOT, *parts)
        try:
            if kind == "hardlink":
                self._link(name, staged, head.target)
            else:
                self.extract(reader, staged, kind, head._replace(mode=mode))
        except FileExistsError:
            if kind != "dir" or not self._is_dir(staged):
                raise ArchiveError(f"member {_shown(name)} appears twice") from None
            self.dirs.append((staged, mode, head.mtime))  # made earlier as the parent of a member: now its mode
            return
        except NotADirectoryError:
            # opening a parent with O_NOFOLLOW | O_DIRECTORY fails so on a symlink as on a file
            raise ArchiveError(f"member {_shown(name)} is below a symlink or a file member") from None
        self._count(kind)

    def _link(self, name: str, staged: tuple[str, ...], target: str) -> None:
        """A hard link to an earlier file member of the archive (a path below DIR, as tar records it)."""
        source = _components(target)
        link = f"hard link {_shown(name)} → {_shown(target)}"
        if target.startswith("/") or ".." in source or not source:
            raise ArchiveError(f"{link}: the target leaves the directory")
        try:
            # the base class's parent_fd: a missing parent of the target is not made, it is an error
            source_dir = os.dup(archive._Importer.parent_fd(self, (_ROOT, *source)))
        except OSError:
            raise ArchiveError(f"{link}: the target is not an earlier file member") from None
        try:
            info = os.stat(source[-1], dir_fd=source_dir, follow_symlinks=False)
            if not stat.S_ISREG(info.st_mode):
                raise ArchiveError(f"{link}: the target is not an earlier file member")
            target_dir = self.parent_fd(staged)
            os.link(source[-1], staged[-1], src_dir_fd=source_dir, dst_dir_fd=target_dir, follow_symlinks=False)
        except FileNotFoundError:
            raise ArchiveError(f"{link}: the target is not an earlier file member") from None
        finally:
            os.close(source_dir)

    def _is_dir(self, staged: tuple[str, ...]) -> bool:
        try:
            os.close(os.open(staged[-1], archive._DIR_FLAGS, dir_fd=self.parent_fd(staged)))
            return True
        except OSError:
            return False

    # committing ------------------------------------------------------------------------------------------------

    def commit(self) -> None:
        # a SIGTERM (the supervisor giving up) waits until the swap is done: one stopped halfway would leave a mix
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            super().commit()
            if self.created:
                mode, mtime = self.own or (_NEW_DIR_MODE, None)
                os.chmod(self.path, mode)
                if mtime is not None:
                    os.utime(self.path, (mtime, mtime))
                self.created = False  # in place: no longer this import's to remove
        except PermissionError as exc:
            # _swap put everything back: an entry of DIR that the sandbox user may not move (another user's)
            raise ArchiveError(
                f"cannot replace the contents of {self.path}: {exc.strerror} ({exc.filename}); nothing was changed",
                "permission_denied",
            ) from None
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def import_dir(path: str, source: int, max_bytes: int, max_entries: int) -> dict:
    """Replace DIR's contents by the tar.zst read from descriptor `source`. Returns the counts (RESULT_FIELDS);
    raises ArchiveError (nothing changed) or OSError."""
    return archive.extract_archive(_TreeImporter(path, max_bytes, max_entries), source)


# --- the worker process ------------------------------------------------------------------------------------------


def _export(path: str) -> int:
    try:
        exporter = export_dir(path, sys.stdout.fileno())
    except ArchiveError as exc:
        # nothing was written: the supervisor answers with this error instead of an archive
        # one short line: the supervisor keeps the first bytes of stderr, and a message may quote a 4096-byte path
        print(json.dumps(archive._error_result(exc.code, _short(exc.message)), ensure_ascii=False), file=sys.stderr)
        return 2
    except (OSError, archive._Terminated) as exc:
        print(f"export failed: {exc!r}", file=sys.stderr)
        return 1
    if exporter.skipped_count:
        print(_skipped_note(exporter), file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=MODULE)
    parser.add_argument("action", choices=("export", "import"))
    parser.add_argument("--dir", required=True, help="the directory (an absolute path)")
    parser.add_argument("--max-bytes", type=int, default=0, help="import: the most bytes the files may hold")
    parser.add_argument("--max-entries", type=int, default=0, help="import: the most entries the archive may hold")
    args = parser.parse_args(argv)
    if args.action == "import" and (args.max_bytes <= 0 or args.max_entries <= 0):
        parser.error("an import needs --max-bytes and --max-entries")
    # SIGTERM (the supervisor giving up) unwinds through the cleanup that stops zstd and removes the staging
    signal.signal(signal.SIGTERM, archive._terminated)
    if args.action == "export":
        return _export(args.dir)
    # the archive comes on stdin, the answer is one JSON line on stdout
    return archive.answer_import(lambda: import_dir(args.dir, sys.stdin.fileno(), args.max_bytes, args.max_entries))


if __name__ == "__main__":
    sys.exit(main())
