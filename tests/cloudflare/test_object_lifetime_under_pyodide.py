"""How long a Workspace object lives, and what ends its requests (issue 16), against the real src/entry.py under
Pyodide: a pending monitor() keeps an idle object in memory for 15 minutes at most, then a fresh instance watches
the still running container again; a deploy cuts the object's requests in flight 30 s later, and a long exec
survives it through the plugin client's reattach; a frozen container ends a request with container_exited after
3 missed heartbeats (the silence guard) instead of hanging it, and reattach works.

IDLE_SECONDS is an hour here, so the idle alarm never stops a container while a test waits past 15 minutes.
"""

import json
import os
import secrets
import socket
import threading
import time

import pytest

from flarebox_hermes.client import Client
from flarebox_hermes.process import RemoteProcess

pytestmark = pytest.mark.timeout(180)

NS = "personal"
MINUTE = 60


@pytest.fixture(scope="module")
def harness_vars() -> dict[str, str]:
    return {"IDLE_SECONDS": "3600"}


def ws_path(name: str) -> str:
    return f"/v1/workspaces/{NS}/{name}"


def exec_body(command: str) -> dict:
    return {"request_id": secrets.token_hex(16), "command": command, "timeout": 120}


def events_of(resp) -> list[dict]:
    return [json.loads(line) for line in resp.iter_lines() if line.strip()]


def run_exec(client, name: str, command: str) -> list[dict]:
    with client.stream("POST", ws_path(name) + "/exec", json=exec_body(command)) as resp:
        assert resp.status_code == 200, resp.read()
        return events_of(resp)


def output_of(events: list[dict]) -> str:
    return "".join(e["data"] for e in events if e["type"] == "output")


def started_as(events: list[dict]) -> str:
    return next(e for e in events if e["type"] == "started")["container"]


def create(client, name: str) -> None:
    resp = client.put(ws_path(name), json={})
    assert resp.status_code == 201, resp.text


@pytest.fixture
def client(harness):
    with harness.client() as c:
        yield c


# --- monitor(): 15 minutes at most ------------------------------------------------------------------------------------


def test_monitor_keeps_an_idle_object_for_15_minutes_then_a_fresh_instance_watches_again(harness, client):
    name = "watched"
    key = f"{NS}/{name}"
    create(client, name)
    assert run_exec(client, name, "echo kept > f")[-1]["exit_code"] == 0
    assert harness.platform()["monitorKeepaliveMs"] == 15 * MINUTE * 1000

    def constructs() -> list[dict]:
        return harness.calls(key, "object.construct")

    harness.advance(10 * MINUTE)  # idle, but its pending monitor() keeps it
    assert len(constructs()) == 1 and harness.container(key)["object"]["constructed"]
    harness.advance(6 * MINUTE)  # 16 minutes after monitor(): nothing keeps it any more
    evicted = harness.calls(key, "harness.evict")
    assert evicted and evicted[-1]["reason"] == "monitor keep-alive ended"
    state = harness.container(key)
    assert state["running"] is True and state["object"]["constructed"] is False  # the container outlives it

    assert client.get(ws_path(name)).json()["running"] is True  # a fresh instance, the same container
    assert len(constructs()) == 2
    rebuilt = constructs()[-1]["at"]
    assert [c for c in harness.calls(key, "container.monitor") if c["at"] >= rebuilt]
    # watching again keeps the new instance for another 15 minutes (an instance that did not would go in 70 s)
    harness.advance(10 * MINUTE)
    assert len(constructs()) == 2 and harness.container(key)["object"]["constructed"]
    events = run_exec(client, name, "cat f")
    assert started_as(events) == "continuing" and output_of(events) == "kept\n"


def test_a_container_that_dies_while_nobody_watches_is_seen_at_the_next_request(harness, client):
    """The glue never relies on monitor() having seen an exit: after the keep-alive ended, the container crashes
    with no instance to notice; the next request finds it gone and says so (no snapshot: workspace_lost)."""
    name = "unwatched"
    key = f"{NS}/{name}"
    create(client, name)
    assert run_exec(client, name, "echo hi > f")[-1]["exit_code"] == 0
    harness.advance(16 * MINUTE)
    assert harness.container(key)["object"]["constructed"] is False
    harness.crash(key)
    for _ in range(100):
        if not harness.container(key)["running"]:
            break
        time.sleep(0.05)
    events = run_exec(client, name, "cat f")
    assert events[-1]["type"] == "error" and events[-1]["code"] == "workspace_lost"
    assert client.get(ws_path(name)).json()["state"] == "lost"


# --- a deploy cuts requests in flight; the plugin reattaches ----------------------------------------------------------


def _read_all(proc: RemoteProcess, first: threading.Event, timeout: float = 90) -> bytes:
    chunks = []
    deadline = time.monotonic() + timeout
    fd = proc.stdout.fileno()
    while time.monotonic() < deadline:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
        first.set()
    proc.wait(timeout)
    return b"".join(chunks)


def test_a_deploy_cuts_a_long_exec_and_the_plugin_client_reattaches_to_it(harness):
    assert harness.platform()["deployGraceMs"] == 30_000
    name = "deployed"
    key = f"{NS}/{name}"
    with Client(harness.base, harness.token) as client:
        client.put_workspace(NS, name, {})

        def run(request, offset):
            if offset is None:
                return client.exec(NS, name, request)
            return client.reattach(NS, name, request["request_id"], offset)

        command = "for i in $(seq 1 50); do echo line $i; sleep 0.1; done; exit 7"  # about 5 s
        proc = RemoteProcess(
            command=command,
            request_fields={"timeout": 120, "login": False, "cwd": None},
            run_fn=run,
            cancel_fn=lambda rid: client.cancel(NS, name, rid),
        )
        first = threading.Event()
        result: list[bytes] = []
        reader = threading.Thread(target=lambda: result.append(_read_all(proc, first)), daemon=True)
        reader.start()
        assert first.wait(60), "no output before the deploy"
        deployed = harness.deploy(grace_seconds=1)  # the 30 s grace, shortened
        assert key in deployed["objects"]
        reader.join(120)
    assert result, "the command's output never ended"
    assert result[0].decode() == "".join(f"line {i}\n" for i in range(1, 51))  # nothing lost, nothing twice
    assert proc.returncode == 7 and proc.error is None
    resets = harness.calls(key, "harness.reset")
    assert resets and resets[0]["reason"] == "deploy" and resets[0]["cut"] >= 1  # the exec's stream was in flight
    assert len(harness.calls(key, "object.construct")) == 2  # the new version's instance answered the reattach
    reattached = [c for c in harness.calls(key, "object.fetch") if c["path"] == "/call/reattach"]
    assert reattached and reattached[0]["at"] >= resets[0]["at"]


# --- the silence guard ------------------------------------------------------------------------------------------------


def test_a_frozen_container_ends_the_request_with_container_exited_and_reattach_works(harness, client):
    name = "frozen"
    key = f"{NS}/{name}"
    create(client, name)
    assert run_exec(client, name, "true")[-1]["exit_code"] == 0
    assert harness.platform()["silenceSeconds"] == 30  # the glue's: 3 missed heartbeats of 10 s
    silence = 2.0
    harness.knobs(silenceSeconds=silence)  # the same rule, shortened
    try:
        body = exec_body("for i in $(seq 1 40); do echo tick $i; sleep 0.1; done")
        events: list[dict] = []
        with client.stream("POST", ws_path(name) + "/exec", json=body) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            for line in lines:
                if line.strip():
                    events.append(json.loads(line))
                    if events[-1]["type"] == "output":
                        break
            harness.freeze(key)
            frozen_at = time.monotonic()
            events += [json.loads(line) for line in lines if line.strip()]
            ended = time.monotonic() - frozen_at
        assert events[-1]["type"] == "error" and events[-1]["code"] == "container_exited", events[-3:]
        assert "reattach" in events[-1]["message"]
        assert silence <= ended < silence + 5, ended  # not the platform's limits: the guard's period

        # still frozen: a reattach (whose head never comes) and a new exec end the same way, as promptly
        rid = body["request_id"]
        began = time.monotonic()
        with client.stream("GET", ws_path(name) + f"/exec/{rid}", params={"offset": 0}) as resp:
            assert resp.status_code == 200
            replay = events_of(resp)
        assert replay[-1]["type"] == "error" and replay[-1]["code"] == "container_exited"
        assert time.monotonic() - began < silence + 5
        began = time.monotonic()
        other = run_exec(client, name, "echo while-frozen")
        assert other[-1]["type"] == "error" and other[-1]["code"] == "container_exited"
        assert time.monotonic() - began < silence + 5

        # thawed: reattaching by request id gives the whole output and the command's own end
        harness.thaw(key)
        with client.stream("GET", ws_path(name) + f"/exec/{rid}", params={"offset": 0}) as resp:
            assert resp.status_code == 200
            replay = events_of(resp)
    finally:
        harness.thaw(key)
        harness.knobs(silenceSeconds=None)
    assert output_of(replay) == "".join(f"tick {i}\n" for i in range(1, 41))
    assert replay[-1]["type"] == "exit" and replay[-1]["exit_code"] == 0


def _dechunk(raw: bytes) -> bytes:
    out, at = b"", 0
    while True:
        end = raw.index(b"\r\n", at)
        size = int(raw[at:end].split(b";")[0], 16)
        if size == 0:
            return out
        out += raw[end + 2 : end + 2 + size]
        at = end + 2 + size + 2


def _exec_read_late(harness, name: str, command: str, pause: float) -> list[dict]:
    """An exec whose client reads the head and then nothing for `pause` seconds, on a socket with a small
    receive buffer (so its window, not the kernel's autotuning, bounds what the server can push ahead)."""
    body = json.dumps(exec_body(command)).encode()
    host, port = harness.base.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(60)
    with sock:
        sock.connect((host, int(port)))
        head = (
            f"POST {ws_path(name)}/exec HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {harness.token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        sock.sendall(head.encode() + body)
        raw = sock.recv(1024)
        assert raw.startswith(b"HTTP/1.1 200"), raw[:200]
        time.sleep(pause)
        while chunk := sock.recv(1 << 20):
            raw += chunk
            if raw.endswith(b"\r\n0\r\n\r\n"):
                break
    text = _dechunk(raw.partition(b"\r\n\r\n")[2]).decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_a_slow_reader_is_not_a_silent_container(harness, client):
    """Backpressure is not silence: a client that stops reading for longer than the guard's period stalls the
    relay (and the supervisor's stream with it), and the stream still ends whole once it reads again."""
    name = "slow-reader"
    create(client, name)
    assert run_exec(client, name, "true")[-1]["exit_code"] == 0
    harness.knobs(silenceSeconds=1.5)
    try:
        # 1.9 M emoji, 7.6 MB: more than every buffer between the supervisor and a client with a small window
        emoji = 1_900_000
        command = f'python3 -c "import sys; sys.stdout.write(chr(0x1F600) * {emoji})"; echo; echo done'
        events = _exec_read_late(harness, name, command, pause=6)
    finally:
        harness.knobs(silenceSeconds=None)
    assert events[-1]["type"] == "exit" and events[-1]["exit_code"] == 0, events[-1]
    assert output_of(events) == chr(0x1F600) * emoji + "\ndone\n"
