"""On-disk snapshot store of the standalone runtime: tar+zstd archives, full or incremental, one manifest each.

Layout: `<root>/<namespace>/<workspace>/<id>.tar.zst` and `<id>.json`. The archive is written under a `.tmp-` name
while its sha256 is computed from the bytes zstd writes, fsynced and renamed; the manifest is written the same way and
last, so it is the commit point: an archive without a manifest, or any `.tmp-` file, is a crash leftover that the
store ignores and removes on startup. A restore runs `zstd -d | tar -x` into a fresh directory next to the target
while it hashes the archive in parallel, and swaps that directory in only when every checksum matched and both tools
succeeded, so a damaged snapshot never replaces anything.

Incremental saves use GNU tar's listed-incremental format (`-g SNAR`), a mechanism tar has kept for decades, rather
than a format of our own. A save given a `base_dir` (a directory of the caller's, outside anything a sandbox
reaches) keeps there the snapshot file ("snar") that describes the live tree as of its newest save, named
`<snapshot id>.snar`; the next save of the same tree is then a level-N increment whose manifest names that snapshot
as its `parent`: it holds the files whose ctime moved since (a ctime cannot be set back by the sandbox) plus, for
every directory, the list of its entries, so a restore (`tar -G`, extracting each link from the full base up) also
applies deletions. `-G` stats every entry of the tree per link, so a save compares its snar's entry lists with its
parent's and records in the manifest whether it `deletes` anything (a name gone, or turned between directory and
not); one that does not is extracted without -G, which then has nothing to remove. A restore makes new inodes and
ctimes, so the next save would dump everything: the caller `track()`s a restored tree (a stat-only walk,
`tar -g SNAR -cf /dev/null`) to make it the base again. Chains are bounded (MAX_CHAIN links, increments summing to
at most half of the base's size), beyond that a save is full.
GNU tar over restic or borg: tar and zstd are already what every snapshot is made with (and on every host), restores
stay plain streams at tar's speed, and neither of those tools is installed here.
While zstd writes an archive, what is already hashed is handed to writeback (sync_file_range), so the fsync that
commits it waits for the tail only.

Two normalisations of the snar (its documented format 2): every directory's device number is set to 0 and tar runs
with --no-check-device, which turns off tar's directory-rename detection — tar 1.34 replays a detected rename with
rename(2) and fails when the new name existed in the parent (`rm -r x && mv d x`), leaving such a chain
unrestorable; without it a renamed directory is simply saved again in full. And the snar's dump time (tar's start,
from a fine clock) becomes the ctime of a probe file made just before tar starts: file ctimes come from the kernel's
coarse clock, so a file changed in the same tick as a save's start could otherwise look older than that save and be
missed by the next increment (where the probe is on another filesystem than the tree, SNAR_MARGIN_NS earlier still).
Like every ctime-based backup, a system clock stepped backwards between two saves can hide changes from the second.

Deleting a snapshot that a later link depends on only unlists it (`"deleted": true` in its manifest); its archive
stays until no listed snapshot's chain needs it (removed by later deletes and at startup). `clone` hard-links every
archive of a chain into another workspace (a fork).

GNU tar and zstd do the work (multithreaded zstd); Python only hashes the compressed archives.
"""

from __future__ import annotations

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
import select
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from durable.ports import SnapshotInfo
from protocol.errors import ProtocolError
from protocol.validate import validate_name

FORMAT = "tar+zstd"  # a full archive (plain tar, or a level-0 listed-incremental one: both extract alike)
FORMAT_INCREMENT = "tar+zstd+incremental"  # needs its parent chain; older versions refuse it instead of misreading
FORMATS = (FORMAT, FORMAT_INCREMENT)
ARCHIVE_SUFFIX = ".tar.zst"
MANIFEST_SUFFIX = ".json"
SNAR_SUFFIX = ".snar"
TMP_PREFIX = ".tmp-"
ZSTD_LEVEL = 3
# links from a full save to the newest increment, both included. A restore pays, per increment, one stat pass over
# the tree (tar -G checks every directory's entries against the increment's listing to apply deletions): about 4 µs
# a file, so this bounds what a long chain adds to a restore (a resume after an idle stop is one)
MAX_CHAIN = 16
MAX_INCREMENT_SHARE = 0.5  # increments of one chain may add up to this share of its full base's size
# when the probe (see the module docstring) is on another filesystem than the tree, whose timestamps may be coarser
# (whole seconds): files changed this long before a save count as changed after it too
SNAR_MARGIN_NS = 1_000_000_000
_ID = re.compile(r"^s-\d{13}-[0-9a-f]{6}$")
_CHUNK = 1 << 20
_FOLLOW_SECONDS = 0.002  # how often the hash looks for more of the archive zstd is writing
_F_SETPIPE_SZ = 1031  # fcntl: bigger pipe buffer → fewer, larger reads of the compressed stream
# 1 MiB tar records (2048 blocks) instead of 10 KiB: a fiftieth of the pipe reads and writes between tar and zstd;
# the reader re-blocks (-B) whatever a pipe hands it, so any record size extracts alike
_RECORD = ["-b", "2048"]
_TAR_CREATE = ["--numeric-owner", "--sparse", "--warning=no-file-changed", "--ignore-failed-read", *_RECORD]


@dataclass(frozen=True)
class Manifest:
    id: str
    created_at_ms: int
    size: int
    sha256: str
    format: str = FORMAT
    parent: str | None = None  # the snapshot this one is an increment of; None for a full save
    level: int = 0  # 0 for a full save, parent's level + 1 for an increment
    deleted: bool = False  # unlisted, its archive kept while a listed snapshot's chain needs it
    # an increment that removes (or changes the type of) something its parent's tree had: its restore applies its
    # directory listings (tar -G). Manifests from before this field say nothing and get -G, which is always right
    deletes: bool = True

    def info(self) -> SnapshotInfo:
        return SnapshotInfo(id=self.id, size=self.size, created_at_ms=self.created_at_ms)


def new_snapshot_id(now_ms: int | None = None) -> str:
    """Time-sortable (13-digit milliseconds) plus random, e.g. `s-1764406800123-9f2c1a`."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    return f"s-{ms:013d}-{secrets.token_hex(3)}"


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in `path` durable (the commit point of a snapshot or a backup)."""
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


def _exit_fd(pid: int) -> int | None:
    """A descriptor that turns readable when process `pid` exits (a pidfd), or None where the kernel has none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _is_root() -> bool:
    return os.geteuid() == 0


def _write_file(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Create `path` (it must not exist) with `data`, fsynced unless `sync` is False."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _probe_ctime(base_dir: Path, tree: Path) -> int:
    """The kernel's file-timestamp clock now, read from a file made and removed in `base_dir`: a file of `tree`
    changed from here on has a ctime at least this (SNAR_MARGIN_NS less when `tree` is on another filesystem)."""
    probe = base_dir / f"{TMP_PREFIX}probe-{secrets.token_hex(4)}"
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
        probe.unlink(missing_ok=True)
    return st.st_ctime_ns - (0 if st.st_dev == os.stat(tree).st_dev else SNAR_MARGIN_NS)


@dataclass(frozen=True)
class Snar:
    """A snapshot file of format 2, parsed once per save: its bytes, header line and NUL-terminated fields (the dump
    time, then per directory nfs, mtime s, mtime ns, dev, ino, name, its entries, an empty entry and one more NUL),
    and per directory record the index of its first field and of the empty entry that ends it."""

    data: bytes
    header: bytes
    fields: list[bytes]
    records: list[tuple[int, int]]

    def listings(self) -> dict[bytes, list[bytes]]:
        """Per directory, its entries (flag and name)."""
        fields = self.fields
        return {fields[i + 5]: fields[i + 6 : end] for i, end in self.records}


def parse_snar(data: bytes) -> Snar:
    """ValueError when `data` is not a whole snapshot file of format 2 (e.g. one a crash tore)."""
    newline = data.find(b"\n")
    header = data[: newline + 1]
    if newline < 0 or not header.startswith(b"GNU tar-") or not header.endswith(b"-2\n"):
        raise ValueError("not a GNU tar snapshot file of format 2")
    fields = data[newline + 1 :].split(b"\0")
    if len(fields) < 3 or fields.pop() != b"" or not fields[0].isdigit() or not fields[1].isdigit():
        raise ValueError("truncated snapshot file")
    # one record per directory of the tree, each checked with a few C-level calls: per-field Python code cost
    # milliseconds of every incremental save on a tree of 10,000 files
    records, i, n, index = [], 2, len(fields), fields.index
    while i < n:
        numbers = fields[i : i + 5]
        if n - i < 6 or not all(numbers) or not b"".join(numbers).isdigit():  # five non-empty, all digits
            raise ValueError("malformed directory record")
        try:
            end = index(b"", i + 6)  # entries are never empty: this is the record's end (C speed)
        except ValueError:
            raise ValueError("malformed directory record") from None
        if end + 1 >= n or fields[end + 1] != b"":
            raise ValueError("malformed directory record")
        records.append((i, end))
        i = end + 2
    return Snar(data, header, fields, records)


def normalize_snar(snar: Snar, not_after_ns: int | None = None) -> bytes:
    """The snapshot file with every device number set to 0 and the dump time lowered to `not_after_ns` (see the
    module docstring)."""
    fields = list(snar.fields)
    stamp = int(fields[0]) * 1_000_000_000 + int(fields[1])
    stamp = stamp if not_after_ns is None else min(stamp, not_after_ns)
    fields[0], fields[1] = str(stamp // 1_000_000_000).encode(), str(stamp % 1_000_000_000).encode()
    for i, _end in snar.records:
        fields[i + 3] = b"0"
    return snar.header + b"\0".join(fields) + b"\0"


_OTHER_FLAG = re.compile(rb"\0[^0-9.YND\0]")


def _kinds(entries: list[bytes]) -> set[bytes]:
    """A listing's entries with Y (saved in this archive) as N (unchanged): the same kind, a non-directory."""
    return set((b"\0" + b"\0".join(entries)).replace(b"\0Y", b"\0N").split(b"\0")[1:])


def snar_deletes(parent: Snar, new: Snar) -> bool:
    """Whether the tree `new` describes lost (or changed between directory and not) anything the tree `parent`
    describes had. When not, the increment's restore needs no `tar -G`: extracting it over its parent's tree adds
    and replaces files, which is all it holds (every entry of the parent's tree is in its listings with its kind)."""
    # Only an entry starts with a letter after a NUL (numbers are digits, directory names start with "."), so any
    # flag but Y, N and D (tar's rename records) shows here: -G then
    if _OTHER_FLAG.search(parent.data) or _OTHER_FLAG.search(new.data):
        return True
    after = new.listings()
    for directory, entries in parent.listings().items():
        now = after.get(directory)
        if now is None or (entries != now and not _kinds(entries) <= _kinds(now)):
            return True
    return False


class SnapshotStore:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        # metadata changes (commit, delete, collect, clone) are short and serialised; `_pins` are chains a save,
        # restore or clone is using right now, which collection leaves alone
        self._lock = threading.RLock()
        self._pins: Counter[tuple[Path, str]] = Counter()
        self._saving: dict[Path, threading.Lock] = {}
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
        """Remove crash leftovers (`.tmp-*` files, archives whose manifest was never written) and unlisted archives
        no listed snapshot needs any more. Returns the count."""
        removed = 0
        for ws_dir in self.root.glob("*/*"):
            if not ws_dir.is_dir():
                continue
            with self._lock:
                for entry in ws_dir.iterdir():
                    name = entry.name
                    orphan = (
                        name.endswith(ARCHIVE_SUFFIX)
                        and not (ws_dir / (name[: -len(ARCHIVE_SUFFIX)] + MANIFEST_SUFFIX)).exists()
                    )
                    pinned = any(ws_dir == pin_dir and pin_id in name for pin_dir, pin_id in self._pins)
                    if (name.startswith(TMP_PREFIX) or orphan) and not pinned:
                        if entry.is_dir() and not entry.is_symlink():
                            shutil.rmtree(entry, ignore_errors=True)
                        else:
                            entry.unlink(missing_ok=True)
                        removed += 1
                removed += self._collect(ws_dir)
        return removed

    # ---- reading ------------------------------------------------------------------------------------------
    def _manifest(self, ws_dir: Path, snapshot_id: str) -> Manifest | None:
        try:
            raw = json.loads((ws_dir / (snapshot_id + MANIFEST_SUFFIX)).read_text("utf-8"))
            parent = raw.get("parent")
            return Manifest(
                id=str(raw["id"]),
                created_at_ms=int(raw["created_at_ms"]),
                size=int(raw["size"]),
                sha256=str(raw["sha256"]),
                format=str(raw["format"]),
                parent=None if parent is None else self._check_id(parent),
                level=int(raw.get("level", 0)),
                deleted=bool(raw.get("deleted", False)),
                deletes=bool(raw.get("deletes", True)),
            )
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
            # a torn or edited manifest: listed as nothing, refused by verify
            return None

    def _manifests(self, ws_dir: Path) -> dict[str, Manifest]:
        """Every readable manifest of a workspace, listed or not."""
        found: dict[str, Manifest] = {}
        if not ws_dir.is_dir():
            return found
        for entry in ws_dir.iterdir():
            name = entry.name
            if name.startswith(TMP_PREFIX) or not name.endswith(MANIFEST_SUFFIX):
                continue
            snapshot_id = name[: -len(MANIFEST_SUFFIX)]
            if not _ID.fullmatch(snapshot_id):
                continue
            manifest = self._manifest(ws_dir, snapshot_id)
            if manifest is not None and manifest.id == snapshot_id:
                found[snapshot_id] = manifest
        return found

    def list(self, namespace: str, workspace: str) -> list[SnapshotInfo]:
        """Committed snapshots, newest first."""
        ws_dir = self._dir(namespace, workspace)
        found = [m.info() for m in self._manifests(ws_dir).values() if not m.deleted]
        found.sort(key=lambda s: (s.created_at_ms, s.id), reverse=True)
        return found

    def _damaged(self, snapshot_id: str, why: str) -> ProtocolError:
        return ProtocolError(
            "snapshot_damaged",
            f"snapshot {snapshot_id} {why}; none of its files were restored and nothing ran: restore an older "
            "snapshot or a backup, delete the workspace to start over, or ask the operator to look at the store.",
        )

    def _committed(self, ws_dir: Path, snapshot_id: str, *, listed: bool = True) -> Manifest:
        manifest = self._manifest(ws_dir, snapshot_id)
        if manifest is None or manifest.id != snapshot_id:
            if (ws_dir / (snapshot_id + MANIFEST_SUFFIX)).exists():
                raise self._damaged(snapshot_id, "has an unreadable manifest")
            raise self._damaged(snapshot_id, "does not exist")
        if listed and manifest.deleted:
            raise self._damaged(snapshot_id, "does not exist")
        return manifest

    def _chain(self, ws_dir: Path, snapshot_id: str, *, listed: bool = True) -> list[Manifest]:
        """The snapshot (listed, unless `listed` is False) and every link it builds on, full base first; each one's
        archive there with its size. Raises ProtocolError('snapshot_damaged') naming `snapshot_id`."""
        chain = [self._committed(ws_dir, snapshot_id, listed=listed)]
        while True:  # levels fall by one per link down to 0: it ends, whatever the manifests say
            link = chain[-1]
            what = _link(link, snapshot_id)
            if link.format not in FORMATS:
                raise self._damaged(snapshot_id, f"has unknown format {link.format!r}{what}")
            archive = ws_dir / (link.id + ARCHIVE_SUFFIX)
            try:
                size = archive.stat().st_size
            except FileNotFoundError:
                raise self._damaged(snapshot_id, f"has lost its archive{what}") from None
            if size != link.size:
                raise self._damaged(snapshot_id, f"has {size} bytes where its manifest says {link.size}{what}")
            if link.parent is None:
                if link.level != 0 or link.format != FORMAT:
                    raise self._damaged(snapshot_id, f"is an increment without a parent{what}")
                return chain[::-1]
            if link.format != FORMAT_INCREMENT or link.level < 1:
                raise self._damaged(snapshot_id, f"has a malformed chain{what}")
            try:
                parent = self._committed(ws_dir, link.parent, listed=False)
            except ProtocolError:
                raise self._damaged(snapshot_id, f"has lost its chain link {link.parent}") from None
            if parent.level != link.level - 1:
                raise self._damaged(snapshot_id, f"has a malformed chain{what}")
            chain.append(parent)

    def verify(self, namespace: str, workspace: str, snapshot_id: str) -> SnapshotInfo:
        """Check every archive of the snapshot's chain against its manifest (size and sha256). Raises
        ProtocolError('snapshot_damaged')."""
        ws_dir = self._dir(namespace, workspace)
        self._check_id(snapshot_id)
        with self._lock:
            chain = self._chain(ws_dir, snapshot_id)
            ids = [m.id for m in chain]
            self._pin(ws_dir, ids)
        try:
            for link in chain:
                digest = hashlib.sha256()
                with open(ws_dir / (link.id + ARCHIVE_SUFFIX), "rb") as f:
                    while chunk := f.read(_CHUNK):
                        digest.update(chunk)
                if digest.hexdigest() != link.sha256:
                    raise self._damaged(snapshot_id, f"failed its sha256 check{_link(link, snapshot_id)}")
        finally:
            self._unpin(ws_dir, ids)
        return chain[-1].info()

    def chain(self, namespace: str, workspace: str, snapshot_id: str) -> list[str]:
        """Ids of the archives a restore of `snapshot_id` extracts, full base first (for tests and diagnostics)."""
        return [m.id for m in self._chain(self._dir(namespace, workspace), self._check_id(snapshot_id))]

    def _pin(self, ws_dir: Path, ids: list[str]) -> None:
        with self._lock:
            for snapshot_id in ids:
                self._pins[(ws_dir, snapshot_id)] += 1

    def _unpin(self, ws_dir: Path, ids: list[str]) -> None:
        with self._lock:
            for snapshot_id in ids:
                self._pins[(ws_dir, snapshot_id)] -= 1
                if self._pins[(ws_dir, snapshot_id)] <= 0:
                    del self._pins[(ws_dir, snapshot_id)]

    # ---- incremental bases --------------------------------------------------------------------------------
    def live_base(self, namespace: str, workspace: str, base_dir: str | os.PathLike) -> str | None:
        """The snapshot the next save with this `base_dir` would be an increment of, or None (a full save)."""
        found = self._base(self._dir(namespace, workspace), Path(base_dir))
        return found[0][-1].id if found else None

    def _base(self, ws_dir: Path, base_dir: Path) -> tuple[list[Manifest], Snar] | None:
        """The chain the next save extends and its newest link's snar: the newest `<id>.snar` in base_dir whose
        snapshot is still intact and whose chain has room for one more link. None: the next save is full."""
        try:
            names = sorted((e.name for e in base_dir.iterdir()), reverse=True)
        except (FileNotFoundError, NotADirectoryError):
            return None
        for name in names:
            snapshot_id = name[: -len(SNAR_SUFFIX)]
            if not name.endswith(SNAR_SUFFIX) or not _ID.fullmatch(snapshot_id):
                continue
            try:
                # an unlisted (deleted) snapshot still serves as a base while its archive is kept
                chain = self._chain(ws_dir, snapshot_id, listed=False)
                snar = parse_snar((base_dir / name).read_bytes())  # parses: not torn by a crash
            except (ProtocolError, OSError, ValueError):
                continue
            increments = sum(m.size for m in chain[1:])
            if len(chain) >= MAX_CHAIN or increments > chain[0].size * MAX_INCREMENT_SHARE:
                return None  # a new full save starts the next chain
            return chain, snar
        return None

    @staticmethod
    def forget(base_dir: str | os.PathLike) -> None:
        """Drop what `base_dir` knows (the live tree is about to be replaced): the next save is full."""
        base = Path(base_dir)
        try:
            entries = list(base.iterdir())
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            if entry.name.endswith(SNAR_SUFFIX):
                entry.unlink(missing_ok=True)
        fsync_dir(base)

    def track(
        self, namespace: str, workspace: str, snapshot_id: str, tree: str | os.PathLike, base_dir: str | os.PathLike
    ) -> None:
        """Make `tree`, just restored from `snapshot_id` and not yet changed, the base of its next save: a stat-only
        walk (`tar -g SNAR -cf /dev/null`; GNU tar reads no file data for /dev/null) records it as of now."""
        self._dir(namespace, workspace)  # refuses bad names
        self._check_id(snapshot_id)
        base = Path(base_dir)
        self.forget(base)
        base.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = base / f"{TMP_PREFIX}{snapshot_id}-{secrets.token_hex(4)}{SNAR_SUFFIX}"
        cmd = ["tar", "-C", str(tree), f"--listed-incremental={tmp}", "--no-check-device", *_TAR_CREATE]
        try:
            since = _probe_ctime(base, Path(tree))
            with tempfile.TemporaryFile() as err:
                rc = subprocess.run([*cmd, "-cf", "/dev/null", "."], stdin=subprocess.DEVNULL, stderr=err).returncode
                if rc not in (0, 1):
                    raise _PipelineError(f"tar failed ({rc}): {_read_tail(err)}")
            self._keep_snar(tmp, base, snapshot_id, since)
        finally:
            tmp.unlink(missing_ok=True)

    @staticmethod
    def _keep_snar(tmp: Path, base_dir: Path, snapshot_id: str, since_ns: int, parsed: Snar | None = None) -> None:
        """Normalise the snar tar wrote at `tmp` (`parsed`, when the caller has read it) and make it base_dir's
        only one, as `<snapshot_id>.snar`. ValueError when it does not parse."""
        data = normalize_snar(parse_snar(tmp.read_bytes()) if parsed is None else parsed, since_ns)
        final = base_dir / (snapshot_id + SNAR_SUFFIX)
        # no fsync: whichever snar a crash leaves is named after the snapshot it describes, and one the crash tore
        # fails _base's parse (a full save then). A new file, not `tmp` rewritten: ext4 flushes a file truncated to
        # zero and written again when it is closed (auto_da_alloc), milliseconds an incremental save would wait
        fresh = base_dir / f"{TMP_PREFIX}{snapshot_id}-{secrets.token_hex(4)}{SNAR_SUFFIX}"
        try:
            _write_file(fresh, data, sync=False)
            os.rename(fresh, final)
        finally:
            fresh.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
        for entry in base_dir.iterdir():
            if entry.name.endswith(SNAR_SUFFIX) and entry.name != final.name:
                entry.unlink(missing_ok=True)

    # ---- writing ------------------------------------------------------------------------------------------
    def create(
        self,
        namespace: str,
        workspace: str,
        source_dir: str | os.PathLike,
        *,
        base_dir: str | os.PathLike | None = None,
    ) -> SnapshotInfo:
        """Archive `source_dir` (its contents, owners and modes) as a new snapshot.

        With `base_dir` (the caller's own directory, never one a sandbox reaches): an increment of the snapshot
        base_dir names when it is still intact and its chain has room (see the module docstring), else a full save;
        either way base_dir then names the new snapshot. Without it: a full, plain tar save.
        Raises ProtocolError('snapshot_failed') (e.g. disk full); nothing is left under a final name then, and
        base_dir still names the previous base."""
        ws_dir = self._dir(namespace, workspace)
        source = Path(source_dir)
        if not source.is_dir():
            raise ProtocolError("snapshot_failed", "the workspace has no files to snapshot")
        with self._lock:
            saving = self._saving.setdefault(ws_dir, threading.Lock())
        with saving:  # one save of a workspace at a time: its base moves with each
            return self._create(ws_dir, source, None if base_dir is None else Path(base_dir))

    def _create(self, ws_dir: Path, source: Path, base_dir: Path | None) -> SnapshotInfo:
        snapshot_id = new_snapshot_id()
        archive = ws_dir / (snapshot_id + ARCHIVE_SUFFIX)
        tmp_archive = ws_dir / (TMP_PREFIX + snapshot_id + ARCHIVE_SUFFIX)
        tmp_snar = None if base_dir is None else base_dir / (TMP_PREFIX + snapshot_id + SNAR_SUFFIX)
        with self._lock:  # chosen and pinned at once: a delete cannot collect the chain this save extends
            found = self._base(ws_dir, base_dir) if base_dir is not None else None
            chain, parent_snar = found if found else (None, None)
            pins = [m.id for m in chain or []] + [snapshot_id]
            self._pin(ws_dir, pins)
        try:
            ws_dir.mkdir(parents=True, exist_ok=True)
            snar_args: list[str] = []
            if base_dir is not None:
                base_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
                for entry in base_dir.iterdir():  # an earlier save's crash leftovers (saves are serialised)
                    if entry.name.startswith(TMP_PREFIX):
                        entry.unlink(missing_ok=True)
                if parent_snar is not None:  # tar updates the snar in place: work on a copy, the base stays as it was
                    _write_file(tmp_snar, parent_snar.data, sync=False)
                snar_args = [f"--listed-incremental={tmp_snar}", "--no-check-device"]
                since = _probe_ctime(base_dir, source)
            size, sha = self._write_archive(source, tmp_archive, snar_args)
            os.rename(tmp_archive, archive)
            parent = chain[-1] if chain else None
            new_snar = None
            with contextlib.suppress(OSError, ValueError):  # (then _keep_snar fails too: the next save is full)
                new_snar = None if tmp_snar is None else parse_snar(tmp_snar.read_bytes())
            # an unreadable snar cannot tell: -G is always right, only slower
            deletes = parent is not None and (new_snar is None or snar_deletes(parent_snar, new_snar))
            manifest = Manifest(
                id=snapshot_id,
                created_at_ms=int(time.time() * 1000),
                size=size,
                sha256=sha,
                format=FORMAT_INCREMENT if parent else FORMAT,
                parent=parent.id if parent else None,
                level=parent.level + 1 if parent else 0,
                deletes=deletes,
            )
            with self._lock:
                self._write_manifest(ws_dir, manifest)
        except (OSError, subprocess.SubprocessError, _PipelineError) as exc:
            # best-effort cleanup: the failure may be that ws_dir itself is unusable (e.g. a file in its place). The
            # manifest goes first: renamed into place before its directory's fsync failed, it would otherwise list a
            # snapshot whose archive this loop then removes (the id is this save's own, so nothing else has it). One
            # that cannot be removed keeps its archive: listed and whole is restorable, listed and empty is not.
            manifest_path = ws_dir / (snapshot_id + MANIFEST_SUFFIX)
            try:
                manifest_path.unlink(missing_ok=True)
                unlisted = True
            except OSError:
                unlisted = False
            tmp_manifest = ws_dir / (TMP_PREFIX + snapshot_id + MANIFEST_SUFFIX)
            for leftover in (tmp_manifest, tmp_archive, archive if unlisted else None, tmp_snar):
                with contextlib.suppress(OSError):
                    if leftover is not None:
                        leftover.unlink(missing_ok=True)
            raise ProtocolError("snapshot_failed", f"the snapshot could not be written: {_describe(exc)}") from None
        finally:
            self._unpin(ws_dir, pins)
        if base_dir is not None:
            try:
                self._keep_snar(tmp_snar, base_dir, snapshot_id, since, new_snar)
            except (OSError, ValueError):
                # the snapshot is committed; without its snar the next save is merely full
                with contextlib.suppress(OSError):
                    self.forget(base_dir)
            finally:
                with contextlib.suppress(OSError):
                    tmp_snar.unlink(missing_ok=True)
        return manifest.info()

    def _write_archive(self, source: Path, target: Path, snar_args: list[str]) -> tuple[int, str]:
        """`tar | zstd > target`, zstd writing the file itself while this thread hashes what it has written so far
        (reading the file behind it, from the page cache): no copy of the stream through Python, and the hash off
        the pipeline's path. Then fsync."""
        tar_cmd = ["tar", "-C", str(source), *snar_args, *_TAR_CREATE, "-cf", "-", "."]
        zstd_cmd = ["zstd", "-T0", f"-{ZSTD_LEVEL}", "-q", "-c"]
        digest = hashlib.sha256()
        size = 0
        # stderr goes to files, not pipes: thousands of tar warnings must not fill a pipe and stall the pipeline
        tar_err, zstd_err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            behind = os.open(target, os.O_RDONLY | os.O_CLOEXEC)
        except BaseException:
            os.close(fd)
            raise
        try:
            tar = subprocess.Popen(tar_cmd, stdout=subprocess.PIPE, stderr=tar_err, stdin=subprocess.DEVNULL)
            try:
                zstd = subprocess.Popen(zstd_cmd, stdin=tar.stdout, stdout=fd, stderr=zstd_err)
            except BaseException:
                tar.kill()
                tar.wait()
                raise
            _grow_pipe(tar.stdout.fileno())
            tar.stdout.close()  # zstd owns the read end now; tar gets SIGPIPE if zstd dies
            exited = _exit_fd(zstd.pid)
            waiter = None
            if exited is not None:  # poll, not select: a busy server's descriptors pass select's FD_SETSIZE
                waiter = select.poll()
                waiter.register(exited, select.POLLIN)
            try:
                flushed = 0
                while True:
                    finished = zstd.poll() is not None  # before the last read: then nothing more can come
                    while chunk := os.pread(behind, _CHUNK, size):
                        digest.update(chunk)
                        size += len(chunk)
                    if size - flushed >= _WRITEBACK or (finished and size > flushed):
                        # start writing what is hashed to the disk now, while zstd compresses the rest: the
                        # fsync below then waits for the tail only, not for the whole archive
                        _start_writeback(fd, flushed, size - flushed)
                        flushed = size
                    if finished:
                        break
                    if waiter is None:
                        time.sleep(_FOLLOW_SECONDS)
                    else:  # the same wait, cut short the moment zstd exits: a small archive's save ends sooner
                        waiter.poll(_FOLLOW_SECONDS * 1000)
            except BaseException:
                for proc in (tar, zstd):
                    proc.kill()
                raise
            finally:
                if exited is not None:
                    os.close(exited)
                tar_rc, zstd_rc = tar.wait(), zstd.wait()
            # tar exits 1 when files changed while it read them: a live workspace, still a consistent-enough snapshot
            if tar_rc not in (0, 1):
                raise _PipelineError(f"tar failed ({tar_rc}): {_read_tail(tar_err)}")
            if zstd_rc != 0:
                raise _PipelineError(f"zstd failed ({zstd_rc}): {_read_tail(zstd_err)}")
            if os.fstat(fd).st_size != size:
                raise _PipelineError("the archive changed while it was hashed")
            os.fsync(fd)
        finally:
            os.close(behind)
            os.close(fd)
        return size, digest.hexdigest()

    def _write_manifest(self, ws_dir: Path, manifest: Manifest) -> None:
        """Write (or replace) a manifest atomically; durable once this returns."""
        tmp = ws_dir / (TMP_PREFIX + manifest.id + MANIFEST_SUFFIX)
        tmp.unlink(missing_ok=True)
        _write_file(tmp, json.dumps(asdict(manifest), separators=(",", ":")).encode("utf-8"))
        os.rename(tmp, ws_dir / (manifest.id + MANIFEST_SUFFIX))
        fsync_dir(ws_dir)  # the commit point is durable once the directory entry is

    def delete(self, namespace: str, workspace: str, snapshot_id: str) -> None:
        """Unlist a snapshot; its archive goes as soon as no listed snapshot's chain needs it (the manifest first,
        so it stops being listed before its archive goes). Missing is fine."""
        ws_dir = self._dir(namespace, workspace)
        self._check_id(snapshot_id)
        with self._lock:
            manifest = self._manifest(ws_dir, snapshot_id)
            if manifest is not None and manifest.id == snapshot_id and not manifest.deleted:
                self._write_manifest(ws_dir, _replace(manifest, deleted=True))
            elif manifest is None:
                (ws_dir / (snapshot_id + MANIFEST_SUFFIX)).unlink(missing_ok=True)  # an unreadable one
                if not any(pin == (ws_dir, snapshot_id) for pin in self._pins):
                    (ws_dir / (snapshot_id + ARCHIVE_SUFFIX)).unlink(missing_ok=True)
            self._collect(ws_dir)

    def _collect(self, ws_dir: Path) -> int:
        """Remove unlisted snapshots that no listed one builds on (nor a save, restore or clone in progress).
        Called with the lock held."""
        manifests = self._manifests(ws_dir)
        needed = {pin_id for pin_dir, pin_id in self._pins if pin_dir == ws_dir}
        for manifest in manifests.values():
            if manifest.deleted:
                continue
            link: Manifest | None = manifest
            while link is not None and link.id not in needed:
                needed.add(link.id)
                link = manifests.get(link.parent) if link.parent else None
        # pins of a save name the chain it extends; an unlisted base of a live tree with no dependents is dropped,
        # which only makes that tree's next save full
        removed = 0
        for manifest in manifests.values():
            if manifest.deleted and manifest.id not in needed:
                (ws_dir / (manifest.id + MANIFEST_SUFFIX)).unlink(missing_ok=True)
                (ws_dir / (manifest.id + ARCHIVE_SUFFIX)).unlink(missing_ok=True)
                removed += 1
        return removed

    # ---- forks --------------------------------------------------------------------------------------------
    def clone(
        self, src_namespace: str, src_workspace: str, snapshot_id: str, dst_namespace: str, dst_workspace: str
    ) -> SnapshotInfo:
        """Make a listed snapshot of one workspace a snapshot of another (same id): every archive of its chain is
        hard-linked (copied across filesystems) into the destination, the chain's other links unlisted there, the
        snapshot's own manifest written last (the commit point). Raises ProtocolError('snapshot_not_found') when the
        source does not list it, 'snapshot_damaged' when its chain is broken, 'snapshot_failed' when writing fails."""
        src_dir = self._dir(src_namespace, src_workspace)
        dst_dir = self._dir(dst_namespace, dst_workspace)
        self._check_id(snapshot_id)
        with self._lock:
            manifest = self._manifest(src_dir, snapshot_id)
            if manifest is None or manifest.id != snapshot_id or manifest.deleted:
                raise ProtocolError(
                    "snapshot_not_found", f"{src_namespace}/{src_workspace} has no snapshot {snapshot_id}"
                )
            chain = self._chain(src_dir, snapshot_id)
            ids = [m.id for m in chain]
            if src_dir == dst_dir:
                return manifest.info()
            self._pin(src_dir, ids)
            self._pin(dst_dir, ids)
        try:
            dst_dir.mkdir(parents=True, exist_ok=True)
            for link in chain:
                final = dst_dir / (link.id + ARCHIVE_SUFFIX)
                with contextlib.suppress(FileNotFoundError):
                    if final.stat().st_size == link.size and (dst_dir / (link.id + MANIFEST_SUFFIX)).exists():
                        continue  # adopted before
                tmp = dst_dir / (TMP_PREFIX + "clone-" + link.id + ARCHIVE_SUFFIX)
                tmp.unlink(missing_ok=True)
                _link_or_copy(src_dir / (link.id + ARCHIVE_SUFFIX), tmp)
                os.rename(tmp, final)
            fsync_dir(dst_dir)
            with self._lock:
                for link in chain[:-1]:
                    if self._manifest(dst_dir, link.id) is None:
                        self._write_manifest(dst_dir, _replace(link, deleted=True))
                self._write_manifest(dst_dir, _replace(manifest, deleted=False))
        except OSError as exc:
            with self._lock:
                self._collect(dst_dir)
            raise ProtocolError("snapshot_failed", f"the snapshot could not be adopted: {_describe(exc)}") from None
        finally:
            self._unpin(src_dir, ids)
            self._unpin(dst_dir, ids)
        return manifest.info()

    # ---- restoring ----------------------------------------------------------------------------------------
    def restore(self, namespace: str, workspace: str, snapshot_id: str, target_dir: str | os.PathLike) -> SnapshotInfo:
        """Replace `target_dir` with the snapshot's files, atomically: the chain is extracted into a staging
        directory (`extract`) that is then swapped in. Raises ProtocolError('snapshot_damaged') (target untouched)
        when an archive does not match its manifest or does not unpack."""
        self._check_id(snapshot_id)
        target = Path(target_dir)
        staging = self.staging_for(target)
        try:
            info = self.extract(namespace, workspace, snapshot_id, staging)
            swap_into_place(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return info

    @staticmethod
    def staging_for(target: Path) -> Path:
        """A new, empty directory beside `target` to restore into (`.tmp-restore-<name>-<hex>`: a crash leaves it
        to the sandbox's cleanup of restore leftovers)."""
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.parent / f"{TMP_PREFIX}restore-{target.name}-{secrets.token_hex(4)}"
        staging.mkdir(mode=0o700)
        return staging

    def extract(self, namespace: str, workspace: str, snapshot_id: str, staging: Path) -> SnapshotInfo:
        """Extract the snapshot's chain into `staging` (empty, or holding only empty live subdirs), full base
        first, each archive sha256-checked; the caller swaps it in, or removes it when this raises."""
        ws_dir = self._dir(namespace, workspace)
        self._check_id(snapshot_id)
        with self._lock:
            chain = self._chain(ws_dir, snapshot_id)
            ids = [m.id for m in chain]
            self._pin(ws_dir, ids)
        try:
            # one tar per link: each run's end applies its symlinks (tar defers them so that no later member of
            # the same archive is written through one), and the next link's directory listings then replace what
            # changed type; one tar over the whole chain would apply them all at the very end, and could turn a
            # file a later link put in a deferred symlink's place (the same inode number, reused) back into that
            # symlink
            for link in chain:
                self._extract(ws_dir / (link.id + ARCHIVE_SUFFIX), link, staging, snapshot_id)
        finally:
            self._unpin(ws_dir, ids)
        return chain[-1].info()

    def _extract(self, archive: Path, manifest: Manifest, staging: Path, snapshot_id: str) -> None:
        """`zstd -d | tar -x` into `staging` while this thread hashes the same archive in parallel (hashlib drops
        the GIL); the caller only swaps `staging` in when every hash matched and both tools succeeded. `-G` applies
        an increment's deletions (its directory listings); for a full archive, or an increment that deletes
        nothing (its manifest says so), it would change nothing but cost a stat of every entry of the tree."""
        tar_cmd = ["tar", "-C", str(staging), "--numeric-owner", "-p", "--delay-directory-restore", *_RECORD, "-B"]
        if manifest.parent is not None and manifest.deletes:  # (a full archive goes into an empty directory)
            tar_cmd.append("--listed-incremental=/dev/null")
        tar_cmd += ["-xf", "-"]
        if _is_root():
            tar_cmd.insert(-2, "--same-owner")
        what = _link(manifest, snapshot_id)
        zstd_errf, tar_errf = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        digest = hashlib.sha256()
        with open(archive, "rb") as hashed, open(archive, "rb") as fed:
            if os.fstat(hashed.fileno()).st_ino != os.fstat(fed.fileno()).st_ino:
                raise self._damaged(snapshot_id, f"changed while being restored{what}")
            zstd = subprocess.Popen(["zstd", "-d", "-q", "-c"], stdin=fed, stdout=subprocess.PIPE, stderr=zstd_errf)
            _grow_pipe(zstd.stdout.fileno())
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
            raise self._damaged(snapshot_id, f"failed its sha256 check{what}")
        if zstd_rc != 0:
            raise self._damaged(snapshot_id, f"does not decompress{what} ({_tail(zstd_err, 200)})")
        if tar_rc != 0:
            if _is_disk_error(tar_err):
                raise ProtocolError("container_unavailable", f"restoring snapshot {snapshot_id}: {_tail(tar_err)}")
            raise self._damaged(snapshot_id, f"does not unpack{what} ({_tail(tar_err, 200)})")


def _link(link: Manifest, snapshot_id: str) -> str:
    return "" if link.id == snapshot_id else f" (its chain link {link.id})"


def _replace(manifest: Manifest, **changes) -> Manifest:
    return Manifest(**{**asdict(manifest), **changes})


def _link_or_copy(source: Path, target: Path) -> None:
    """Hard-link `source` at `target`, or copy it (fsynced) where the two are on different filesystems or the
    filesystem has no hard links."""
    try:
        os.link(source, target)
        return
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
            raise
    with open(source, "rb") as src, open(target, "xb") as dst:
        shutil.copyfileobj(src, dst, _CHUNK)
        dst.flush()
        os.fsync(dst.fileno())


class _PipelineError(Exception):
    pass


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.errno is not None:
        return os.strerror(exc.errno)
    return str(exc)


def _is_disk_error(stderr: bytes) -> bool:
    text = stderr.decode("utf-8", "replace")
    return "No space left" in text or "Disk quota" in text


_SYNC_FILE_RANGE_WRITE = 2
_WRITEBACK = 8 << 20  # bytes of archive hashed between two writeback starts


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """sync_file_range(SYNC_FILE_RANGE_WRITE): queue the range's dirty pages for writing, without waiting. Only an
    early start of what the fsync does anyway, so any failure is ignored."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    func = getattr(_libc, "sync_file_range", None)
    if func is not None:
        func.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        func(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


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
    fsync_dir(target.parent)
