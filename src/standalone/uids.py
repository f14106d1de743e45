"""Host uids for a root server's sandboxes: each workspace runs as its own host uid (= gid), so no two workspaces
share per-uid kernel objects (keyrings, quotas, /proc visibility, ...).

The server owns a block of RANGE_SIZE ids at a random block-aligned base in [2**28, 2**31): clear of system users
and of typical /etc/subuid ranges. The base is kept in `<data>/uid-range`; while serving, the server holds an
exclusive flock on `/run/flarebox/uid-ranges/<base>.lock`, so two servers on one host never share a block (the
kernel drops the lock when the server dies). Index i of the block is host uid base + i; `<data>/uid-next` is the
next index to hand out (index 0 is never used) and only grows, so an id is never reused, and a workspace keeps its
id in `<workspace dir>/uid`, which goes with its directory when it is deleted. With several worker processes
(`flarebox serve --workers N`) the parent holds the claim and the workers share it; `<data>/uid-next.lock` (an
flock held while the counter moves) keeps two workers from handing out one id. Stdlib only.
"""

import contextlib
import fcntl
import os
import secrets
import stat
import tempfile
import threading
from pathlib import Path

RANGE_SIZE = 1 << 20
RANGE_MIN = 1 << 28
RANGE_END = 1 << 31
CLAIM_DIR = Path("/run/flarebox/uid-ranges")
RANGE_FILE = "uid-range"
NEXT_FILE = "uid-next"
NEXT_LOCK = "uid-next.lock"
WORKSPACE_FILE = "uid"
LIVE_DIRS = ("workspace", "home", "tmp")
FRESH_TRIES = 64


class UidRangeError(RuntimeError):
    """The server's uid range cannot be used (corrupt, claimed by another server, or used up)."""


class UnsafeDirError(RuntimeError):
    """A directory the server must own privately is not a plain directory of its own (planted, or foreign)."""


def private_dir(path: Path, mode: int) -> Path:
    """Create `path` if needed and make sure it is a real directory owned by us (never a planted symlink), with
    `mode`. Checked and chmod-ed through one O_NOFOLLOW descriptor, so nothing can be swapped in between."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, mode)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise UnsafeDirError(f"{path} is not a plain directory ({err.strerror}); remove it") from None
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise UnsafeDirError(f"{path} is not owned by this server's user (uid {os.geteuid()}); remove it")
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    return Path(path)


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` (mode 0644) so that a crash leaves the old or the new content, never a mix."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.write(fd, text.encode())
        os.fchmod(fd, 0o644)
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.rename(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dir_fd)  # the rename is durable: an id handed out is never handed out again after a crash
    finally:
        os.close(dir_fd)


def read_base(path: Path) -> int:
    """The base persisted in `path`, validated: an int, block-aligned, inside [RANGE_MIN, RANGE_END)."""
    try:
        base = int(path.read_text().strip())
    except (OSError, ValueError) as err:
        raise UidRangeError(f"{path} does not hold a uid range base ({err}); fix or remove it") from None
    if base % RANGE_SIZE or not RANGE_MIN <= base < RANGE_END:
        raise UidRangeError(
            f"{path} holds {base}, not a multiple of {RANGE_SIZE} in [{RANGE_MIN}, {RANGE_END}); fix or remove it"
        )
    return base


def random_base() -> int:
    return (RANGE_MIN // RANGE_SIZE + secrets.randbelow((RANGE_END - RANGE_MIN) // RANGE_SIZE)) * RANGE_SIZE


def describe(base: int) -> str:
    return f"{base}-{base + RANGE_SIZE - 1}"


class RangeClaimed(UidRangeError):
    """Another live process holds the claim on this base."""


def claim(claim_dir: Path, base: int, data_dir: Path) -> int:
    """Take the host-wide claim on `base`: an open descriptor holding an exclusive flock, with our data dir written
    in it (so a colliding server can say whose range it is). Raises RangeClaimed when another process holds it."""
    private_dir(claim_dir.parent, 0o755)
    private_dir(claim_dir, 0o700)
    fd = os.open(claim_dir / f"{base}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 4096).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RangeClaimed(
            f"another flarebox server on this host (data dir {holder}) uses uid range {describe(base)}; stop it, "
            f"or remove {Path(data_dir) / RANGE_FILE} of one of the two servers (it then picks a new range, and "
            "its workspaces get new uids at their next start)"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{data_dir}\n".encode(), 0)
    return fd


class UidRange:
    """The server's block of host ids, claimed from construction until close() (or the process's death)."""

    def __init__(self, data_dir: Path, claim_dir: Path = CLAIM_DIR):
        self.data_dir = Path(data_dir)
        self.claim_dir = Path(claim_dir)
        self._lock = threading.Lock()
        range_file = self.data_dir / RANGE_FILE
        if os.path.lexists(range_file):
            self.base = read_base(range_file)
            self._claim = claim(self.claim_dir, self.base, self.data_dir)
        else:
            self.base, self._claim = self._claim_fresh()
            write_atomic(range_file, f"{self.base}\n")  # only once claimed: a first start never collides

    def _claim_fresh(self) -> tuple[int, int]:
        for _ in range(FRESH_TRIES):
            base = random_base()
            with contextlib.suppress(RangeClaimed):
                return base, claim(self.claim_dir, base, self.data_dir)
        raise UidRangeError(f"no free uid range found in {self.claim_dir} after {FRESH_TRIES} tries")

    def close(self) -> None:
        if self._claim >= 0:
            os.close(self._claim)  # releases the flock; the file stays (unlinking it would race a new claimant)
            self._claim = -1

    def contains(self, uid: int) -> bool:
        return self.base < uid < self.base + RANGE_SIZE  # index 0 is never handed out

    def allocate(self) -> int:
        """A host uid never handed out before; the counter is durable before the id is returned."""
        path = self.data_dir / NEXT_FILE
        with self._lock, _flocked(self.data_dir / NEXT_LOCK):
            try:
                index = int(path.read_text().strip()) if os.path.lexists(path) else 1
            except (OSError, ValueError) as err:
                raise UidRangeError(f"{path} does not hold a uid index ({err}); fix it") from None
            if not 1 <= index <= RANGE_SIZE:
                raise UidRangeError(f"{path} holds {index}, outside [1, {RANGE_SIZE}]; fix it")
            if index == RANGE_SIZE:
                raise UidRangeError(
                    f"all {RANGE_SIZE - 1} host uids of range {describe(self.base)} are used (uids are never "
                    "reused); move the workspaces to a new data dir"
                )
            write_atomic(path, f"{index + 1}\n")
            return self.base + index

    def uid_for(self, workspace_dir: Path) -> int:
        """The workspace's host uid: the one kept in its directory, else a new one (kept there from now on). A
        stored uid outside this range (the range was changed) is replaced: adopt_tree moves the files over."""
        path = Path(workspace_dir) / WORKSPACE_FILE
        with contextlib.suppress(OSError, ValueError):
            uid = int(path.read_text().strip())
            if self.contains(uid):
                return uid
        uid = self.allocate()
        write_atomic(path, f"{uid}\n")
        return uid


@contextlib.contextmanager
def _flocked(path: Path):
    """An exclusive flock on `path` (created if needed) for the duration: one process at a time."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # drops the lock


def _owned_dir(path: Path, uid: int, gid: int) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(st.st_mode) and (st.st_uid, st.st_gid) == (uid, gid)


def adopt_tree(root: Path, uid: int, gid: int) -> None:
    """Give every entry of a workspace's live files to (uid, gid): files of a workspace from before per-workspace
    uids, or restored from an older snapshot (the archive keeps numeric owners). The sandbox can only ever own its
    files as its one uid, so all of them become that uid. Symlinks are changed themselves, never followed. The live
    top dirs go last: when they already belong to `uid` (the common case) there is nothing to do and no walk, and an
    interrupted adoption is finished at the next start. Root only; nothing of the workspace's may run meanwhile (the
    sandbox is stopped, or holds only its supervisor before the first command: restoring.py)."""
    tops = [os.path.join(root, name) for name in LIVE_DIRS]
    if all(_owned_dir(Path(top), uid, gid) for top in tops):
        return
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if path not in tops:
                os.lchown(path, uid, gid)
    for top in tops:
        with contextlib.suppress(FileNotFoundError):
            os.lchown(top, uid, gid)
