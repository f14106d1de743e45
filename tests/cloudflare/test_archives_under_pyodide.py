"""Export, import and backups through the real src/entry.py under Pyodide behind the binding harness: an archive
exported by the standalone runtime imports through the Cloudflare entry with every file's sha256 equal, backups go
to the (strict, fake) R2 binding written by the object and come back, and an expired container snapshot falls
back to the newest backup — `workspace_lost` only when neither is left."""

import json
import secrets
import shutil

import pytest
from e2e import put_workspace, run_ok, serving

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]

NS = "personal"
DAY_S = 24 * 3600
TREE = (
    "cd /workspace && find . -mindepth 1 -printf '%y %m %p %l\\n' | LC_ALL=C sort"
    " && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum"
)
MAKE_TREE = (
    "mkdir -p /workspace/src/pkg && seq 1 20000 > /workspace/src/numbers.txt"
    " && head -c 200000 /dev/urandom > /workspace/src/pkg/blob.bin && ln -s pkg/blob.bin /workspace/src/link"
    " && chmod 700 /workspace/src/pkg"
)


def ws_path(name: str, *rest: str) -> str:
    return "/".join([f"/v1/workspaces/{NS}/{name}", *rest])


def run_exec(client, name: str, command: str) -> list[dict]:
    body = {"request_id": secrets.token_hex(16), "command": command, "timeout": 60}
    with client.stream("POST", ws_path(name, "exec"), json=body) as resp:
        assert resp.status_code == 200, resp.read()
        return [json.loads(line) for line in resp.iter_lines() if line.strip()]


def output_of(events: list[dict]) -> str:
    assert events[-1]["type"] == "exit" and events[-1]["exit_code"] == 0, events
    return "".join(e["data"] for e in events if e["type"] == "output")


def started(events: list[dict]) -> dict:
    return next(e for e in events if e["type"] == "started")


@pytest.fixture
def client(harness):
    with harness.client() as c:
        yield c


def test_a_standalone_export_imports_through_the_cloudflare_entry_identically(harness, client):
    with serving() as server, server.client() as local:
        assert put_workspace(local, NS, "laptop").status_code == 201
        run_ok(local, NS, "laptop", MAKE_TREE)
        before = run_ok(local, NS, "laptop", TREE)[0]
        with local.stream("GET", f"/v1/workspaces/{NS}/laptop/export", timeout=120) as resp:
            assert resp.status_code == 200
            archive = b"".join(resp.iter_raw())
    assert client.put(ws_path("moved"), json={}).status_code == 201
    resp = client.put(ws_path("moved", "import"), content=archive, headers={"content-type": "application/zstd"})
    assert resp.status_code == 200, resp.text
    assert resp.json()["snapshot"] is not None  # saved at once: a container snapshot of the imported files
    assert output_of(run_exec(client, "moved", TREE)) == before
    # and it goes back the other way: the Cloudflare export imports into a standalone workspace
    with client.stream("GET", ws_path("moved", "export")) as resp:
        assert resp.status_code == 200
        again = b"".join(resp.iter_raw())
    with serving() as server, server.client() as local:
        assert put_workspace(local, NS, "back").status_code == 201
        assert local.put(f"/v1/workspaces/{NS}/back/import", content=again, timeout=120).status_code == 200
        assert run_ok(local, NS, "back", TREE)[0] == before


def test_an_import_into_a_running_workspace_is_409(harness, client):
    assert client.put(ws_path("busy"), json={}).status_code == 201
    output_of(run_exec(client, "busy", "true"))
    resp = client.put(ws_path("busy", "import"), content=b"not even an archive")
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "workspace_running"


def test_backups_go_to_r2_and_an_expired_snapshot_falls_back_to_one(harness, client):
    name = "month"
    key = f"{NS}/{name}"
    assert client.put(ws_path(name), json={}).status_code == 201
    output_of(run_exec(client, name, MAKE_TREE))
    before = output_of(run_exec(client, name, TREE))
    backup = client.post(ws_path(name, "backup"))
    assert backup.status_code == 200, backup.text
    assert [b["id"] for b in client.get(ws_path(name, "backups")).json()["backups"]] == [backup.json()["id"]]
    assert harness.calls(api="r2.createMultipartUpload")  # written by the object, through the binding
    assert client.post(ws_path(name, "stop")).status_code == 200
    harness.advance(31 * DAY_S)  # the container snapshot expired; the backup did not
    assert client.get(ws_path(name, "snapshots")).json()["snapshots"] == []
    assert client.get(ws_path(name)).json()["state"] == "stopped"
    events = run_exec(client, name, TREE)
    assert started(events)["container"] == "restored" and started(events)["from"] == "backup"
    assert started(events)["backup"]["id"] == backup.json()["id"]
    assert output_of(events) == before
    assert client.get(ws_path(name, "snapshots")).json()["snapshots"]  # saved as a snapshot again at once
    starts = harness.calls(key, "container.start")
    assert "containerSnapshot" not in starts[-1] or starts[-1]["containerSnapshot"] is None


def test_forks_restore_the_sources_container_snapshot_and_diverge(harness, client):
    assert client.put(ws_path("trunk"), json={}).status_code == 201
    output_of(run_exec(client, "trunk", "echo base > base.txt"))
    for i in range(3):
        resp = client.put(ws_path(f"branch{i}"), json={"from": {"namespace": NS, "workspace": "trunk"}})
        assert resp.status_code == 201 and resp.json()["state"] == "stopped", resp.text
        events = run_exec(client, f"branch{i}", f"cat base.txt && echo {i} > mine.txt")
        assert started(events)["container"] == "restored" and output_of(events) == "base\n"
        restore = harness.calls(f"{NS}/branch{i}", "container.start")[-1]
        assert restore["containerSnapshot"] == resp.json()["last_snapshot"]["id"]  # the platform's own snapshot
    for i in range(3):
        assert output_of(run_exec(client, f"branch{i}", "cat mine.txt")) == f"{i}\n"
    events = run_exec(client, "trunk", "ls")
    assert output_of(events) == "base.txt\n" and started(events)["container"] == "continuing"


def test_backups_of_one_day_are_pruned_to_its_newest(harness, client):
    assert client.put(ws_path("daily"), json={}).status_code == 201
    output_of(run_exec(client, "daily", "echo one > f"))
    first = client.post(ws_path("daily", "backup")).json()
    second = client.post(ws_path("daily", "backup")).json()
    assert [b["id"] for b in client.get(ws_path("daily", "backups")).json()["backups"]] == [second["id"]]
    assert first["id"] != second["id"]
    assert harness.calls(api="r2.delete")  # the pruned one is gone from the bucket, not just unlisted
