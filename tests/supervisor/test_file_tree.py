"""GET /files/list and /files/stat, DELETE /files, POST /files/move and /files/mkdir: order and paging, every error
code, protected directories, and (as root) exactly the sandbox user's rights, symlinks included."""

import calendar
import errno
import os
import pwd
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from flarebox_supervisor import treeops
from protocol.errors import ProtocolError

from .harness import IS_ROOT, SANDBOX_USER, needs_root

pytestmark = pytest.mark.timeout(60)


def _code(response) -> str:
    return response.json()["error"]["code"]


def _list(supervisor, path, **params):
    return supervisor.client.get("/files/list", params={"path": str(path), **params})


def _stat(supervisor, path):
    return supervisor.client.get("/files/stat", params={"path": str(path)})


def _delete(supervisor, path, **params):
    return supervisor.client.delete("/files", params={"path": str(path), **params})


def _move(supervisor, source, target, **fields):
    return supervisor.client.post("/files/move", json={"from": str(source), "to": str(target), **fields})


def _mkdir(supervisor, path, **fields):
    return supervisor.client.post("/files/mkdir", json={"path": str(path), **fields})


def _relative(response, top) -> list[str]:
    assert response.status_code == 200, response.text
    prefix = f"{top}/"
    paths = [entry["path"] for entry in response.json()["entries"]]
    assert all(path.startswith(prefix) for path in paths)
    return [path[len(prefix) :] for path in paths]


def _pages(supervisor, top, limit: int, depth: int) -> list[list[str]]:
    pages, cursor = [], None
    while True:
        params = {"depth": str(depth), "limit": str(limit), **({"cursor": cursor} if cursor else {})}
        response = _list(supervisor, top, **params)
        page = _relative(response, top)
        cursor = response.json()["cursor"]
        pages.append(page)
        if cursor is None:
            return pages
        assert cursor == page[-1]  # the last entry's path relative to the listed directory


def _reference(top: Path, depth: int) -> list[str]:
    """The expected order, computed independently: depth first, names sorted as bytes, a directory first."""
    found = []

    def walk(directory: bytes, prefix: bytes, level: int) -> None:
        for name in sorted(os.listdir(directory)):
            found.append((prefix + name).decode())
            path = os.path.join(directory, name)
            if level < depth and stat.S_ISDIR(os.lstat(path).st_mode):
                walk(path, prefix + name + b"/", level + 1)

    walk(os.fsencode(top), b"", 1)
    return found


def _give(supervisor) -> None:
    """Hand what the test made in the workspace (as root, when the tests run as root) to the sandbox user, who
    needs it to be theirs to delete or move it."""
    for directory, dirnames, filenames in os.walk(supervisor.workspace):
        for name in dirnames + filenames:
            os.lchown(os.path.join(directory, name), supervisor.uid, -1)


def _tree(root: Path) -> None:
    for directory in ["a/y/deep", "m/n", "empty"]:
        (root / directory).mkdir(parents=True)
    for file in ["a/x", "a/y/z", "a/y/deep/w", "a-b", "a.txt", "B", "é", "m/n/1", "m/n/2", "zz"]:
        (root / file).write_text(file)
    for i in range(10):
        (root / f"m/f{i}").write_text("")
    (root / "l").symlink_to("a")


# --- listing ----------------------------------------------------------------------------------------------------


def test_list_entries_and_their_order(supervisor):
    ws = supervisor.workspace
    _tree(ws)
    (ws / "b").write_text("hello")
    os.chmod(ws / "b", 0o640)
    mtime = calendar.timegm((2026, 11, 29, 9, 0, 0)) * 10**9 + 123_456_789
    os.utime(ws / "b", ns=(mtime, mtime))
    os.chmod(ws / "empty", 0o1777)
    os.mkfifo(ws / "p")
    response = _list(supervisor, ws)
    assert response.status_code == 200
    body = response.json()
    assert body["path"] == str(ws) and body["cursor"] is None
    # bytes order: "B" < "a" < "a-b" < "a.txt" < "b"; "é" (0xc3 0xa9) after every ASCII name
    names = [entry["name"] for entry in body["entries"]]
    assert names == ["B", "a", "a-b", "a.txt", "b", "empty", "l", "m", "p", "zz", "é"]
    entries = {entry["name"]: entry for entry in body["entries"]}
    assert entries["b"] == {
        "path": str(ws / "b"),
        "name": "b",
        "type": "file",
        "size": 5,
        "mode": "0640",
        "mtime": "2026-11-29T09:00:00.123Z",
    }
    assert entries["a"]["type"] == "directory" and entries["empty"]["mode"] == "1777"
    assert entries["l"]["type"] == "symlink" and entries["l"]["target"] == "a" and entries["l"]["size"] == 1
    assert entries["p"]["type"] == "other"
    assert all("target" not in entry for name, entry in entries.items() if name != "l")
    # deeper: a directory before its contents, depth first (not sorted by whole paths: "a-b" comes after "a/…"),
    # never into the symlink "l", and no deeper than asked
    full = _relative(_list(supervisor, ws, depth="3", limit="10000"), ws)
    assert full == _reference(ws, 3)
    assert full[:6] == ["B", "a", "a/x", "a/y", "a/y/deep", "a/y/z"] and full[6] == "a-b"
    assert "a/y/deep/w" not in full and not any(path.startswith("l/") for path in full)
    assert _relative(_list(supervisor, ws, depth="4", limit="10000"), ws) == _reference(ws, 4)


def test_list_normalizes_the_path_and_lists_a_symlinked_directory_under_its_own_name(supervisor):
    ws = supervisor.workspace
    _tree(ws)
    body = _list(supervisor, f"/{ws}/m/../a/").json()
    assert body["path"] == str(ws / "a")
    assert [entry["path"] for entry in body["entries"]] == [str(ws / "a/x"), str(ws / "a/y")]
    # the listed path itself resolves like any file route's path; below it nothing is followed
    assert [entry["path"] for entry in _list(supervisor, ws / "l").json()["entries"]] == [
        str(ws / "l/x"),
        str(ws / "l/y"),
    ]


@pytest.mark.parametrize("depth", [1, 3])
def test_pages_concatenate_to_the_full_listing(supervisor, depth):
    ws = supervisor.workspace
    _tree(ws)
    full = _reference(ws, depth)
    assert _relative(_list(supervisor, ws, depth=str(depth), limit="10000"), ws) == full
    open_fds = len(os.listdir(f"/proc/{supervisor.process.pid}/fd"))
    for limit in (1, 2, 5, 7, len(full), len(full) - 1):
        pages = _pages(supervisor, ws, limit, depth)
        assert [path for page in pages for path in page] == full, limit
        assert all(len(page) == limit for page in pages[:-1]) and 1 <= len(pages[-1]) <= limit
    # exactly one full page: no cursor, as nothing remains
    assert len(_pages(supervisor, ws, len(full), depth)) == 1
    assert len(os.listdir(f"/proc/{supervisor.process.pid}/fd")) == open_fds  # every page's memfd was closed


def test_a_cursor_continues_after_its_path_not_after_a_count(supervisor):
    ws = supervisor.workspace
    for path in ["a/x", "a/y", "b", "c"]:
        (ws / path).parent.mkdir(exist_ok=True)
        (ws / path).write_text("")
    first = _list(supervisor, ws, depth="2", limit="3").json()
    assert [entry["name"] for entry in first["entries"]] == ["a", "x", "y"] and first["cursor"] == "a/y"
    # between pages: the cursor's own entry goes, one appears before it and one after
    (ws / "a/y").unlink()
    (ws / "a/0").write_text("")
    (ws / "a/z").write_text("")
    second = _list(supervisor, ws, depth="2", limit="3", cursor=first["cursor"])
    assert _relative(second, ws) == ["a/z", "b", "c"] and second.json()["cursor"] is None
    # a cursor naming a directory continues inside it; one deeper than depth just moves on
    assert _relative(_list(supervisor, ws, depth="2", cursor="a"), ws) == ["a/0", "a/x", "a/z", "b", "c"]
    assert _relative(_list(supervisor, ws, depth="1", cursor="a/x"), ws) == ["b", "c"]
    assert _relative(_list(supervisor, ws, depth="2", cursor="gone/deeper"), ws) == []


@pytest.fixture
def big_dir(supervisor):
    """A directory of 100,000 empty files, on tmpfs where there is one (a disk's journal makes them ten times
    slower to create), readable by the sandbox user."""
    shm = "/dev/shm"  # noqa: S108 - a private directory is made in it
    path = Path(tempfile.mkdtemp(prefix="flarebox-big-", dir=shm if os.path.isdir(shm) else supervisor.workspace))
    os.chmod(path, 0o755)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(100_000):
            os.close(os.open(f"f{i:06d}", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.timeout(180)
def test_a_directory_of_100000_files_pages(supervisor, big_dir):
    big = big_dir
    # a page of 10,000 entries is far more than one message of the file agent's socket (64 KiB)
    pages = _pages(supervisor, big, 10_000, 1)
    assert [len(page) for page in pages] == [10_000] * 10  # the last full page still ends with cursor null
    assert [name for page in pages for name in page] == [f"f{i:06d}" for i in range(100_000)]


def test_names_that_are_not_utf8_are_skipped(supervisor):
    ws = os.fsencode(supervisor.workspace)
    os.close(os.open(ws + b"/bad\xff", os.O_WRONLY | os.O_CREAT, 0o644))
    os.mkdir(ws + b"/dir\xfe")
    os.close(os.open(ws + b"/dir\xfe/inside", os.O_WRONLY | os.O_CREAT, 0o644))
    os.symlink(b"to\xffwhere", ws + b"/link")
    (supervisor.workspace / "good").write_text("")
    response = _list(supervisor, supervisor.workspace, depth="3")
    assert response.status_code == 200
    entries = response.json()["entries"]
    assert [entry["name"] for entry in entries] == ["good", "link"]
    assert entries[1]["target"] == "to\ufffdwhere"
    assert _stat(supervisor, supervisor.workspace / "link").json()["target"] == "to\ufffdwhere"


def test_an_unreadable_subdirectory_is_listed_but_not_entered(supervisor):
    ws = supervisor.workspace
    (ws / "closed").mkdir()
    (ws / "closed/hidden").write_text("")
    (ws / "open").mkdir()
    (ws / "open/seen").write_text("")
    os.chmod(ws / "closed", 0)  # as root the directory is root's, so the sandbox user cannot read it either
    try:
        response = _list(supervisor, ws, depth="2")
        assert _relative(response, ws) == ["closed", "open", "open/seen"]
        assert response.json()["entries"][0]["mode"] == "0000"
    finally:
        os.chmod(ws / "closed", 0o755)


def test_list_errors(supervisor):
    ws = supervisor.workspace
    (ws / "file").write_text("")
    cases = [
        (_list(supervisor, ws / "file"), 400, "not_a_directory"),
        (_list(supervisor, "/dev/null"), 400, "not_a_directory"),
        (_list(supervisor, ws / "missing"), 404, "file_not_found"),
        (_list(supervisor, ws / "missing/below"), 404, "file_not_found"),
        (_list(supervisor, ws / "file/below"), 404, "file_not_found"),
        (_list(supervisor, "relative"), 400, "invalid_path"),
        (supervisor.client.get("/files/list"), 400, "invalid_query"),
        (_list(supervisor, ws, colour="blue"), 400, "invalid_query"),
        (supervisor.client.get("/files/list", params=[("path", str(ws)), ("path", str(ws))]), 400, "invalid_query"),
    ]
    for params in [{"depth": "0"}, {"depth": "33"}, {"limit": "0"}, {"limit": "10001"}, {"limit": "x"}]:
        cases.append((_list(supervisor, ws, **params), 400, "invalid_query"))
    for cursor in ["/abs", "../up", "a//b", "a/./b", ""]:
        cases.append((_list(supervisor, ws, cursor=cursor), 400, "invalid_query"))
    for response, status, code in cases:
        assert (response.status_code, _code(response)) == (status, code), response.request.url
    assert "GET /files/stat" in _list(supervisor, ws / "file").json()["error"]["message"]
    assert _list(supervisor, ws, depth="32", limit="10000").status_code == 200


# --- stat -------------------------------------------------------------------------------------------------------


def test_stat(supervisor):
    ws = supervisor.workspace
    (ws / "d").mkdir()
    os.chmod(ws / "d", 0o750)
    (ws / "f").write_bytes(b"12345")
    (ws / "dangling").symlink_to("/nowhere/at/all")
    directory = _stat(supervisor, ws / "d").json()
    assert (directory["type"], directory["mode"], directory["name"]) == ("directory", "0750", "d")
    got = _stat(supervisor, f"{ws}/d/../f")
    assert got.status_code == 200
    assert {k: got.json()[k] for k in ("path", "name", "type", "size")} == {
        "path": str(ws / "f"),
        "name": "f",
        "type": "file",
        "size": 5,
    }
    link = _stat(supervisor, ws / "dangling").json()  # lstat: the link itself, even with nothing behind it
    assert (link["type"], link["target"], link["size"]) == ("symlink", "/nowhere/at/all", len("/nowhere/at/all"))
    assert _stat(supervisor, "/").json()["name"] == "/"
    # the same entry a listing gives
    assert _stat(supervisor, ws / "f").json() in _list(supervisor, ws).json()["entries"]
    cases = [
        (_stat(supervisor, ws / "missing"), 404, "file_not_found"),
        (_stat(supervisor, ws / "f/below"), 404, "file_not_found"),
        (_stat(supervisor, "rel"), 400, "invalid_path"),
        (supervisor.client.get("/files/stat", params={"path": str(ws), "depth": "1"}), 400, "invalid_query"),
        (supervisor.client.get("/files/stat"), 400, "invalid_query"),
    ]
    for response, status, code in cases:
        assert (response.status_code, _code(response)) == (status, code), response.request.url


# --- delete -----------------------------------------------------------------------------------------------------


def test_delete_files_directories_and_trees(supervisor):
    ws = supervisor.workspace
    (ws / "f").write_text("")
    (ws / "empty").mkdir()
    (ws / "tree/sub").mkdir(parents=True)
    (ws / "tree/sub/file").write_text("")
    _give(supervisor)
    response = _delete(supervisor, f"{ws}/empty/../f")
    assert response.status_code == 200 and response.json() == {"path": str(ws / "f"), "deleted": True}
    assert not (ws / "f").exists()
    assert _delete(supervisor, ws / "empty").status_code == 200 and not (ws / "empty").exists()
    refused = _delete(supervisor, ws / "tree")
    assert (refused.status_code, _code(refused)) == (409, "directory_not_empty")
    assert (ws / "tree/sub/file").exists()
    assert _delete(supervisor, ws / "tree", recursive="false").status_code == 409
    assert _delete(supervisor, ws / "tree", recursive="true").json() == {"path": str(ws / "tree"), "deleted": True}
    assert sorted(ws.iterdir()) == []
    cases = [
        (_delete(supervisor, ws / "f"), 404, "file_not_found"),
        (_delete(supervisor, ws / "missing/below", recursive="true"), 404, "file_not_found"),
        (_delete(supervisor, "rel"), 400, "invalid_path"),
        (_delete(supervisor, ws / "x", recursive="yes"), 400, "invalid_query"),
        (_delete(supervisor, ws / "x", force="true"), 400, "invalid_query"),
        (supervisor.client.delete("/files"), 400, "invalid_query"),
    ]
    for response, status, code in cases:
        assert (response.status_code, _code(response)) == (status, code), response.request.url


def test_deleting_a_symlink_removes_only_the_link(supervisor):
    ws = supervisor.workspace
    (ws / "target").mkdir()
    (ws / "target/keep").write_text("kept")
    (ws / "dirlink").symlink_to(ws / "target")
    (ws / "filelink").symlink_to(ws / "target/keep")
    (ws / "dirlink2").symlink_to("target")
    _give(supervisor)
    assert _delete(supervisor, ws / "filelink").status_code == 200
    assert _delete(supervisor, ws / "dirlink", recursive="true").status_code == 200
    # a trailing slash is normalized away: still the link, not the directory it points to
    assert _delete(supervisor, f"{ws}/dirlink2/", recursive="true").json()["path"] == str(ws / "dirlink2")
    assert sorted(p.name for p in ws.iterdir()) == ["target"]
    assert (ws / "target/keep").read_text() == "kept"


@pytest.fixture
def outside(supervisor):
    """A directory outside the workspace that the sandbox user owns (so following a link into it would delete)."""
    path = Path(tempfile.mkdtemp(prefix="flarebox-outside-"))
    (path / "sub").mkdir()
    (path / "file").write_text("outside")
    (path / "sub/deep").write_text("outside")
    os.chmod(path, 0o755)
    for p in [path, path / "sub", path / "file", path / "sub/deep"]:
        os.chown(p, supervisor.uid, -1)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_recursive_delete_never_follows_symlinks_out_of_the_tree(supervisor, outside):
    ws = supervisor.workspace
    (ws / "tree/inner").mkdir(parents=True)
    (ws / "tree/inner/dirlink").symlink_to(outside)
    (ws / "tree/filelink").symlink_to(outside / "file")
    (ws / "tree/sublink").symlink_to(outside / "sub")
    _give(supervisor)
    assert _delete(supervisor, ws / "tree", recursive="true").status_code == 200
    assert not (ws / "tree").exists()
    assert (outside / "file").read_text() == "outside" and (outside / "sub/deep").read_text() == "outside"
    # nor does a listing enter them
    (ws / "again").symlink_to(outside)
    assert _relative(_list(supervisor, ws, depth="5"), ws) == ["again"]


def _home() -> str:
    return pwd.getpwnam(SANDBOX_USER).pw_dir if IS_ROOT else pwd.getpwuid(os.getuid()).pw_dir


def test_protected_directories_are_never_deleted(supervisor):
    ws = supervisor.workspace
    (ws / "sub").mkdir()
    (ws / "sub/keep").write_text("")
    name = ws.name
    for path in [ws, f"{ws}/", f"{ws}/.", f"{ws}/sub/..", f"/{ws}", f"{ws}/sub/../../{name}"]:
        response = _delete(supervisor, path, recursive="true")
        assert (response.status_code, _code(response)) == (400, "path_protected"), path
        assert "inside" in response.json()["error"]["message"]
    # not recursive here: an implementation that let these through must not take the machine with it
    for path in ["/", "//", "/.", ws.parent, _home()]:
        response = _delete(supervisor, path)
        assert (response.status_code, _code(response)) == (400, "path_protected"), path
    # another name for the workspace (through a symlinked parent) is refused by identity
    (ws / "up").symlink_to(ws.parent)
    _give(supervisor)
    response = _delete(supervisor, ws / "up" / name, recursive="true")
    assert (response.status_code, _code(response)) == (400, "path_protected")
    assert (ws / "sub/keep").exists()
    # what is inside is fine, and so is the link itself
    assert _delete(supervisor, ws / "up").status_code == 200
    assert _delete(supervisor, ws / "sub", recursive="true").status_code == 200
    assert list(ws.iterdir()) == []


# --- move -------------------------------------------------------------------------------------------------------


def test_move_files_directories_and_symlinks(supervisor):
    ws = supervisor.workspace
    (ws / "f").write_text("content")
    (ws / "d/sub").mkdir(parents=True)
    (ws / "d/sub/x").write_text("x")
    (ws / "link").symlink_to("d")
    _give(supervisor)
    response = _move(supervisor, ws / "f", f"{ws}/d/../g")
    assert response.status_code == 200 and response.json() == {"from": str(ws / "f"), "to": str(ws / "g")}
    assert (ws / "g").read_text() == "content" and not (ws / "f").exists()
    assert _move(supervisor, ws / "d", ws / "e").status_code == 200
    assert (ws / "e/sub/x").read_text() == "x"
    # a symlink moves as itself: it now points at "d", which is gone, and e is untouched
    assert _move(supervisor, ws / "link", ws / "e/link").status_code == 200
    assert os.readlink(ws / "e/link") == "d" and (ws / "e/sub/x").exists()


def test_move_replaces_only_with_overwrite(supervisor):
    ws = supervisor.workspace
    (ws / "a").write_text("a")
    (ws / "b").write_text("b")
    _give(supervisor)
    refused = _move(supervisor, ws / "a", ws / "b")
    assert (refused.status_code, _code(refused)) == (409, "file_exists")
    assert "overwrite" in refused.json()["error"]["message"]
    assert (ws / "a").read_text() == "a" and (ws / "b").read_text() == "b"
    assert _move(supervisor, ws / "a", ws / "b", overwrite=True).status_code == 200
    assert (ws / "b").read_text() == "a" and not (ws / "a").exists()
    # directories: an empty one can be replaced, a non-empty one cannot, nor can another kind
    (ws / "src").mkdir()
    (ws / "src/s").write_text("")
    (ws / "empty").mkdir()
    (ws / "full").mkdir()
    (ws / "full/keep").write_text("")
    _give(supervisor)
    full = _move(supervisor, ws / "src", ws / "full", overwrite=True)
    assert (full.status_code, _code(full)) == (409, "directory_not_empty")
    file_over_dir = _move(supervisor, ws / "b", ws / "empty", overwrite=True)
    assert (file_over_dir.status_code, _code(file_over_dir)) == (409, "file_exists")
    dir_over_file = _move(supervisor, ws / "src", ws / "b", overwrite=True)
    assert (dir_over_file.status_code, _code(dir_over_file)) == (409, "file_exists")
    assert (ws / "b").read_text() == "a" and (ws / "full/keep").exists() and (ws / "src/s").exists()
    assert _move(supervisor, ws / "src", ws / "empty").status_code == 409  # without overwrite
    assert _move(supervisor, ws / "src", ws / "empty", overwrite=True).status_code == 200
    assert (ws / "empty/s").exists() and not (ws / "src").exists()


def test_move_errors(supervisor):
    ws = supervisor.workspace
    (ws / "d/sub").mkdir(parents=True)
    (ws / "f").write_text("")
    (ws / "alias").symlink_to("d")
    _give(supervisor)
    before = _reference(ws, 5)
    cases = [
        (_move(supervisor, ws / "missing", ws / "x"), 404, "file_not_found"),
        (_move(supervisor, ws / "f", ws / "no/such/dir/f"), 404, "file_not_found"),
        (_move(supervisor, ws / "f", ws / "f/below"), 404, "file_not_found"),
        (_move(supervisor, ws / "d", ws / "d/sub/d"), 400, "invalid_move"),
        (_move(supervisor, ws / "d", ws / "d/inside"), 400, "invalid_move"),
        # the same through a symlink: only the kernel can tell
        (_move(supervisor, ws / "d", ws / "alias/inside"), 400, "invalid_move"),
        (_move(supervisor, ws / "d", f"{ws}/d/"), 400, "invalid_move"),
        (_move(supervisor, ws / "f", ws / "f", overwrite=True), 400, "invalid_move"),
        (_move(supervisor, ws / "d", ws / "alias/..", overwrite=True), 400, "path_protected"),
        (_move(supervisor, "rel", ws / "x"), 400, "invalid_path"),
        (_move(supervisor, ws / "f", "rel"), 400, "invalid_path"),
        (_move(supervisor, ws / "f", ws / "x", overwrite="yes"), 400, "invalid_field"),
        (_move(supervisor, ws / "f", ws / "x", force=True), 400, "unknown_field"),
        (supervisor.client.post("/files/move", json={"from": str(ws / "f")}), 400, "invalid_path"),
        (supervisor.client.post("/files/move", content=b"[1]", headers={"Content-Type": "application/json"}), 400,
         "invalid_json"),
        (supervisor.client.post("/files/move", params={"x": "1"}, json={"from": "/a", "to": "/b"}), 400,
         "invalid_query"),
        (supervisor.client.post("/files/move", content=b"{}"), 415, "unsupported_media_type"),
    ]  # fmt: skip
    for response, status, code in cases:
        assert (response.status_code, _code(response)) == (status, code), response.request.content
    assert "mkdir" in _move(supervisor, ws / "f", ws / "no/f").json()["error"]["message"]
    assert _reference(ws, 5) == before  # nothing changed


def test_protected_directories_are_never_moved_or_replaced(supervisor):
    ws = supervisor.workspace
    (ws / "f").write_text("")
    (ws / "up").symlink_to(ws.parent)
    _give(supervisor)
    for source, target in [
        (ws, ws.parent / "elsewhere"),
        (f"{ws}/.", ws / "x"),
        ("/", ws / "root"),
        (ws.parent, "/moved"),
        (_home(), ws / "home"),
        (ws / "up" / ws.name, ws / "x"),  # by identity
        (ws / "f", ws),
        (ws / "f", ws / "up" / ws.name),
        (ws / "f", _home()),
    ]:
        response = _move(supervisor, source, target, overwrite=True)
        assert (response.status_code, _code(response)) == (400, "path_protected"), (source, target)
    assert sorted(p.name for p in ws.iterdir()) == ["f", "up"]


def test_a_move_across_filesystems_is_refused(supervisor):
    shm = "/dev/shm"  # noqa: S108 - a private directory is made in it, only to be on another filesystem
    if not os.path.isdir(shm) or os.stat(shm).st_dev == os.stat(supervisor.workspace).st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the workspace")
    other = Path(tempfile.mkdtemp(prefix="flarebox-xdev-", dir=shm))
    try:
        (other / "f").write_text("elsewhere")
        os.chown(other, supervisor.uid, -1)
        response = _move(supervisor, other / "f", supervisor.workspace / "f")
        assert (response.status_code, _code(response)) == (400, "invalid_move")
        assert "filesystem" in response.json()["error"]["message"]
        assert (other / "f").read_text() == "elsewhere" and not (supervisor.workspace / "f").exists()
    finally:
        shutil.rmtree(other, ignore_errors=True)


# --- mkdir ------------------------------------------------------------------------------------------------------


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_mkdir(supervisor):
    ws = supervisor.workspace
    response = _mkdir(supervisor, f"{ws}/x/../new/")
    assert response.status_code == 201 and response.json() == {"path": str(ws / "new"), "created": True}
    assert _mode(ws / "new") == 0o755 and os.stat(ws / "new").st_uid == supervisor.uid
    # the mode holds exactly: the agent's umask (022) would take group write away, and 4755 loses setuid
    assert _mkdir(supervisor, ws / "shared", mode="0775").status_code == 201 and _mode(ws / "shared") == 0o775
    assert _mkdir(supervisor, ws / "sticky", mode="1777").status_code == 201 and _mode(ws / "sticky") == 0o1777
    assert _mkdir(supervisor, ws / "plain", mode="4755").status_code == 201 and _mode(ws / "plain") == 0o755
    # parents: every directory made gets the mode, even one without write or search permission for its owner
    response = _mkdir(supervisor, ws / "p/q/r", parents=True, mode="0500")
    assert (response.status_code, response.json()["created"]) == (201, True)
    try:
        assert [_mode(ws / p) for p in ["p", "p/q", "p/q/r"]] == [0o500] * 3
    finally:
        for p in ["p", "p/q", "p/q/r"]:
            os.chmod(ws / p, 0o755)
    # an existing directory: fine with parents (mkdir -p), a conflict without
    again = _mkdir(supervisor, ws / "p/q", parents=True)
    assert (again.status_code, again.json()) == (200, {"path": str(ws / "p/q"), "created": False})
    assert _mode(ws / "p/q") == 0o755  # an existing directory's mode is left alone
    (ws / "file").write_text("")
    (ws / "dangling").symlink_to("nowhere")
    cases = [
        (_mkdir(supervisor, ws / "p/q"), 409, "file_exists"),
        (_mkdir(supervisor, ws / "file"), 409, "file_exists"),
        (_mkdir(supervisor, ws / "file", parents=True), 409, "file_exists"),
        (_mkdir(supervisor, ws / "dangling", parents=True), 409, "file_exists"),
        (_mkdir(supervisor, ws / "a/b"), 404, "file_not_found"),
        (_mkdir(supervisor, ws / "file/below", parents=True), 400, "not_a_directory"),
        (_mkdir(supervisor, ws / "file/below/deeper"), 400, "not_a_directory"),
        (_mkdir(supervisor, "rel"), 400, "invalid_path"),
        (_mkdir(supervisor, ws / "m", mode="999"), 400, "invalid_field"),
        (_mkdir(supervisor, ws / "m", mode=755), 400, "invalid_field"),
        (_mkdir(supervisor, ws / "m", parents="yes"), 400, "invalid_field"),
        (_mkdir(supervisor, ws / "m", owner="me"), 400, "unknown_field"),
        (supervisor.client.post("/files/mkdir", params={"p": "1"}, json={"path": str(ws / "m")}), 400, "invalid_query"),
    ]
    for response, status, code in cases:
        assert (response.status_code, _code(response)) == (status, code), response.request.content
    assert "parents=true" in _mkdir(supervisor, ws / "a/b").json()["error"]["message"]
    assert not (ws / "a").exists() and not (ws / "m").exists()


# --- the sandbox user's rights ----------------------------------------------------------------------------------


@pytest.fixture
def root_only_dir():
    """A directory only root can enter, with a secret file inside."""
    path = Path(tempfile.mkdtemp(prefix="flarebox-root-"))
    (path / "secret").write_text("root only")
    os.chmod(path / "secret", 0o600)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _denied(response) -> bool:
    return (response.status_code, _code(response)) == (403, "permission_denied")


@needs_root
def test_a_symlink_to_a_root_only_directory_opens_nothing(supervisor, root_only_dir):
    ws = supervisor.workspace
    (ws / "dirlink").symlink_to(root_only_dir)
    assert _denied(_list(supervisor, ws / "dirlink"))
    assert _denied(_list(supervisor, root_only_dir))
    assert _denied(_stat(supervisor, ws / "dirlink/secret"))
    assert _stat(supervisor, ws / "dirlink").json()["target"] == str(root_only_dir)  # the link itself is the user's
    assert _denied(_delete(supervisor, ws / "dirlink/secret"))
    assert _denied(_move(supervisor, ws / "dirlink/secret", ws / "stolen"))
    assert _denied(_move(supervisor, root_only_dir / "secret", ws / "stolen"))
    assert _denied(_mkdir(supervisor, ws / "dirlink/planted"))
    assert _denied(_mkdir(supervisor, ws / "dirlink/planted/deep", parents=True))
    (ws / "f").write_text("")
    assert _denied(_move(supervisor, ws / "f", ws / "dirlink/f"))
    assert _delete(supervisor, ws / "dirlink", recursive="true").status_code == 200
    assert sorted(p.name for p in root_only_dir.iterdir()) == ["secret"]
    assert (root_only_dir / "secret").read_text() == "root only"
    assert sorted(p.name for p in ws.iterdir()) == ["f"]


@needs_root
def test_a_readable_symlinked_directory_is_not_descended(supervisor, root_only_dir):
    ws = supervisor.workspace
    os.chmod(root_only_dir, 0o755)  # readable by anyone now: a listing could follow the link, but must not
    (ws / "sub").mkdir()
    (ws / "sub/link").symlink_to(root_only_dir)
    assert _relative(_list(supervisor, ws, depth="4"), ws) == ["sub", "sub/link"]


@needs_root
def test_what_the_sandbox_user_may_not_delete_stays(supervisor):
    ws = supervisor.workspace
    (ws / "tree/theirs").mkdir(parents=True)
    (ws / "tree/theirs/file").write_text("")
    os.chown(ws / "tree", supervisor.uid, -1)  # the user's directory, holding one of root's
    response = _delete(supervisor, ws / "tree", recursive="true")
    assert _denied(response) and "theirs" in response.json()["error"]["message"]
    assert (ws / "tree/theirs/file").exists()
    (ws / "sticky").mkdir()
    os.chmod(ws / "sticky", 0o1777)  # root's, writable by all, sticky: only a file's owner deletes or moves it
    (ws / "sticky/rootfile").write_text("")
    assert _denied(_delete(supervisor, ws / "sticky/rootfile"))
    assert _denied(_move(supervisor, ws / "sticky/rootfile", ws / "sticky/mine"))
    assert sorted(p.name for p in (ws / "sticky").iterdir()) == ["rootfile"]


# --- units (the operations in-process, as the unprivileged supervisor runs them) ---------------------------------


def test_a_full_disk_is_storage_full(tmp_path, monkeypatch):
    def full(path, mode=0o777):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(treeops.os, "mkdir", full)
    with pytest.raises(ProtocolError) as caught:
        treeops.make_dir(str(tmp_path / "new"), False, 0o755)
    assert caught.value.code == "storage_full"


@pytest.mark.parametrize("atomic", [True, False], ids=["renameat2", "fallback"])
def test_a_rename_without_overwrite_never_replaces(tmp_path, monkeypatch, atomic):
    # the route checks first, so only this catches a target that appears in between (or the fallback's absence)
    assert treeops._renameat2 is not None  # glibc 2.28 and later
    if not atomic:
        monkeypatch.setattr(treeops, "_renameat2", None)
    (tmp_path / "a").write_text("a")
    (tmp_path / "b").write_text("b")
    (tmp_path / "d").mkdir()
    (tmp_path / "empty").mkdir()  # rename(2) would replace an empty directory
    for source, target in [("a", "b"), ("d", "empty")]:
        with pytest.raises(FileExistsError):
            treeops._rename_noreplace(str(tmp_path / source), str(tmp_path / target))
    assert (tmp_path / "b").read_text() == "b" and (tmp_path / "d").is_dir() and (tmp_path / "empty").is_dir()
    treeops.move(str(tmp_path / "a"), str(tmp_path / "c"), False, ["/"])
    assert (tmp_path / "c").read_text() == "a" and not (tmp_path / "a").exists()


def test_the_page_travels_in_a_memfd(tmp_path):
    for i in range(500):
        (tmp_path / f"{i:04d}-{'x' * 100}").write_text("")
    result, fd = treeops.list_page(str(tmp_path), 1, 10_000, None)
    try:
        assert result == {"cursor": None}  # the small answer: what the agent's socket carries
        assert os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:flarebox-list")
        assert os.fstat(fd).st_size > 64 * 1024  # more than one message of the agent's socket
        assert not os.get_inheritable(fd)  # MFD_CLOEXEC: no command started meanwhile inherits it
    finally:
        os.close(fd)
