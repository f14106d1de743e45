"""The file tree, directory archives and processes through the real Worker entry under Pyodide: the arguments
cross the Durable Object stub, the workspace forwards one request to the supervisor with
`ctx.container.getTcpPort(8080).fetch`, and its answer (a JSON page, a streamed tar.zst) comes back whole."""

import json
import secrets
import shutil
import subprocess

import pytest

pytestmark = [pytest.mark.timeout(240), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]

W = "/v1/workspaces/cf/tree"


def run(client, command: str) -> str:
    body = {"request_id": secrets.token_hex(16), "command": command, "timeout": 60}
    with client.stream("POST", f"{W}/exec", json=body) as resp:
        events = [json.loads(line) for line in resp.iter_lines() if line.strip()]
    assert events[-1] == {**events[-1], "type": "exit", "exit_code": 0}, events
    return "".join(e["data"] for e in events if e["type"] == "output")


@pytest.fixture
def client(harness):
    with harness.client() as c:
        assert c.put(W, json={}).status_code in (200, 201)
        yield c


def test_the_file_tree_routes_cross_the_object_and_act_as_the_sandbox_user(client):
    run(client, "mkdir -p /workspace/d/sub && echo hi > /workspace/d/sub/f && ln -s sub/f /workspace/d/link")
    listed = client.get(f"{W}/files", params={"path": "/workspace/d", "list": "1", "depth": "2"}).json()
    assert [(e["name"], e["type"]) for e in listed["entries"]] == [
        ("link", "symlink"),
        ("sub", "directory"),
        ("f", "file"),
    ] and listed["cursor"] is None
    stat = client.get(f"{W}/files/stat", params={"path": "/workspace/d/link"}).json()
    assert (stat["type"], stat["target"]) == ("symlink", "sub/f")
    made = client.post(f"{W}/files/mkdir", json={"path": "/workspace/d/new", "mode": "0700"})
    assert made.status_code == 201
    moved = client.post(f"{W}/files/move", json={"from": "/workspace/d/sub/f", "to": "/workspace/d/new/f"})
    assert moved.json() == {"from": "/workspace/d/sub/f", "to": "/workspace/d/new/f"}
    user = run(client, "id -un").strip()  # the sandbox user (the harness runs the supervisor as a plain user)
    assert run(client, "stat -c '%U %a' /workspace/d/new; cat /workspace/d/new/f") == f"{user} 700\nhi\n"
    protected = client.delete(f"{W}/files", params={"path": "/workspace", "recursive": "true"})
    assert protected.status_code == 400 and protected.json()["error"]["code"] == "path_protected"

    archive = client.get(f"{W}/files/archive", params={"path": "/workspace/d"})
    assert archive.status_code == 200 and archive.headers["content-type"] == "application/zstd"
    names = subprocess.run(["tar", "--zstd", "-t"], input=archive.content, capture_output=True, check=True).stdout
    assert sorted(names.decode().split()) == ["link", "new", "new/f", "sub"]
    put = client.put(f"{W}/files/archive", params={"path": "/workspace/copy"}, content=archive.content)
    assert put.status_code == 200, put.text
    assert (put.json()["files"], put.json()["symlinks"]) == (1, 1)
    assert run(client, "cat /workspace/copy/new/f; readlink /workspace/copy/link") == "hi\nsub/f\n"
    deleted = client.delete(f"{W}/files", params={"path": "/workspace/copy", "recursive": "true"})
    assert deleted.json() == {"path": "/workspace/copy", "deleted": True}


def test_processes_are_listed_and_signalled_through_the_object(client):
    run(client, "setsid sleep 300 > /dev/null 2>&1 < /dev/null &")
    listed = client.get(f"{W}/processes").json()
    sleeper = next(p for p in listed["processes"] if p["command"] == "sleep 300")
    sent = client.post(f"{W}/processes/{sleeper['pid']}/signal", json={"signal": "KILL"})
    assert sent.json() == {"pid": sleeper["pid"], "signal": "KILL", "group": False}
    assert "sleep 300" not in run(client, "ps -eo args")
