"""GET and PUT /files/archive: one directory's contents as a plain tar.zst (container/supervisor/archive_tree.py,
dirarchive.py), through real supervisor processes, real files and the system's tar."""

import io
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from .harness import IS_ROOT, needs_root, wait_until
from .test_archive import (
    _archive_workers,
    _force_rmtree,
    _owned_dir,
    dir_member,
    file_member,
    special_member,
    tree,
    unzstd,
    zstd,
)

pytestmark = pytest.mark.timeout(120)


def give(sup, *paths: Path) -> None:
    """Hand paths (and what is below them) to the sandbox user, as if it had made them."""
    uid = sup.uid
    gid = pwd.getpwuid(uid).pw_gid if IS_ROOT else os.getgid()
    for path in paths:
        os.lchown(path, uid, gid)
        for dirpath, dirnames, filenames in os.walk(path):
            for name in dirnames + filenames:
                os.lchown(os.path.join(dirpath, name), uid, gid)


def fetch(sup, path) -> httpx.Response:
    return sup.client.get("/files/archive", params={"path": str(path)})


def download(sup, path) -> bytes:
    response = fetch(sup, path)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/zstd"
    assert response.headers["transfer-encoding"] == "chunked"
    return response.content


def upload(sup, path, data) -> httpx.Response:
    return sup.client.put("/files/archive", params={"path": str(path)}, content=data)


def error_of(response: httpx.Response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code, error
    return error["message"]


def pack(items, fmt=tarfile.PAX_FORMAT, pax_headers=None) -> bytes:
    """A tar.zst of (TarInfo, data) items, made by Python's tarfile (no manifest); `pax_headers`: a global header."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:", format=fmt, pax_headers=pax_headers) as tar:
        for info, data in items:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return zstd(buffer.getvalue())


def system_tar(*args: str, data: bytes | None = None) -> bytes:
    return subprocess.run(["tar", "--zstd", *args], input=data, capture_output=True, check=True).stdout


SETUID_FILE = "tool"


def populate(sup, root: Path) -> dict:
    """A mixed tree below root; returns what a round trip must give back (setuid dropped)."""
    (root / "sub/deep").mkdir(parents=True)
    (root / "sub/mod.py").write_text("print('hello')\n")
    (root / "sub/deep/data.bin").write_bytes(os.urandom(5 * 1024 * 1024 + 13))  # > 1 MiB: streamed in chunks
    (root / "empty").write_bytes(b"")
    (root / "run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "secret.txt").write_text("only me")
    (root / "ünïcödé名前.txt").write_text("unicode")
    long_dir = root / ("d" * 120) / ("e" * 120)  # over ustar's 100 bytes: pax (ours) or GNU long names (tar's)
    long_dir.mkdir(parents=True)
    (long_dir / ("f" * 200)).write_text("a long path")
    (root / "empty-dir").mkdir()
    (root / "nested/empty").mkdir(parents=True)
    (root / "link-rel").symlink_to("sub/mod.py")
    (root / "link-dir").symlink_to("sub")
    (root / "sub/up").symlink_to("../run.sh")
    (root / "dangling").symlink_to("no/such/file")
    (root / "sub/hard").hardlink_to(root / "sub/mod.py")
    (root / "ro/inner").mkdir(parents=True)
    (root / "ro/inner/f").write_text("in a read-only directory")
    (root / "sticky").mkdir()
    (root / SETUID_FILE).write_text("#!/bin/sh\n")
    give(sup, root)
    os.chmod(root / "run.sh", 0o750)
    os.chmod(root / "secret.txt", 0o600)
    os.chmod(root / "sticky", 0o1777)
    os.chmod(root / SETUID_FILE, 0o4755)  # after the chown, which would clear it
    os.chmod(root / "ro/inner", 0o555)
    os.chmod(root / "ro", 0o555)
    os.utime(root / "sub/mod.py", (1_600_000_000, 1_600_000_000))
    os.utime(root / "nested/empty", (1_500_000_000, 1_500_000_000))
    expected = tree(root)
    kind, _mode, *rest = expected[SETUID_FILE]
    expected[SETUID_FILE] = (kind, 0o755, *rest)  # never setuid/setgid
    return expected


def counts(expected: dict) -> dict:
    files = [v for v in expected.values() if v[0] == "file"]
    return {
        "files": len(files),
        "directories": sum(1 for v in expected.values() if v[0] == "dir"),
        "symlinks": sum(1 for v in expected.values() if v[0] == "symlink"),
        "bytes": sum(v[3] for v in files),
    }


def no_leftovers(*dirs: Path) -> None:
    for path in dirs:
        assert not [name for name in os.listdir(path) if name.startswith(".flarebox-")], os.listdir(path)


@pytest.fixture
def outside():
    """A directory outside the workspace, writable by the sandbox user: nothing may land in it."""
    path = _owned_dir("flarebox-outside-")
    yield path
    _force_rmtree(path)


# --- round trips --------------------------------------------------------------------------------------------------


def test_a_mixed_tree_round_trips_through_get_and_put(supervisor):
    sup, src, copy = supervisor, supervisor.workspace / "src", supervisor.workspace / "copy"
    src.mkdir()
    expected = populate(sup, src)
    data = download(sup, src)
    before = tree(src)
    response = upload(sup, copy, data)
    assert response.status_code == 200, response.text
    assert response.json() == {"path": str(copy), **counts(expected)}
    assert tree(copy) == expected
    assert tree(src) == before  # the download changed nothing
    assert stat.S_IMODE(os.stat(copy).st_mode) == 0o755  # a new directory: no "./" member in our archives
    if IS_ROOT:  # everything is the sandbox user's
        for dirpath, dirnames, filenames in os.walk(copy):
            for name in dirnames + filenames:
                assert os.lstat(os.path.join(dirpath, name)).st_uid == sup.uid
    no_leftovers(sup.workspace, copy)


def test_put_replaces_an_existing_directory_and_keeps_the_directory_itself(supervisor):
    sup, src, dst = supervisor, supervisor.workspace / "src", supervisor.workspace / "dst"
    src.mkdir()
    expected = populate(sup, src)
    (dst / "old/locked").mkdir(parents=True)
    (dst / "old/locked/f").write_text("old")
    (dst / "run.sh").write_text("an older run.sh")
    (dst / "sub").mkdir()
    (dst / "sub/stale.py").write_text("stale")
    give(sup, dst)
    os.chmod(dst / "old/locked", 0o555)  # read-only directories are replaced too
    os.chmod(dst, 0o710)
    inode = os.stat(dst).st_ino
    response = upload(sup, dst, download(sup, src))
    assert response.status_code == 200, response.text
    assert tree(dst) == expected
    info = os.stat(dst)
    assert (info.st_ino, stat.S_IMODE(info.st_mode)) == (inode, 0o710)  # same directory: its contents swapped
    no_leftovers(sup.workspace, dst)


def test_an_empty_archive_empties_the_directory(supervisor):
    sup, empty, dst = supervisor, supervisor.workspace / "empty", supervisor.workspace / "dst"
    empty.mkdir()
    (dst / "a").mkdir(parents=True)
    (dst / "b").write_text("b")
    give(sup, empty, dst)
    response = upload(sup, dst, download(sup, empty))
    assert response.json() == {"path": str(dst), "files": 0, "directories": 0, "symlinks": 0, "bytes": 0}
    assert os.listdir(dst) == []


def test_system_tar_extracts_the_download(supervisor, tmp_path):
    log = tmp_path / "supervisor.log"  # the supervisor fixture's
    sup, src = supervisor, supervisor.workspace / "src"
    src.mkdir()
    expected = populate(sup, src)
    os.mkfifo(src / "fifo")  # sockets and FIFOs are left out
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(src / "sock"))
        data = download(sup, src)
    names = system_tar("-t", "-f", "-", data=data).decode().split("\n")
    assert "manifest.json" not in names and "fifo" not in names and "sock" not in names
    assert not [name for name in names if name.startswith(("./", "/"))]
    out = tmp_path / "out"
    out.mkdir()
    system_tar("-x", "-p", "--no-same-owner", "-f", "-", "-C", str(out), data=data)
    assert tree(out) == expected
    assert wait_until(lambda: "skipped 2 entries" in log.read_text())  # what was left out is logged


def test_put_accepts_what_system_tar_makes(supervisor):
    sup, src, copy = supervisor, supervisor.workspace / "src", supervisor.workspace / "copy"
    src.mkdir()
    expected = populate(sup, src)
    os.chmod(src, 0o750)
    data = system_tar("-c", "-C", str(src), ".")  # GNU format: "./" names, long-name members, hard links
    response = upload(sup, copy, data)
    assert response.status_code == 200, response.text
    assert tree(copy) == expected
    assert os.stat(copy / "sub/hard").st_ino == os.stat(copy / "sub/mod.py").st_ino  # still one file
    assert stat.S_IMODE(os.stat(copy).st_mode) == 0o750  # a new directory gets the "./" member's mode
    # the hard link counts as a file, its bytes once (they are the data extracted)
    linked = len((src / "sub/mod.py").read_bytes())
    assert response.json() == {"path": str(copy), **counts(expected), "bytes": counts(expected)["bytes"] - linked}
    no_leftovers(sup.workspace, copy)


def test_put_makes_parents_an_archive_has_no_member_for(supervisor):
    sup, dst = supervisor, supervisor.workspace / "dst"
    data = pack([file_member("a/b/c.txt", b"deep"), file_member("./top", b"top", 0o6755)])
    response = upload(sup, dst, data)
    assert response.status_code == 200, response.text
    assert response.json()["directories"] == 2
    assert (dst / "a/b/c.txt").read_bytes() == b"deep"
    assert stat.S_IMODE(os.stat(dst / "a/b").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(dst / "top").st_mode) == 0o755  # setuid and setgid dropped


def test_a_pax_global_header_may_hold_a_comment_only(supervisor, target):
    # git archive's: the commit id as a comment
    data = pack([file_member("f", b"x")], pax_headers={"comment": "0123abcd"})
    assert upload(supervisor, supervisor.workspace / "dst", data).status_code == 200
    data = pack([file_member("f", b"x")], pax_headers={"path": "../escaped"})
    assert_refused(supervisor, target, data, "global header")


def test_the_workspace_itself_can_be_replaced_and_downloaded(supervisor):
    sup, ws = supervisor, supervisor.workspace
    (ws / "old.txt").write_text("old")
    (ws / ".flarebox-import-0123").mkdir()  # a killed upload's leftovers: never downloaded, removed by the next
    give(sup, ws)
    response = upload(sup, ws, pack([dir_member("src"), file_member("src/main.py", b"print(1)\n")]))
    assert response.status_code == 200, response.text
    assert sorted(os.listdir(ws)) == ["src"]
    (ws / ".flarebox-trash-4567").mkdir()
    with tarfile.open(fileobj=io.BytesIO(unzstd(download(sup, ws)))) as tar:
        assert tar.getnames() == ["src", "src/main.py"]


def test_symlinks_below_the_directory_are_stored_never_followed(supervisor, outside):
    sup, src = supervisor, supervisor.workspace / "src"
    (outside / "secret").write_text("outside")
    src.mkdir()
    (src / "out").symlink_to(outside)
    give(sup, src)
    with tarfile.open(fileobj=io.BytesIO(unzstd(download(sup, src)))) as tar:
        members = tar.getmembers()
    assert [(m.name, m.issym(), m.linkname) for m in members] == [("out", True, str(outside))]


# --- refusals: nothing in DIR changes ---------------------------------------------------------------------------


HOSTILE = {
    "a parent-directory member": ([file_member("../escaped", b"x")], "'..' components"),
    "a parent component inside": ([dir_member("a"), file_member("a/../../escaped", b"x")], "'..' components"),
    "an absolute member": ([file_member("/etc/flarebox-planted", b"x")], "absolute"),
    "a character device": ([special_member("null", tarfile.CHRTYPE)], "character device"),
    "a block device": ([special_member("disk", tarfile.BLKTYPE)], "block device"),
    "a fifo": ([special_member("pipe", tarfile.FIFOTYPE)], "fifo"),
    "a hard link to an absolute path": ([special_member("h", tarfile.LNKTYPE, "/etc/passwd")], "leaves the directory"),
    "a hard link above the directory": ([special_member("h", tarfile.LNKTYPE, "../keep.txt")], "leaves the directory"),
    # keep.txt is in the live directory, not in the archive: a link reaches only what the archive holds
    "a hard link to no earlier member": ([special_member("h", tarfile.LNKTYPE, "keep.txt")], "not an earlier file"),
    "a hard link to a directory": (
        [dir_member("d"), special_member("h", tarfile.LNKTYPE, "d")],
        "not an earlier file",
    ),
    "an absolute symlink": ([special_member("l", tarfile.SYMTYPE, "/etc")], "leaves the directory (it is absolute)"),
    "a symlink above the directory": ([special_member("l", tarfile.SYMTYPE, "../x")], "climbs above"),
    "a nested symlink above the directory": (
        [dir_member("a"), dir_member("a/b"), special_member("a/b/l", tarfile.SYMTYPE, "../../..")],
        "climbs above",
    ),
    "a symlink above the directory once normalized": (
        [dir_member("a"), special_member("a/l", tarfile.SYMTYPE, "x/../../..")],
        "leaves the directory",
    ),
    "a chain of symlinks climbing out": (
        [
            dir_member("a"),
            special_member("a/b", tarfile.SYMTYPE, ".."),
            special_member("x", tarfile.SYMTYPE, "a/b"),
            special_member("y", tarfile.SYMTYPE, "x/.."),
        ],
        "'..' after a name",
    ),
    "a member below a symlink": (
        [dir_member("sub"), special_member("l", tarfile.SYMTYPE, "sub"), file_member("l/f", b"x")],
        "below a symlink",
    ),
    "a directory over a symlink": (
        [dir_member("sub"), special_member("l", tarfile.SYMTYPE, "sub"), dir_member("l")],
        "twice",
    ),
    "a member below a file": ([file_member("f", b"1"), file_member("f/g", b"2")], "below a symlink or a file"),
    "a path over the limit": ([file_member("p/" * 2100 + "f", b"x")], "over 4096"),
    "a 300-byte component": ([file_member("c" * 300, b"x")], "255"),
    "duplicate files": ([file_member("dup", b"1"), file_member("./dup", b"2")], "twice"),
    "a reserved name": ([dir_member(".flarebox-import-abc")], "reserved"),
    "the directory itself as a file": ([file_member(".", b"")], "names the directory itself"),
}


@pytest.fixture
def target(supervisor):
    """A live directory with contents that refusals must leave as they are."""
    dst = supervisor.workspace / "target"
    (dst / "sub").mkdir(parents=True)
    (dst / "keep.txt").write_text("live")
    (dst / "sub/inner.txt").write_text("live too")
    give(supervisor, dst)
    return dst


def assert_refused(sup, dst: Path, data: bytes, words: str, status: int = 400, code: str = "invalid_archive") -> str:
    before, around = tree(dst), sorted(os.listdir(dst.parent))
    message = error_of(upload(sup, dst, data), status, code)
    assert words.lower() in message.lower(), message
    assert tree(dst) == before  # byte-identical, and no staging directory left in it
    assert sorted(os.listdir(dst.parent)) == around
    return message


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_members_are_refused_and_change_nothing(supervisor, target, outside, case):
    items, words = HOSTILE[case]
    message = assert_refused(supervisor, target, pack(items), words)
    assert repr(items[-1][0].name)[:50].rstrip("'") in message  # the message names the member
    assert os.listdir(outside) == []
    assert not os.path.exists("/etc/flarebox-planted")


def test_gnu_long_names_are_checked_like_any_name(supervisor, target):
    long_escape = "../" + "x" * 150
    assert_refused(supervisor, target, pack([file_member(long_escape, b"x")], tarfile.GNU_FORMAT), "'..'")
    link = special_member("l", tarfile.SYMTYPE, "/" + "y" * 150)
    assert_refused(supervisor, target, pack([link], tarfile.GNU_FORMAT), "absolute")


def _damaged(good: bytes) -> dict[str, tuple[bytes, str]]:
    raw = bytearray(unzstd(good))
    raw[10] ^= 0x20  # a byte of the first header's name: its checksum no longer matches
    return {
        "a truncated stream": (good[: len(good) // 2], "truncated"),
        "a truncated end": (good[:-7], "truncated"),
        "a bad header checksum": (zstd(bytes(raw)), "checksum"),
        "data after the end": (zstd(unzstd(good) + b"\1" * 512), "after the end"),
        "garbage": (os.urandom(100_000), "zstd"),
        "an uncompressed tar": (unzstd(good), "zstd"),
        "an empty body": (b"", ""),
    }


def test_damaged_archives_are_refused_and_change_nothing(supervisor, target):
    sup, src = supervisor, supervisor.workspace / "src"
    src.mkdir()
    populate(sup, src)
    good = download(sup, src)
    for name, (data, words) in _damaged(good).items():
        try:
            assert_refused(sup, target, data, words)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None
    assert upload(sup, target, good).status_code == 200  # the supervisor still takes a whole one


def test_import_limits_apply(supervisor_factory):
    files = [file_member(f"f{i}", os.urandom(1000)) for i in range(5)]
    sup = supervisor_factory({"FLAREBOX_MAX_IMPORT_ENTRIES": "4"})
    dst = sup.workspace / "dst"
    dst.mkdir()
    give(sup, dst)
    assert "more than 4 entries" in assert_refused(sup, dst, pack(files), "", 413, "payload_too_large")
    sup = supervisor_factory({"FLAREBOX_MAX_IMPORT_BYTES": "4500"})
    dst = sup.workspace / "dst"
    dst.mkdir()
    give(sup, dst)
    data = pack(files)
    assert len(data) > 4500
    assert_refused(sup, dst, data, f"the archive has {len(data)} bytes; the limit is 4500", 413, "payload_too_large")
    # a small body whose files hold more than the limit
    zeros = pack([file_member("zeros", bytes(100_000))])
    assert len(zeros) < 4500
    assert_refused(sup, dst, zeros, "files hold more than 4500 bytes", 413, "payload_too_large")
    # a body without a length, over the limit as it streams
    response = sup.client.put("/files/archive", params={"path": str(dst)}, content=iter([data[:3000], data[3000:]]))
    assert error_of(response, 413, "payload_too_large")
    assert os.listdir(dst) == []


# --- requests and paths -------------------------------------------------------------------------------------------


def test_get_answers_errors_before_any_data(supervisor):
    sup = supervisor
    (sup.workspace / "file").write_text("x")
    error_of(fetch(sup, sup.workspace / "missing"), 404, "file_not_found")
    error_of(fetch(sup, sup.workspace / "file/below"), 404, "file_not_found")
    error_of(fetch(sup, sup.workspace / "file"), 400, "not_a_directory")
    error_of(sup.client.get("/files/archive", params={"path": "relative"}), 400, "invalid_path")
    error_of(sup.client.get("/files/archive"), 400, "invalid_query")
    error_of(sup.client.get("/files/archive", params={"path": str(sup.workspace), "x": "1"}), 400, "invalid_query")
    assert sup.client.head("/files/archive", params={"path": str(sup.workspace)}).status_code == 405


def test_put_checks_the_path(supervisor, outside):
    sup = supervisor
    data = pack([file_member("new", b"x")])
    (sup.workspace / "file").write_text("x")
    error_of(upload(sup, sup.workspace / "missing/dst", data), 404, "file_not_found")
    error_of(upload(sup, sup.workspace / "file", data), 400, "not_a_directory")
    error_of(upload(sup, sup.workspace / "sub/..", data), 400, "invalid_path")
    response = sup.client.put("/files/archive", params={"path": str(sup.workspace), "x": "1"}, content=data)
    error_of(response, 400, "invalid_query")
    assert (sup.workspace / "file").read_text() == "x"
    (sup.workspace / "link").symlink_to(outside)
    message = error_of(upload(sup, sup.workspace / "link", data), 400, "not_a_directory")
    assert "symlink" in message
    assert os.listdir(outside) == [] and (sup.workspace / "link").is_symlink()
    no_leftovers(sup.workspace)


def test_a_trailing_slash_names_the_same_directory(supervisor):
    sup, dst = supervisor, supervisor.workspace / "dst"
    response = upload(sup, f"{dst}/", pack([file_member("f", b"x")]))
    assert response.status_code == 200, response.text
    assert (dst / "f").read_bytes() == b"x"


def test_a_symlink_in_the_live_directory_does_not_redirect_the_upload(supervisor, target, outside):
    sup = supervisor
    (target / "conf").symlink_to(outside)
    data = pack([dir_member("conf"), file_member("conf/app.ini", b"[app]\n")])
    assert upload(sup, target, data).status_code == 200
    assert os.listdir(outside) == []
    assert not (target / "conf").is_symlink() and (target / "conf/app.ini").read_bytes() == b"[app]\n"


@pytest.fixture
def private():
    """A directory only root may read (mkdtemp makes it 0700)."""
    path = Path(tempfile.mkdtemp(prefix="flarebox-private-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@needs_root
def test_a_symlink_to_a_directory_the_user_may_not_read_is_refused(supervisor, private):
    sup = supervisor
    (private / "secret").write_text("root's")
    (sup.workspace / "link").symlink_to(private)
    message = error_of(fetch(sup, sup.workspace / "link"), 403, "permission_denied")
    assert "secret" not in message
    error_of(upload(sup, private, pack([file_member("x", b"x")])), 403, "permission_denied")
    assert os.listdir(private) == ["secret"]


@needs_root
def test_unreadable_entries_are_left_out(supervisor):
    sup, src = supervisor, supervisor.workspace / "src"
    src.mkdir()
    (src / "mine.txt").write_text("mine")
    give(sup, src)
    (src / "roots.txt").write_text("root's")  # root's, 0600 and 0700: the sandbox user cannot read them
    os.chmod(src / "roots.txt", 0o600)
    (src / "roots-dir").mkdir(mode=0o700)
    with tarfile.open(fileobj=io.BytesIO(unzstd(download(sup, src)))) as tar:
        assert tar.getnames() == ["mine.txt"]


@needs_root
def test_put_into_a_directory_the_user_may_not_write_is_refused(supervisor, target):
    root_owned = target / "sub"
    os.chown(root_owned, 0, 0)
    assert_refused(supervisor, root_owned, pack([file_member("x", b"x")]), "may not", 403, "permission_denied")
    # an entry the user may not move out of the way (moving a directory needs write access to it): the swap
    # puts back what it had moved
    message = assert_refused(supervisor, target, pack([file_member("x", b"x")]), "", 403, "permission_denied")
    assert "nothing was changed" in message


# --- broken connections -------------------------------------------------------------------------------------------


def test_a_client_that_goes_away_mid_upload_changes_nothing(supervisor, target):
    sup, src = supervisor, supervisor.workspace / "src"
    src.mkdir()
    populate(sup, src)
    data = download(sup, src)
    before = tree(target)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(sup.socket))
        path = str(target).encode()
        head = b"PUT /files/archive?path=%s HTTP/1.1\r\nHost: sv\r\nContent-Length: %d\r\n\r\n" % (path, len(data))
        sock.sendall(head + data[: len(data) // 2])
        time.sleep(0.5)
    assert wait_until(lambda: not _archive_workers(sup), timeout=10)  # the worker (and its zstd) are gone
    assert tree(target) == before
    assert upload(sup, target, data).status_code == 200


def test_a_worker_that_fails_mid_stream_breaks_the_transfer(supervisor):
    sup, src = supervisor, supervisor.workspace / "src"
    src.mkdir()
    for i in range(4):
        (src / f"blob{i}").write_bytes(os.urandom(8 * 1024 * 1024))
    give(sup, src)
    with sup.stream("GET", "/files/archive", params={"path": str(src)}) as response:
        assert response.status_code == 200
        chunks = response.iter_raw()
        next(chunks)
        workers = _archive_workers(sup)
        assert workers
        for pid in workers:
            os.kill(pid, signal.SIGKILL)
        with pytest.raises(httpx.RemoteProtocolError):
            for _ in chunks:
                pass
    assert wait_until(lambda: not _archive_workers(sup), timeout=10)
    assert sup.client.get("/health").status_code == 200
