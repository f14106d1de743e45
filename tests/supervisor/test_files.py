"""GET/PUT /files: streamed, atomic, limited, and with exactly the sandbox user's rights."""

import hashlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

import httpx
import pytest

from .harness import needs_root

pytestmark = pytest.mark.timeout(60)


def _put(supervisor, path, data: bytes, **params):
    return supervisor.client.put("/files", params={"path": str(path), **params}, content=data)


def _code(response) -> str:
    return response.json()["error"]["code"]


def test_put_then_get_round_trips_bytes(supervisor):
    data = os.urandom(3 * 1024 * 1024 + 7)
    target = supervisor.workspace / "deep/new/dirs/blob.bin"
    response = _put(supervisor, target, data, mode="0640")
    assert response.status_code == 200
    assert response.json() == {"path": str(target), "size": len(data)}
    info = target.stat()
    assert stat.S_IMODE(info.st_mode) == 0o640
    assert info.st_uid == supervisor.uid and target.parent.stat().st_uid == supervisor.uid
    got = supervisor.client.get("/files", params={"path": str(target)})
    assert got.status_code == 200
    assert got.headers["content-length"] == str(len(data))
    assert hashlib.sha256(got.content).digest() == hashlib.sha256(data).digest()
    # the temp file was renamed, not left behind
    assert sorted(p.name for p in target.parent.iterdir()) == ["blob.bin"]


def test_put_replaces_atomically_and_default_mode(supervisor):
    target = supervisor.workspace / "f.txt"
    assert _put(supervisor, target, b"old").status_code == 200
    assert _put(supervisor, target, b"new content").status_code == 200
    assert target.read_bytes() == b"new content"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644


def test_put_over_the_limit_leaves_the_target_untouched(supervisor):
    target = supervisor.workspace / "keep.txt"
    _put(supervisor, target, b"original")
    response = _put(supervisor, target, b"x" * 101, max_bytes="100")
    assert response.status_code == 413 and _code(response) == "file_too_large"
    assert target.read_bytes() == b"original"
    assert sorted(p.name for p in supervisor.workspace.iterdir()) == ["keep.txt"]


def test_operator_write_limit(supervisor_factory):
    supervisor = supervisor_factory({"FLAREBOX_MAX_FILE_WRITE_BYTES": "1000", "FLAREBOX_MAX_FILE_READ_BYTES": "10"})
    assert _put(supervisor, supervisor.workspace / "ok", b"y" * 1000).status_code == 200
    response = _put(supervisor, supervisor.workspace / "big", b"y" * 1001)
    assert response.status_code == 413 and _code(response) == "file_too_large"
    assert not (supervisor.workspace / "big").exists()
    # a query cannot raise the operator's limit
    response = _put(supervisor, supervisor.workspace / "big", b"y" * 1001, max_bytes="5000")
    assert response.status_code == 413
    response = supervisor.client.get("/files", params={"path": str(supervisor.workspace / "ok")})
    assert response.status_code == 413 and _code(response) == "file_too_large"


def test_put_without_content_length_is_refused(supervisor):
    def body():
        yield b"chunked"

    response = supervisor.client.put("/files", params={"path": str(supervisor.workspace / "c")}, content=body())
    assert response.status_code == 411 and _code(response) == "length_required"
    assert not (supervisor.workspace / "c").exists()


def test_get_errors(supervisor):
    ws = supervisor.workspace
    (ws / "small").write_bytes(b"0123456789")

    def get(path, **params):
        return supervisor.client.get("/files", params={"path": path, **params})

    cases = [
        (get(str(ws / "missing")), 404, "file_not_found"),
        (get(str(ws / "missing/below")), 404, "file_not_found"),
        (get(str(ws)), 400, "not_a_file"),
        (get("/dev/null"), 400, "not_a_file"),
        (get(str(ws / "small"), max_bytes="9"), 413, "file_too_large"),
        (get("relative/path"), 400, "invalid_path"),
        (get(str(ws) + "/a\x00b"), 400, "invalid_path"),
        (get("/" + "a" * 4096), 400, "invalid_path"),
        (get(str(ws / "small"), max_bytes="-1"), 400, "invalid_query"),
        (get(str(ws / "small"), colour="blue"), 400, "invalid_query"),
        (supervisor.client.get("/files"), 400, "invalid_query"),
    ]
    for response, status, code in cases:
        assert (response.status_code, _code(response)) == (status, code), response.request.url
    assert get(str(ws / "small"), max_bytes="10").content == b"0123456789"


def test_put_errors(supervisor):
    ws = supervisor.workspace
    (ws / "dir").mkdir()
    (ws / "plain").write_bytes(b"")
    cases = [
        (_put(supervisor, ws / "dir", b"x"), 400, "not_a_file"),
        (_put(supervisor, ws / "plain/below", b"x"), 400, "not_a_file"),
        (_put(supervisor, "rel", b"x"), 400, "invalid_path"),
        (_put(supervisor, ws / "m", b"x", mode="999"), 400, "invalid_query"),
    ]
    for response, status, code in cases:
        assert (response.status_code, _code(response)) == (status, code), response.request.url
    assert sorted(p.name for p in ws.iterdir()) == ["dir", "plain"]


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


@needs_root
def test_symlink_cannot_reach_beyond_the_sandbox_user(supervisor, root_only_dir):
    ws = supervisor.workspace
    secret = root_only_dir / "secret"
    os.chmod(root_only_dir, 0o755)  # the directory is traversable; the file itself is root's, 0600
    (ws / "link").symlink_to(secret)
    response = supervisor.client.get("/files", params={"path": str(ws / "link")})
    assert response.status_code == 403 and _code(response) == "permission_denied"
    assert "root only" not in response.text
    # directly, too
    assert supervisor.client.get("/files", params={"path": str(secret)}).status_code == 403
    # writing through a symlinked directory into a directory the user may not write is refused
    (ws / "dirlink").symlink_to(root_only_dir)
    response = _put(supervisor, ws / "dirlink/planted", b"evil")
    assert response.status_code == 403 and _code(response) == "permission_denied"
    assert sorted(p.name for p in root_only_dir.iterdir()) == ["secret"]
    # writing to the file symlink replaces the link in the workspace, never the target
    assert _put(supervisor, ws / "link", b"mine").status_code == 200
    assert secret.read_text() == "root only"
    assert (ws / "link").read_bytes() == b"mine" and not (ws / "link").is_symlink()


@needs_root
def test_a_killed_file_agent_is_replaced(supervisor):
    # the agent runs as the sandbox user, so that user can kill it; file access must keep working
    agents = [pid for pid in _children(supervisor.process.pid) if os.stat(f"/proc/{pid}").st_uid == supervisor.uid]
    assert len(agents) == 1
    os.kill(agents[0], 9)
    (supervisor.workspace / "f").write_bytes(b"still readable")
    response = supervisor.client.get("/files", params={"path": str(supervisor.workspace / "f")})
    assert response.status_code == 200 and response.content == b"still readable"
    assert _put(supervisor, supervisor.workspace / "g", b"and writable").status_code == 200


def _children(ppid: int) -> list[int]:
    children = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                stat_line = Path(f"/proc/{name}/stat").read_bytes()
            except OSError:
                continue
            if int(stat_line[stat_line.rfind(b")") + 2 :].split(b" ")[1]) == ppid:
                children.append(int(name))
    return children


def test_a_file_that_shrinks_during_get_breaks_the_connection(supervisor):
    target = supervisor.workspace / "shrinking"
    size = 200 * 1024 * 1024
    with open(target, "wb") as f:
        f.truncate(size)  # sparse: cheap to make
    received = 0
    with pytest.raises(httpx.RemoteProtocolError):
        with supervisor.stream("GET", "/files", params={"path": str(target)}) as response:
            assert response.headers["content-length"] == str(size)
            chunks = response.iter_raw()
            received += len(next(chunks))
            os.truncate(target, 1000)  # the promised length can no longer be met
            for chunk in chunks:
                received += len(chunk)
    assert received < size  # never a silently short "success"
    assert supervisor.client.get("/health").status_code == 200
