"""src/entry.py for real (Pyodide + the vendored workers SDK) behind the binding harness, driven over HTTP.

Each test uses its own workspace. Cloudflare API calls the glue made are read from the harness's call log.
"""

import json
import os
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.timeout(180)

NS = "personal"


def ws_path(name: str) -> str:
    return f"/v1/workspaces/{NS}/{name}"


def exec_body(command: str, **extra) -> dict:
    return {"request_id": secrets.token_hex(16), "command": command, "timeout": 60, **extra}


def run_exec(client, name: str, command: str, **extra) -> list[dict]:
    with client.stream("POST", ws_path(name) + "/exec", json=exec_body(command, **extra)) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("application/x-ndjson")
        return [json.loads(line) for line in resp.iter_lines() if line.strip()]


def output_of(events: list[dict]) -> str:
    return "".join(e["data"] for e in events if e["type"] == "output")


def create(client, name: str, **config) -> dict:
    resp = client.put(ws_path(name), json=config)
    assert resp.status_code == 201, resp.text
    return resp.json()


@pytest.fixture
def client(harness):
    with harness.client() as c:
        yield c


def test_auth_is_checked_before_anything_else(harness):
    with harness.client(token="") as anonymous:
        resp = anonymous.get("/v1/health")
        assert resp.status_code == 401
        assert resp.json()["error"]["code"] == "unauthorized"
    with harness.client(token="x" * 40) as wrong:
        resp = wrong.put(ws_path("auth-probe"))
        assert resp.status_code == 401
    assert harness.calls("personal/auth-probe") == []  # a refused request never reaches the object
    with harness.client() as good:
        resp = good.get("/v1/health")
        assert resp.status_code == 200
        assert resp.json() == {"ok": True, "protocol": 1, "version": "0.1.0"}


def test_put_get_delete_without_a_container(harness, client):
    name = "crud"
    body = create(client, name, instance="lite")
    assert body["state"] == "created" and body["config"]["instance"] == "lite"
    assert client.put(ws_path(name), json={"instance": "lite"}).status_code == 200
    conflict = client.put(ws_path(name), json={"instance": "standard-1"})
    assert conflict.status_code == 409 and conflict.json()["error"]["code"] == "config_conflict"
    got = client.get(ws_path(name))
    assert got.status_code == 200 and got.json()["running"] is False
    assert client.delete(ws_path(name)).json()["error"]["code"] == "confirm_required"
    assert client.delete(ws_path(name), params={"confirm": "true"}).json() == {"deleted": True}
    assert client.get(ws_path(name)).status_code == 404
    # config calls never start a container; the Worker reached the object through getByName("<ns>/<ws>")
    assert harness.calls(f"{NS}/{name}", "container.start") == []
    assert harness.calls(f"{NS}/{name}", "namespace.getByName")


def test_exec_output_streams_while_the_command_runs(harness, client):
    name = "streaming"
    create(client, name)
    # The command prints, then waits for a file only a second request can create: if the relay buffered
    # the output, "first" could not arrive before the command ends, and the command would never end.
    command = "echo first; while [ ! -f /workspace/go ]; do sleep 0.05; done; echo second"
    events: list[dict] = []
    with client.stream("POST", ws_path(name) + "/exec", json=exec_body(command)) as resp:
        assert resp.status_code == 200
        lines = resp.iter_lines()
        for line in lines:
            if not line.strip():
                continue
            events.append(json.loads(line))
            if events[-1]["type"] == "output":
                break
        assert output_of(events) == "first\n"
        assert [e["type"] for e in events if e["type"] in ("exit", "error")] == []
        with harness.client() as other:
            put = other.put(ws_path(name) + "/files", params={"path": "/workspace/go"}, content=b"")
            assert put.status_code == 200, put.text
        events += [json.loads(line) for line in lines if line.strip()]
    assert output_of(events) == "first\nsecond\n"
    assert events[-1]["type"] == "exit" and events[-1]["exit_code"] == 0
    started = [e for e in events if e["type"] == "started"]
    assert started[0]["container"] == "fresh"
    start = harness.calls(f"{NS}/{name}", "container.start")
    assert len(start) == 1
    assert start[0]["image"].startswith("registry.cloudflare.com/")  # ctx.container.images.hermes
    assert start[0]["instance"] == "standard-1" and start[0]["enableInternet"] is True
    assert start[0]["containerSnapshot"] is None
    # the relay outlives the fetch that returned its stream: the runtime is told, and told when it is done
    assert harness.calls(f"{NS}/{name}", "ctx.waitUntil")
    assert harness.calls(f"{NS}/{name}", "ctx.waitUntil.settled")


def test_the_token_never_reaches_the_container(harness, client):
    name = "secrets"
    create(client, name)
    events = run_exec(client, name, "env; cat /proc/1/environ | tr '\\0' '\\n'")
    assert events[-1]["type"] == "exit"
    assert harness.token not in output_of(events)
    for call in harness.calls(f"{NS}/{name}", "container.start"):
        assert harness.token not in call["envValues"]


def test_slow_boot_sends_status_events_and_heartbeats(harness, client):
    name = "slow-boot"
    create(client, name)
    harness.knobs(startDelayMs=13_000)  # a cold start longer than the 10 s heartbeat interval
    try:
        events = run_exec(client, name, "echo up")
    finally:
        harness.knobs(startDelayMs=0)
    types = [e["type"] for e in events]
    assert events[0] == {"type": "status", "phase": "starting", "message": "starting a new container"}
    ready = types.index("started") - 1
    assert events[ready] == {"type": "status", "phase": "ready"}
    assert "heartbeat" in types[:ready], types  # the client heard from us while the container booted
    assert output_of(events) == "up\n" and events[-1]["exit_code"] == 0


def test_concurrent_requests_share_one_container_start(harness, client):
    name = "shared-boot"
    create(client, name)
    harness.knobs(startDelayMs=3000)  # all three arrive while the one start is under way
    try:
        with ThreadPoolExecutor(3) as pool:
            results = list(pool.map(lambda i: run_exec(client, name, f"echo run{i}"), range(3)))
    finally:
        harness.knobs(startDelayMs=0)
    for i, events in enumerate(results):
        assert output_of(events) == f"run{i}\n"
        assert [e["container"] for e in events if e["type"] == "started"] == ["fresh"]
    assert len(harness.calls(f"{NS}/{name}", "container.start")) == 1


def test_cancel_a_running_command_and_a_pending_one(harness, client):
    name = "cancel"
    create(client, name)
    body = exec_body("echo sleeping; sleep 30; echo never")
    events: list[dict] = []
    with client.stream("POST", ws_path(name) + "/exec", json=body) as resp:
        lines = resp.iter_lines()
        for line in lines:
            events.append(json.loads(line))
            if events[-1]["type"] == "output":
                break
        cancel = client.post(ws_path(name) + f"/exec/{body['request_id']}/cancel")
        assert cancel.status_code == 200 and cancel.json()["state"] == "cancelled"
        events += [json.loads(line) for line in lines if line.strip()]
    assert events[-1]["type"] == "exit" and events[-1]["reason"] == "cancelled" and events[-1]["exit_code"] == 130
    assert "never" not in output_of(events)

    early = exec_body("echo must-not-run")
    pending = client.post(ws_path(name) + f"/exec/{early['request_id']}/cancel")
    assert pending.json()["state"] == "pending"
    with client.stream("POST", ws_path(name) + "/exec", json=early) as resp:
        late = [json.loads(line) for line in resp.iter_lines() if line.strip()]
    assert late == [{"type": "error", "code": "command_cancelled", "message": late[0]["message"]}]


def test_files_round_trip_through_worker_object_and_container(harness, client):
    name = "files"
    create(client, name)
    data = os.urandom(700_000) + "é\n".encode()
    put = client.put(ws_path(name) + "/files", params={"path": "/workspace/d/blob.bin"}, content=data)
    assert put.status_code == 200 and put.json()["size"] == len(data)
    got = client.get(ws_path(name) + "/files", params={"path": "/workspace/d/blob.bin"})
    assert got.status_code == 200 and got.content == data
    assert got.headers["content-length"] == str(len(data))
    missing = client.get(ws_path(name) + "/files", params={"path": "/workspace/nope"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "file_not_found"


def test_idle_alarm_snapshots_stops_and_the_next_exec_restores(harness, client):
    name = "idle"
    key = f"{NS}/{name}"
    create(client, name)
    assert run_exec(client, name, "echo kept > kept.txt")[-1]["exit_code"] == 0
    assert harness.calls(key, "storage.setAlarm"), "every request pushes the idle alarm"

    fired = harness.advance(int(harness.vars["IDLE_SECONDS"]) + 5)
    assert fired["fired"].get(key) is True
    snaps = harness.calls(key, "container.snapshotContainer")
    destroys = harness.calls(key, "container.destroy")
    assert len(snaps) == 1 and len(destroys) == 1 and snaps[0]["at"] <= destroys[0]["at"]
    assert harness.container(key)["running"] is False
    status = client.get(ws_path(name)).json()
    assert status["state"] == "stopped" and status["last_snapshot"] is not None
    snapshot_id = status["last_snapshot"]["id"]

    events = run_exec(client, name, "cat kept.txt")
    assert events[0]["type"] == "status" and events[0]["phase"] == "restoring"
    started = next(e for e in events if e["type"] == "started")
    assert started["container"] == "restored" and started["snapshot"]["id"] == snapshot_id
    assert output_of(events) == "kept\n"
    listed = client.get(ws_path(name) + "/snapshots").json()["snapshots"]
    assert [s["id"] for s in listed] == [snapshot_id]
    restore = harness.calls(key, "container.start")[-1]
    assert restore["containerSnapshot"] == snapshot_id and restore["image"] is None


def test_crash_without_a_snapshot_is_workspace_lost(harness, client):
    name = "lost"
    key = f"{NS}/{name}"
    create(client, name)
    assert run_exec(client, name, "echo hi > f")[-1]["exit_code"] == 0
    harness.crash(key)
    events = run_exec(client, name, "cat f")
    assert events[-1]["type"] == "error" and events[-1]["code"] == "workspace_lost"
    assert "started" not in [e["type"] for e in events]  # never silently starts empty
    assert len(harness.calls(key, "container.start")) == 1
    assert client.get(ws_path(name)).json()["state"] == "lost"


def test_crash_after_a_snapshot_restores_it_and_says_so(harness, client):
    name = "crash-restore"
    key = f"{NS}/{name}"
    create(client, name)
    assert run_exec(client, name, "echo saved > a")[-1]["exit_code"] == 0
    snap = client.post(ws_path(name) + "/snapshot")
    assert snap.status_code == 200, snap.text
    assert run_exec(client, name, "echo unsaved > b")[-1]["exit_code"] == 0
    harness.crash(key)
    events = run_exec(client, name, "cat a; ls")
    started = next(e for e in events if e["type"] == "started")
    assert started["container"] == "restored" and started["snapshot"]["id"] == snap.json()["id"]
    assert output_of(events) == "saved\na\n"


def test_a_failed_snapshot_keeps_the_container_running(harness, client):
    name = "snap-fail"
    key = f"{NS}/{name}"
    create(client, name)
    assert run_exec(client, name, "true")[-1]["exit_code"] == 0
    harness.knobs(failSnapshot=True)
    try:
        resp = client.post(ws_path(name) + "/snapshot")
    finally:
        harness.knobs(failSnapshot=False)
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "snapshot_failed"
    assert harness.container(key)["running"] is True
    assert harness.calls(key, "container.destroy") == []
    assert run_exec(client, name, "echo still")[-1]["exit_code"] == 0


def test_a_new_object_instance_rewatches_its_running_container(harness, client):
    name = "evicted"
    key = f"{NS}/{name}"
    create(client, name)
    assert run_exec(client, name, "echo hi > f")[-1]["exit_code"] == 0
    armed = harness.calls(key, "container.setInactivityTimeout")
    idle_ms = int(harness.vars["IDLE_SECONDS"]) * 1000
    assert armed and armed[-1]["ms"] > idle_ms  # a last resort only: later than the idle alarm
    harness.evict(key)
    assert client.get(ws_path(name)).json()["running"] is True  # a fresh instance, same container
    constructs = harness.calls(key, "object.construct")
    assert len(constructs) == 2
    after = constructs[-1]["at"]
    assert [c for c in harness.calls(key, "container.monitor") if c["at"] >= after]
    assert [c for c in harness.calls(key, "container.setInactivityTimeout") if c["at"] >= after]
    events = run_exec(client, name, "cat f")
    assert next(e for e in events if e["type"] == "started")["container"] == "continuing"
    assert output_of(events) == "hi\n"


def test_stop_and_delete_destroy_the_container(harness, client):
    name = "stop"
    key = f"{NS}/{name}"
    create(client, name, persistent=False)
    assert run_exec(client, name, "true")[-1]["exit_code"] == 0
    resp = client.post(ws_path(name) + "/stop")
    assert resp.status_code == 200 and resp.json() == {"deleted": True}
    assert harness.calls(key, "container.destroy") and harness.container(key)["running"] is False
    assert harness.calls(key, "container.snapshotContainer") == []  # ephemeral: nothing saved
    assert harness.calls(key, "storage.deleteAlarm")


def test_requests_in_flight_do_not_block_each_other(harness, client):
    name = "parallel"
    create(client, name)
    assert run_exec(client, name, "true")[-1]["exit_code"] == 0
    gate = threading.Event()

    def long_running():
        with harness.client() as c:
            events = run_exec(c, name, "while [ ! -f /workspace/release ]; do sleep 0.05; done; echo released")
            gate.set()
            return events

    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(long_running)
        # while that command holds its stream open, status reads and a second command still get through
        for _ in range(600):
            if client.get(ws_path(name)).json()["busy"]:
                break
            threading.Event().wait(0.05)
        else:
            pytest.fail("the workspace never reported the running command as busy")
        assert output_of(run_exec(client, name, "echo beside")) == "beside\n"
        assert not gate.is_set()
        assert run_exec(client, name, "touch /workspace/release")[-1]["exit_code"] == 0
        assert output_of(pending.result(timeout=60)) == "released\n"


def test_non_ascii_survives_worker_object_and_container(harness, client):
    name = "unicode"
    create(client, name)
    events = run_exec(client, name, "cat; printf 'ünï 🌍\\n'", stdin="stdin ✓ 中文\n")
    assert output_of(events) == "stdin ✓ 中文\nünï 🌍\n"
    path = "/workspace/dïr/ünï 🌍.txt"  # travels to the object in a header, as JSON \u escapes
    put = client.put(ws_path(name) + "/files", params={"path": path}, content="données".encode())
    assert put.status_code == 200 and put.json()["path"] == path
    got = client.get(ws_path(name) + "/files", params={"path": path})
    assert got.content.decode() == "données"


def test_reattach_replays_a_finished_command(harness, client):
    name = "reattach"
    create(client, name)
    body = exec_body("printf 'a\\nb\\n'; exit 3")
    with client.stream("POST", ws_path(name) + "/exec", json=body) as resp:
        first = [json.loads(line) for line in resp.iter_lines() if line.strip()]
    assert output_of(first) == "a\nb\n" and first[-1]["exit_code"] == 3
    replay = client.get(ws_path(name) + f"/exec/{body['request_id']}", params={"offset": 2})
    assert replay.status_code == 200
    events = [json.loads(line) for line in replay.text.splitlines() if line.strip()]
    assert output_of(events) == "b\n" and events[-1]["type"] == "exit" and events[-1]["exit_code"] == 3
    again = client.post(ws_path(name) + "/exec", json=body)
    assert again.status_code == 409 and again.json()["error"]["code"] == "duplicate_request"


def test_a_stale_running_container_is_replaced_not_reused(harness, client):
    name = "stale"
    key = f"{NS}/{name}"
    create(client, name)
    assert run_exec(client, name, "echo saved > f")[-1]["exit_code"] == 0
    assert client.post(ws_path(name) + "/stop").json()["state"] == "stopped"
    harness.orphan(key)  # e.g. a boot that an eviction interrupted left one running
    before = len(harness.calls(key, "container.destroy"))
    events = run_exec(client, name, "cat f")
    assert next(e for e in events if e["type"] == "started")["container"] == "restored"
    assert output_of(events) == "saved\n"
    assert len(harness.calls(key, "container.destroy")) == before + 1
    assert harness.calls(key, "container.start")[-1]["containerSnapshot"] is not None


def test_without_secrets_key_a_secret_is_refused_and_nothing_stored(harness, client):
    # this module's harness sets no SECRETS_KEY: the WebCrypto cipher is unavailable
    assert "SECRETS_KEY" not in harness.vars
    create(client, "no-secrets")
    resp = client.put(ws_path("no-secrets") + "/secrets/API_KEY", json={"value": "sk-never-stored"})
    assert resp.status_code == 503, resp.text
    assert resp.json()["error"]["code"] == "secrets_unavailable"
    assert "sk-never-stored" not in resp.text
    listed = client.get(ws_path("no-secrets") + "/secrets")
    assert listed.status_code == 200 and listed.json() == {"secrets": []}
