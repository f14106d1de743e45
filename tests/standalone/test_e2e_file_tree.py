"""The file tree, directory archives and processes through a real server and sandbox (issue 14): every route as the
sandbox user, the refusals that protect the workspace, an archive round trip with identical files, a sleeping
workspace's processes without waking it, and a background job listed and signalled."""

import io
import json
import shutil
import subprocess
import tarfile

import pytest
from e2e import put_workspace, run_ok, wait_until, ws_url

pytestmark = [pytest.mark.timeout(240), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]

NS = "tree"
TREE_SUMS = (
    "cd {d} && find . -mindepth 1 -printf '%y %m %p %l\\n' | LC_ALL=C sort"
    " && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum"
)


@pytest.fixture(scope="module")
def client(server):
    with server.client() as client:
        assert put_workspace(client, NS, "files").status_code in (200, 201)
        run_ok(
            client,
            NS,
            "files",
            "mkdir -p /workspace/t/a/b && echo one > /workspace/t/a/one && echo two > /workspace/t/a/b/two",
        )
        yield client


def url(*rest: str) -> str:
    return ws_url(NS, "files", *rest)


def code(answer) -> str:
    return answer.json()["error"]["code"]


def test_list_stat_mkdir_move_and_delete_act_as_the_sandbox_user(client):
    listed = client.get(url("files"), params={"path": "/workspace/t", "list": "1", "depth": "3"}).json()
    assert [e["path"] for e in listed["entries"]] == [
        "/workspace/t/a",
        "/workspace/t/a/b",
        "/workspace/t/a/b/two",
        "/workspace/t/a/one",
    ] and listed["cursor"] is None
    first = client.get(url("files"), params={"path": "/workspace/t", "list": "1", "depth": "3", "limit": "2"}).json()
    rest = client.get(
        url("files"), params={"path": "/workspace/t", "list": "1", "depth": "3", "cursor": first["cursor"]}
    ).json()
    assert first["entries"] + rest["entries"] == listed["entries"]
    stat = client.get(url("files", "stat"), params={"path": "/workspace/t/a/one"}).json()
    assert (stat["type"], stat["size"], stat["mode"]) == ("file", 4, "0644")

    made = client.post(url("files", "mkdir"), json={"path": "/workspace/t/new/deep", "parents": True, "mode": "0700"})
    assert made.status_code == 201 and made.json() == {"path": "/workspace/t/new/deep", "created": True}
    moved = client.post(url("files", "move"), json={"from": "/workspace/t/a/one", "to": "/workspace/t/new/deep/one"})
    assert moved.status_code == 200
    out = run_ok(client, NS, "files", "stat -c '%U %a' /workspace/t/new/deep; cat /workspace/t/new/deep/one")[0]
    assert out == "sandbox 700\none\n"

    refused = client.delete(url("files"), params={"path": "/workspace/t/new"})
    assert refused.status_code == 409 and code(refused) == "directory_not_empty"
    deleted = client.delete(url("files"), params={"path": "/workspace/t/new", "recursive": "true"})
    assert deleted.json() == {"path": "/workspace/t/new", "deleted": True}
    assert run_ok(client, NS, "files", "test -e /workspace/t/new || echo gone")[0] == "gone\n"


def test_the_workspace_itself_and_what_lies_beyond_a_symlink_are_protected(client):
    for path in ("/workspace", "/workspace/.", "/workspace/t/.."):
        answer = client.delete(url("files"), params={"path": path, "recursive": "true"})
        assert answer.status_code == 400 and code(answer) == "path_protected", path
    into_itself = client.post(url("files", "move"), json={"from": "/workspace/t", "to": "/workspace/t/a/t"})
    assert into_itself.status_code == 400 and code(into_itself) == "invalid_move"
    # a symlink to a tree outside: deleting the link (even recursively) leaves its target alone
    run_ok(
        client,
        NS,
        "files",
        "mkdir -p /tmp/outside && echo keep > /tmp/outside/f && ln -sfn /tmp/outside /workspace/t/link",
    )
    link = client.get(url("files", "stat"), params={"path": "/workspace/t/link"}).json()
    assert (link["type"], link["target"]) == ("symlink", "/tmp/outside")  # noqa: S108 - the sandbox's own /tmp
    assert client.delete(url("files"), params={"path": "/workspace/t/link", "recursive": "true"}).status_code == 200
    assert (
        run_ok(client, NS, "files", "cat /tmp/outside/f; test -e /workspace/t/link || echo unlinked")[0]
        == "keep\nunlinked\n"
    )
    # read-only places refuse as the sandbox user would be refused
    answer = client.post(url("files", "mkdir"), json={"path": "/usr/flarebox-test"})
    assert answer.status_code == 403 and code(answer) == "permission_denied"


def test_a_directory_archive_round_trips_with_identical_files_and_a_hostile_one_changes_nothing(client):
    run_ok(
        client,
        NS,
        "files",
        "mkdir -p /workspace/src/pkg && seq 1 5000 > /workspace/src/pkg/n.txt && head -c 300000 /dev/urandom"
        " > /workspace/src/blob && ln -s pkg/n.txt /workspace/src/link && chmod 750 /workspace/src/pkg",
    )
    before = run_ok(client, NS, "files", TREE_SUMS.format(d="/workspace/src"))[0]
    got = client.get(url("files", "archive"), params={"path": "/workspace/src"})
    assert got.status_code == 200 and got.headers["content-type"] == "application/zstd"
    names = subprocess.run(["tar", "--zstd", "-t"], input=got.content, capture_output=True, check=True).stdout
    assert sorted(names.decode().split()) == ["blob", "link", "pkg", "pkg/n.txt"]
    put = client.put(url("files", "archive"), params={"path": "/workspace/copy"}, content=got.content)
    assert put.status_code == 200, put.text
    assert put.json() == {
        "path": "/workspace/copy",
        "files": 2,
        "directories": 1,
        "symlinks": 1,
        "bytes": put.json()["bytes"],
    }
    assert run_ok(client, NS, "files", TREE_SUMS.format(d="/workspace/copy"))[0] == before

    hostile = io.BytesIO()
    with tarfile.open(fileobj=hostile, mode="w") as tar:
        info = tarfile.TarInfo("fine.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"ok"))
        escape = tarfile.TarInfo("../escaped.txt")
        escape.size = 2
        tar.addfile(escape, io.BytesIO(b"no"))
    packed = subprocess.run(["zstd", "-q", "-c"], input=hostile.getvalue(), capture_output=True, check=True).stdout
    refused = client.put(url("files", "archive"), params={"path": "/workspace/copy"}, content=packed)
    assert refused.status_code == 400 and code(refused) == "invalid_archive"
    assert run_ok(client, NS, "files", TREE_SUMS.format(d="/workspace/copy"))[0] == before
    assert run_ok(client, NS, "files", "test -e /workspace/escaped.txt || echo absent")[0] == "absent\n"


def test_processes_lists_a_background_job_and_signals_it_never_the_supervisor(client):
    run_ok(client, NS, "files", "setsid sleep 300 > /dev/null 2>&1 < /dev/null &")
    listed = client.get(url("processes")).json()
    sleeper = next(p for p in listed["processes"] if p["command"] == "sleep 300")
    assert sleeper["user"] == "sandbox" and all(p["user"] == "sandbox" for p in listed["processes"])
    assert not any("flarebox_supervisor" in p["command"] for p in listed["processes"])
    assert listed["commands"][0]["state"] in ("finished", "draining")
    # pid 1 of the sandbox (its init, then the supervisor) is never the sandbox user's to signal
    assert all(p["pid"] != 1 for p in listed["processes"])
    refused = client.post(url("processes", "1", "signal"), json={"signal": "KILL"})
    assert refused.status_code == 404 and code(refused) == "process_not_found"
    sent = client.post(url("processes", str(sleeper["pid"]), "signal"), json={"signal": "TERM"})
    assert sent.json() == {"pid": sleeper["pid"], "signal": "TERM", "group": False}
    wait_until(
        lambda: all(p["pid"] != sleeper["pid"] for p in client.get(url("processes")).json()["processes"]),
        15,
        what="the signalled sleep to end",
    )
    assert (
        client.post(url("processes", "abc", "signal"), json={"signal": "TERM"}).json()["error"]["code"] == "invalid_pid"
    )
    assert (
        client.post(url("processes", "5", "signal"), json={"signal": "TERM9"}).json()["error"]["code"]
        == "invalid_signal"
    )


def test_a_sleeping_workspace_has_no_processes_and_is_not_woken(server):
    with server.client() as client:
        assert put_workspace(client, NS, "asleep").status_code in (200, 201)
        answer = client.get(ws_url(NS, "asleep", "processes"))
        assert answer.json() == {"commands": [], "processes": [], "truncated": False}
        assert client.get(ws_url(NS, "asleep")).json()["state"] == "created"
        refused = client.post(ws_url(NS, "asleep", "processes", "42", "signal"), json={"signal": "TERM"})
        assert refused.status_code == 404 and code(refused) == "process_not_found"
        assert json.loads(client.get(ws_url(NS, "asleep")).text)["state"] == "created"


def test_an_archive_stays_on_its_directorys_filesystem(client):
    """/proc, /sys and the image's read-only mounts are other filesystems: an archive of / is the sandbox's own
    files, never a walk through the kernel's virtual files."""
    got = client.get(url("files", "archive"), params={"path": "/"})
    assert got.status_code == 200
    names = subprocess.run(["tar", "--zstd", "-t"], input=got.content, capture_output=True, check=True).stdout.decode()
    tops = {name.split("/")[0] for name in names.split()}
    assert not tops & {"proc", "sys", "dev", "usr", "workspace"}, sorted(tops)
