"""GET/PUT /files on files that are not plain regular files with a known size (issue 17): empty files, procfs
files (size 0, content readable), and devices, sockets and FIFOs (refused with 400 not_a_file, never replaced)."""

import os
import socket
import stat

import pytest

pytestmark = pytest.mark.timeout(60)


def _get(supervisor, path, **params):
    return supervisor.client.get("/files", params={"path": str(path), **params})


def _put(supervisor, path, data: bytes):
    return supervisor.client.put("/files", params={"path": str(path)}, content=data)


def _code(response) -> str:
    return response.json()["error"]["code"]


def test_an_empty_download_leaves_the_connection_usable(supervisor):
    empty, small = supervisor.workspace / "empty", supervisor.workspace / "small"
    assert _put(supervisor, empty, b"").status_code == 200
    assert _put(supervisor, small, b"abc").status_code == 200
    got = _get(supervisor, empty)
    assert (got.status_code, got.headers["content-length"], got.content) == (200, "0", b"")
    # the same pooled connection serves the next requests at once
    for _ in range(20):
        assert _get(supervisor, small).content == b"abc"
        assert _get(supervisor, empty).content == b""


def test_a_proc_file_comes_back_with_its_content(supervisor):
    assert os.stat("/proc/self/status").st_size == 0  # what made it download empty
    got = _get(supervisor, "/proc/self/status")
    assert got.status_code == 200
    assert got.content.startswith(b"Name:") and b"\nPid:" in got.content
    assert got.headers["content-length"] == str(len(got.content))
    too_small = _get(supervisor, "/proc/self/status", max_bytes="10")
    assert (too_small.status_code, _code(too_small)) == (413, "file_too_large")


@pytest.fixture
def special_files(supervisor):
    """A unix socket, a FIFO and (as root) a character device, in a directory the sandbox user may write."""
    ws = supervisor.workspace
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(ws / "sock"))
    os.mkfifo(ws / "fifo")
    paths = {"sock": ws / "sock", "fifo": ws / "fifo"}
    if os.geteuid() == 0:
        os.mknod(ws / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        paths["null"] = ws / "null"
    try:
        yield paths
    finally:
        listener.close()


def test_special_files_are_not_files(supervisor, special_files):
    for path in [*special_files.values(), "/dev/null"]:
        got = _get(supervisor, path)
        assert (got.status_code, _code(got)) == (400, "not_a_file"), path
        put = _put(supervisor, path, b"x")
        assert (put.status_code, _code(put)) == (400, "not_a_file"), path
    for path in special_files.values():  # still there, not replaced by a regular file
        assert not stat.S_ISREG(os.lstat(path).st_mode)
    assert sorted(p.name for p in supervisor.workspace.iterdir()) == sorted(special_files)
