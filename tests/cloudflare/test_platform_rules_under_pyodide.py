"""The rules of the platform the harness keeps (issue 16), each held against the real src/entry.py under Pyodide:
an upload's length (defect 1), a start that fails after start() returned, the options passed to start() against
ContainerStartupOptions as workerd declares it, the plan's request body limit, and alarms (at least once; retried
6 times with backoff from 2 s when the handler throws, then dropped).

The object-lifetime rules (monitor()'s 15 minutes, a deploy's cut, the silence guard) are in
test_object_lifetime_under_pyodide.py: they need a longer IDLE_SECONDS.
"""

import os
import re
import secrets
import socket
import time
from pathlib import Path

import pytest

from protocol import limits

pytestmark = pytest.mark.timeout(180)

NS = "personal"
REPO = Path(__file__).resolve().parents[2]
WORKERD = REPO / "node_modules" / ".bin" / "workerd"


def ws_path(name: str) -> str:
    return f"/v1/workspaces/{NS}/{name}"


def exec_events(client, name: str, command: str) -> list[dict]:
    import json

    body = {"request_id": secrets.token_hex(16), "command": command, "timeout": 60}
    with client.stream("POST", ws_path(name) + "/exec", json=body) as resp:
        assert resp.status_code == 200, resp.read()
        return [json.loads(line) for line in resp.iter_lines() if line.strip()]


def output_of(events: list[dict]) -> str:
    return "".join(e["data"] for e in events if e["type"] == "output")


def create(client, name: str, **config) -> None:
    resp = client.put(ws_path(name), json=config)
    assert resp.status_code == 201, resp.text


@pytest.fixture
def client(harness):
    with harness.client() as c:
        yield c


# --- defect 1: an upload's length is the object's doing, not an accident ----------------------------------------------


def test_an_upload_has_its_length_even_when_the_object_gets_a_body_of_unknown_length(harness, client):
    """workerd drops an explicit content-length on a stream of unknown length and sends it chunked (tests/workerd);
    the supervisor then answers length_required. The object pipes the body through FixedLengthStream(declared
    length), so the upload works whatever the Worker hands over."""
    name = "upload-length"
    key = f"{NS}/{name}"
    create(client, name)
    data = os.urandom(300_000)
    harness.knobs(bodyLengthKnown=False)  # the body reaches the Worker, and so the object, with no known length
    try:
        put = client.put(ws_path(name) + "/files", params={"path": "/workspace/u.bin"}, content=data)
        empty = client.put(ws_path(name) + "/files", params={"path": "/workspace/empty"}, content=b"")
    finally:
        harness.knobs(bodyLengthKnown=True)
    assert put.status_code == 200, put.text
    assert put.json()["size"] == len(data)
    assert empty.status_code == 200 and empty.json()["size"] == 0, empty.text
    writes = [c for c in harness.calls(key, "object.fetch") if c["path"] == "/call/write_file"]
    assert writes and all(c["bodyLength"] is None for c in writes)  # the object really had no length to pass on
    port_calls = harness.calls(key, "container.getTcpPort.fetch")
    sent = [c for c in port_calls if (c["method"], c["path"]) == ("PUT", "/files")]
    assert [(c["framing"], c["length"]) for c in sent] == [("length", len(data)), ("length", 0)]
    got = client.get(ws_path(name) + "/files", params={"path": "/workspace/u.bin"})
    assert got.status_code == 200 and got.content == data


# --- start() returns at once; a bad start shows later -----------------------------------------------------------------


def test_a_start_that_fails_after_returning_ends_the_request_with_container_unavailable(harness, client):
    name = "bad-start"
    key = f"{NS}/{name}"
    create(client, name)
    harness.knobs(startFailures=1)  # start() returns; the platform finds no instance and the container stops
    try:
        began = time.monotonic()
        events = exec_events(client, name, "echo never")
        took = time.monotonic() - began
    finally:
        harness.knobs(startFailures=0)
    assert events[-1]["type"] == "error" and events[-1]["code"] == "container_unavailable", events
    assert "started" not in [e["type"] for e in events]
    # seen through `running`, long before wait_ready's 60 s budget (a glue waiting for start() to throw would time
    # out instead)
    assert took < 15, took
    starts = harness.calls(key, "container.start")
    exits = harness.calls(key, "container.exited")
    assert len(starts) == 1 and starts[0]["failure"]
    assert exits and exits[-1]["error"].startswith("Container failed to start") and exits[-1]["at"] > starts[0]["at"]
    status = client.get(ws_path(name)).json()
    assert status["state"] == "created" and status["running"] is False  # back where the boot started from
    events = exec_events(client, name, "echo second")
    assert output_of(events) == "second\n"
    assert next(e for e in events if e["type"] == "started")["container"] == "fresh"


# --- start()'s options: ContainerStartupOptions -----------------------------------------------------------------------


def _workerd_declarations() -> tuple[list[str], dict[str, list[str]]]:
    """ContainerStartupOptions as workerd declares it for TypeScript (the override text @cloudflare/workers-types is
    generated from; every variant the binary holds), and the runtime's own struct fields of StartupOptions and
    SnapshotRestoreParams (from the JSG struct wrappers' symbols) — both read out of node_modules' workerd binary."""
    data = WORKERD.resolve().read_bytes()
    texts, at = [], 0
    while (at := data.find(b"type ContainerStartupOptions = ", at)) >= 0:
        end = data.index(b"\x00", at)
        texts.append(data[at:end].decode())
        at = end
    fields = {}
    for struct in ("14StartupOptions", "21SnapshotRestoreParams"):
        marker = f"StructWrapperINS_3api9Container{struct}ENS0_12StructFieldsIJ".encode()
        at = data.index(marker) + len(marker)
        names = []
        while data.startswith(b"XadL_ZNS4_", at):
            at += len(b"XadL_ZNS4_")
            digits = re.match(rb"\d+", data[at:]).group()
            at += len(digits)
            names.append(data[at : at + int(digits)].decode())
            at += int(digits) + len(b"EEE")
        fields[struct.lstrip("0123456789")] = names
    return sorted(set(texts)), fields


def _keys(declaration: str) -> set[str]:
    return set(re.findall(r"([A-Za-z]\w*)\??:", declaration.split("=", 1)[1]))


def _instance_literals(declaration: str) -> set[str]:
    instance = re.search(r"instance\?: ([^;]+);", declaration).group(1)
    return set(re.findall(r'"([^"]+)"', instance))


def test_the_options_passed_to_start_are_container_startup_options(harness, client):
    """Checked against the declaration text (no TypeScript compiler: @cloudflare/workers-types and tsc are not in
    node_modules, and nothing may be fetched). workerd's binary holds the TypeScript override from which
    workers-types is generated — the same version the tests/workerd test runs — so the declaration read here is
    the one of the runtime the harness stands in for."""
    declarations, fields = _workerd_declarations()
    assert declarations, "no ContainerStartupOptions declaration in the workerd binary"
    declared = [_keys(d) for d in declarations]
    union, common = set.union(*declared), set.intersection(*declared)
    assert set(fields["StartupOptions"]) == union  # the TypeScript text and the runtime's struct agree
    literals = set.intersection(*(_instance_literals(d) for d in declarations))
    # the harness refuses exactly what the declaration does not have
    platform = harness.platform()
    assert set(platform["startOptions"]) == union
    assert set(platform["instanceTypes"]) == literals
    assert platform["snapshotRestoreFields"] == fields["SnapshotRestoreParams"] == ["id"]
    assert set(limits.INSTANCE_TYPES) <= literals  # every instance type a workspace may ask for is declared

    # what the glue passes, fresh and restoring (a snapshot, a crash, a restore)
    name = "start-options"
    key = f"{NS}/{name}"
    create(client, name)
    assert output_of(exec_events(client, name, "echo a > a; cat a")) == "a\n"
    assert client.post(ws_path(name) + "/snapshot").status_code == 200
    harness.crash(key)
    events = exec_events(client, name, "cat a")
    assert next(e for e in events if e["type"] == "started")["container"] == "restored"
    starts = harness.calls(key, "container.start")
    assert len(starts) == 2
    for start in starts:
        assert set(start["keys"]) <= common, start["keys"]  # in every variant the runtime declares
        assert ("image" in start["keys"]) != ("containerSnapshot" in start["keys"])  # the union's two arms
        assert start["instance"] in literals and isinstance(start["enableInternet"], bool)
    fresh, restore = starts
    assert fresh["containerSnapshotKeys"] is None
    assert restore["containerSnapshotKeys"] == fields["SnapshotRestoreParams"]  # {id}: nothing the type lacks


# --- the plan's request body limit ------------------------------------------------------------------------------------


def _raw_status(base: str, request: bytes) -> tuple[int, bytes]:
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


def test_a_body_over_the_plans_limit_is_refused_before_the_worker_runs(harness, client):
    name = "plan-limit"
    key = f"{NS}/{name}"
    create(client, name)
    limit = harness.platform()["planBodyBytes"]
    assert limit == limits.MAX_PROXY_BODY_BYTES == 100 * 1024 * 1024  # Free and Pro: 100 MB
    # every upload the protocol accepts fits the plan: a larger write limit would meet Cloudflare's own 413 page
    # instead of the protocol's file_too_large
    assert limits.MAX_FILE_WRITE_BYTES <= limit
    workers_before = len(harness.calls(api="worker.fetch"))
    status, body = _raw_status(
        harness.base,
        (
            f"PUT {ws_path(name)}/files?path=/workspace/big HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {harness.token}\r\nContent-Length: {limit + 1}\r\n\r\n"
        ).encode(),
    )
    assert status == 413 and b"413" in body  # Cloudflare's page, not a protocol error: the Worker never ran
    assert len(harness.calls(api="worker.fetch")) == workers_before
    assert [c for c in harness.calls(key, "object.fetch") if c["path"] == "/call/write_file"] == []
    # the boundary itself, with real bytes (a lowered limit: 100 MB through Pyodide would be slow)
    harness.knobs(planBodyBytes=64 * 1024)
    try:
        fits = client.put(ws_path(name) + "/files", params={"path": "/workspace/fits"}, content=b"x" * 64 * 1024)
        over = client.put(ws_path(name) + "/files", params={"path": "/workspace/over"}, content=b"x" * (64 * 1024 + 1))
    finally:
        harness.knobs(planBodyBytes=limit)
    assert fits.status_code == 200, fits.text
    assert over.status_code == 413 and "text/html" in over.headers["content-type"]


# --- alarms -----------------------------------------------------------------------------------------------------------


def _deliveries(harness, key: str, since: float) -> list[dict]:
    return [c for c in harness.calls(key, "alarm") if c["at"] >= since]


def _booted(harness, client, name: str) -> float:
    """A workspace with a running container; the harness clock at that point."""
    create(client, name)
    assert exec_events(client, name, "true")[-1]["exit_code"] == 0
    return harness.calls(f"{NS}/{name}", "container.start")[-1]["at"]


def test_an_alarm_whose_handler_throws_is_retried_with_backoff_then_does_its_work(harness, client):
    """Storage failing during three deliveries of the idle alarm: the handler throws, the platform retries 2, 4
    and 8 s later, and the fourth delivery saves and stops. (A handler that swallowed the failure would never be
    retried, and the container would run on.)"""
    name = "alarm-retry"
    key = f"{NS}/{name}"
    since = _booted(harness, client, name)
    platform = harness.platform()
    assert (platform["alarmMaxRetries"], platform["alarmFirstBackoffMs"]) == (6, 2000)
    harness.knobs(alarmFaults={key: 3})
    try:
        assert harness.advance(int(harness.vars["IDLE_SECONDS"]) + 5)["fired"][key] is False
        for backoff in (2, 4, 8):
            harness.advance(backoff)
    finally:
        harness.knobs(alarmFaults={})
    deliveries = _deliveries(harness, key, since)
    assert [d["retryCount"] for d in deliveries] == [0, 1, 2, 3]
    assert [d["storageFault"] for d in deliveries] == [True, True, True, False]
    for earlier, later, backoff in zip(deliveries, deliveries[1:], (2000, 4000, 8000), strict=False):
        assert backoff <= later["at"] - earlier["at"] < backoff + 5000
    assert harness.container(key)["running"] is False
    status = client.get(ws_path(name)).json()
    assert status["state"] == "stopped" and status["last_snapshot"] is not None
    assert len(harness.calls(key, "container.snapshotContainer")) == 1


def test_an_alarm_is_dropped_after_six_retries_and_the_next_request_arms_it_again(harness, client):
    name = "alarm-dropped"
    key = f"{NS}/{name}"
    since = _booted(harness, client, name)
    harness.knobs(alarmFaults={key: 7})
    try:
        harness.advance(int(harness.vars["IDLE_SECONDS"]) + 5)
        for retry in range(6):
            harness.advance(2 * 2**retry)
    finally:
        harness.knobs(alarmFaults={})
    assert [d["retryCount"] for d in _deliveries(harness, key, since)] == [0, 1, 2, 3, 4, 5, 6]
    dropped = harness.calls(key, "alarm.dropped")
    assert dropped and dropped[-1]["retryCount"] == 6
    assert harness.container(key)["alarmAt"] is None and harness.container(key)["running"] is True
    # the platform gave up; the workspace's next request arms the alarm again, and the idle save happens
    assert output_of(exec_events(client, name, "echo again")) == "again\n"
    assert [c for c in harness.calls(key, "storage.setAlarm") if c["at"] > dropped[-1]["at"]]
    harness.advance(int(harness.vars["IDLE_SECONDS"]) + 5)
    assert harness.container(key)["running"] is False
    assert client.get(ws_path(name)).json()["state"] == "stopped"


def test_an_alarm_delivered_twice_saves_and_stops_once(harness, client):
    name = "alarm-twice"
    key = f"{NS}/{name}"
    since = _booted(harness, client, name)
    harness.knobs(alarmRepeat={key: 1})  # at least once: the delivery that succeeded comes again
    try:
        assert harness.advance(int(harness.vars["IDLE_SECONDS"]) + 5)["fired"][key] is True
    finally:
        harness.knobs(alarmRepeat={})
    assert [d["redelivery"] for d in _deliveries(harness, key, since)] == [False, True]
    assert len(harness.calls(key, "container.snapshotContainer")) == 1
    assert len([c for c in harness.calls(key, "container.destroy") if c["at"] >= since]) == 1
    status = client.get(ws_path(name)).json()
    assert status["state"] == "stopped" and len(client.get(ws_path(name) + "/snapshots").json()["snapshots"]) == 1
