"""`flarebox cp`: one file between this machine and a workspace, streamed both ways, with progress on a terminal.

Uploads keep the file's permission bits and create a missing workspace; downloads go to a temporary file renamed
into place, so a failed one leaves the old file."""

import contextlib
import os
import re
import stat
import sys
import tempfile
import time
from pathlib import Path, PurePosixPath

from standalone.cli_support import FileError, UsageError, ensure_workspace

PROGRESS_MIN_BYTES = 1024 * 1024  # cp shows progress for files this large, when stderr is a terminal
PROGRESS_INTERVAL = 0.1
_REMOTE = re.compile(r"([a-z0-9][a-z0-9_.-]{0,62}):(.*)", re.DOTALL)


def _remote(spec: str) -> tuple[str, str] | None:
    """`WS:/abs/path` → (WS, path); anything else is a local path (write `./a:b` for a local name with a colon)."""
    if spec.startswith(("/", ".", "~")):
        return None
    match = _REMOTE.fullmatch(spec)
    return (match.group(1), match.group(2)) if match else None


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # not reached


class _Progress:
    """One line on stderr, redrawn in place: name, bytes so far / total, percent, rate."""

    def __init__(self, label: str, total: int):
        self.label, self.total, self.done = label, total, 0
        self.started = self.drawn = time.monotonic()
        self._draw()

    def add(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.drawn >= PROGRESS_INTERVAL:
            self.drawn = now
            self._draw()

    def _draw(self) -> None:
        percent = 100 * self.done // self.total if self.total else 100
        rate = self.done / max(time.monotonic() - self.started, 1e-3)
        sys.stderr.write(
            f"\r{self.label}  {_size(self.done)} / {_size(self.total)}  {percent:3d}%  {_size(rate)}/s\x1b[K"
        )
        sys.stderr.flush()

    def finish(self) -> None:
        self._draw()
        sys.stderr.write("\n")
        sys.stderr.flush()


def _progress_for(label: str, size: int) -> "_Progress | None":
    return _Progress(label, size) if size >= PROGRESS_MIN_BYTES and sys.stderr.isatty() else None


class _CountingReader:
    """The upload source as the client wants it (fileno/tell/read), counting what was read for the progress line."""

    def __init__(self, handle, progress: "_Progress | None"):
        self._handle, self._progress = handle, progress

    def fileno(self) -> int:
        return self._handle.fileno()

    def tell(self) -> int:
        return self._handle.tell()

    def read(self, n: int = -1) -> bytes:
        chunk = self._handle.read(n)
        if self._progress is not None:
            self._progress.add(len(chunk))
        return chunk


class _CountingWriter:
    def __init__(self, handle):
        self._handle = handle
        self.progress: _Progress | None = None

    def write(self, chunk: bytes) -> int:
        self._handle.write(chunk)
        if self.progress is not None:
            self.progress.add(len(chunk))
        return len(chunk)


def _file_error(err, ws: str, path: str) -> FileError:
    return FileError(f"{ws}:{path}: {err.code}: {err.message}")


def cp(client, args) -> int:
    source, destination = _remote(args.source), _remote(args.destination)
    if (source is None) == (destination is None):
        raise UsageError(
            "cp copies between this machine and a workspace: flarebox cp LOCAL WS:/abs/path, "
            "or flarebox cp WS:/abs/path LOCAL (write ./name for a local name with a colon)"
        )
    ws, path = source or destination
    if not path.startswith("/"):
        raise UsageError(f"paths inside a workspace are absolute: {ws}:/workspace/{path.lstrip('/') or 'FILE'}")
    if destination is not None:
        return _upload(client, args.namespace, Path(args.source), ws, path)
    return _download(client, args.namespace, ws, path, args.destination)


def _upload(client, ns: str, local: Path, ws: str, path: str) -> int:
    from flarebox_hermes.client import ApiError

    try:
        handle = open(local, "rb")  # noqa: SIM115 - closed below
    except IsADirectoryError:
        raise FileError(f"{local}: is a directory (flarebox cp copies one file at a time)") from None
    except OSError as err:
        raise FileError(f"{local}: {err.strerror}") from None
    with handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise FileError(f"{local}: not a regular file")
        mode = stat.S_IMODE(info.st_mode) & 0o777  # an executable stays executable
        target = path + local.name if path.endswith("/") else path
        try:
            ensure_workspace(client, ns, ws)
        except ApiError as err:
            raise _file_error(err, ws, target) from None
        for attempt in (1, 2):
            handle.seek(0)
            progress = _progress_for(local.name, info.st_size)
            try:
                client.write_file(ns, ws, target, _CountingReader(handle, progress), mode=mode)
                return 0
            except ApiError as err:
                if err.code == "not_a_file" and attempt == 1 and not path.endswith("/"):
                    target = f"{path}/{local.name}"  # the target is a directory: copy into it, as cp does
                    continue
                raise _file_error(err, ws, target) from None
            finally:
                if progress is not None:
                    progress.finish()
    return 0  # not reached


def _download(client, ns: str, ws: str, path: str, dest: str) -> int:
    from flarebox_hermes.client import ApiError

    name = PurePosixPath(path).name
    writer = None

    def on_size(size: int) -> None:
        writer.progress = _progress_for(name, size)

    try:
        if dest == "-":
            writer = _CountingWriter(sys.stdout.buffer)
            client.read_file(ns, ws, path, writer, on_size=on_size)
            sys.stdout.buffer.flush()
            return 0
        target = Path(dest)
        if dest.endswith("/") or target.is_dir():
            if not name:
                raise FileError(f"{ws}:{path}: names no file")
            target = target / name
        if target.is_dir():
            raise FileError(f"{target}: is a directory")
        try:
            existing = target.stat().st_mode
            mode = stat.S_IMODE(existing)
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        # into a temporary file next to the target, renamed over it once complete: a failed or interrupted
        # download leaves the old file (or nothing), never a part
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent or ".")
        except OSError as err:
            raise FileError(f"{target.parent}: {err.strerror}") from None
        try:
            with os.fdopen(fd, "wb") as handle:
                writer = _CountingWriter(handle)
                client.read_file(ns, ws, path, writer, on_size=on_size)
            os.chmod(tmp, mode)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return 0
    except ApiError as err:
        raise _file_error(err, ws, path) from None
    finally:
        if writer is not None and writer.progress is not None:
            writer.progress.finish()
