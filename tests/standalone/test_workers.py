"""`flarebox serve --workers 2` for real (standalone/workers.py, shards.py): each workspace lives in the worker that
owns it (placement.py) and is reached through either worker's accept — exec streams, file PUT/GET, a terminal
WebSocket; a key revoked or a workspace deleted through one worker is gone for the other at once; a workspace is
never booted in two processes; shutdown stops every worker and sandbox and keeps the files; a worker that dies
takes the server down with a non-zero status. Loopback only; every process is stopped by PID (e2e.py)."""

import asyncio
import hashlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from e2e import (
    TOKEN,
    TerminalSession,
    exec_events,
    flarebox_command,
    output_of,
    put_workspace,
    serving,
    wait_until,
    ws_url,
)
from websockets.asyncio.client import connect

from standalone.placement import owner

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]

NS = "mw"
WORKERS = {"FLAREBOX_WORKERS": "2", "IDLE_SECONDS": "600"}


def owned_by(index: int, prefix: str = "ws") -> str:
    """A workspace name worker `index` of 2 owns."""
    return next(f"{prefix}{i}" for i in range(100) if owner(NS, f"{prefix}{i}", 2) == index)


def workers_of(server) -> list[int]:
    """The worker processes: the server's children that are not sandboxes."""
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes()
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
            if ppid == server.proc.pid and b"bwrap" not in cmd.split(b"\0")[0]:
                kids.append(int(entry))
    return sorted(kids)


def _socket_inodes(port: int) -> dict[int, int]:
    """Established loopback connections to `port`: the peer's port → the server side's socket inode."""
    found = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, inode = fields[1], fields[2], int(fields[9])
        if int(local.split(":")[1], 16) == port and fields[3] == "01" and inode:
            found[int(remote.split(":")[1], 16)] = inode
    return found


def accepting_worker(server, client_port: int) -> int:
    """The index (in workers_of order, which is fork order) of the worker holding the connection from
    `client_port`."""
    pids = workers_of(server)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        inode = _socket_inodes(server.port).get(client_port)
        for index, pid in enumerate(pids):
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                        return index
                except OSError:
                    continue
        time.sleep(0.05)
    raise AssertionError(f"no worker holds the connection from port {client_port}")


def client_through(server, index: int, token: str | None = None) -> httpx.Client:
    """A kept-alive client whose connection worker `index` accepted."""
    for _ in range(200):
        client = httpx.Client(base_url=server.url, headers=server.headers(token), timeout=120)
        response = client.get("/v1/health")
        port = response.extensions["network_stream"].get_extra_info("client_addr")[1]
        if accepting_worker(server, port) == index:
            return client
        client.close()
    raise AssertionError(f"worker {index} never accepted a connection")


def sandboxes(server, workspace: str) -> list[tuple[int, int]]:
    """(pid, parent pid) of every outer bwrap running `workspace` (bwrap is given --hostname <workspace>)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        if not cmd or os.path.basename(cmd[0]) != b"bwrap":
            continue
        if not any(a == b"--hostname" and b == workspace.encode() for a, b in zip(cmd, cmd[1:], strict=False)):
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        if os.path.basename(Path(f"/proc/{ppid}/cmdline").read_bytes().split(b"\0")[0]) != b"bwrap":
            found.append((int(entry), ppid))
    return found


@pytest.fixture(scope="module")
def server():
    with serving(WORKERS) as srv:
        assert "Worker processes: 2" in srv.output()
        assert len(workers_of(srv)) == 2
        yield srv


@pytest.fixture(scope="module")
def names(server):
    w0, w1 = owned_by(0), owned_by(1)
    with server.client() as client:
        for ws in (w0, w1):
            assert put_workspace(client, NS, ws).status_code in (200, 201)
    return w0, w1


@pytest.fixture(scope="module")
def through(server):
    clients = [client_through(server, 0), client_through(server, 1)]
    yield clients
    for client in clients:
        client.close()


@pytest.mark.parametrize("via", [0, 1])
def test_exec_streams_and_files_reach_each_workspace_through_either_worker(server, names, through, via):
    client = through[via]
    for ws in names:
        events = exec_events(client, NS, ws, "echo hello-$((6*7)); seq 1 20000 | tail -n 1; echo err >&2")
        assert events[-1]["type"] == "exit" and events[-1]["exit_code"] == 0, events[-3:]
        assert "hello-42\n20000\n" in output_of(events)
        data = os.urandom(300_000)
        path = f"/workspace/from-{via}.bin"
        put = client.put(ws_url(NS, ws, "files"), params={"path": path}, content=data)
        assert put.status_code in (200, 201), put.text
        got = client.get(ws_url(NS, ws, "files"), params={"path": path})
        assert got.status_code == 200 and hashlib.sha256(got.content).hexdigest() == hashlib.sha256(data).hexdigest()
        assert client.get(ws_url(NS, ws)).json()["state"] == "running"
    listed = client.get("/v1/workspaces", params={"namespace": NS}).json()["workspaces"]
    assert {w["workspace"] for w in listed} >= set(names)
    assert all(w["state"] == "running" for w in listed if w["workspace"] in names)


def test_a_large_upload_and_a_long_stream_cross_workers(server, names, through):
    """A body bigger than any buffer goes through with backpressure, and 1.5 MB of output streams back whole."""
    ws = names[1]  # owned by worker 1, reached through worker 0
    client = through[0]
    data = os.urandom(24 * 1024 * 1024)
    put = client.put(ws_url(NS, ws, "files"), params={"path": "/workspace/big.bin"}, content=data)
    assert put.status_code in (200, 201), put.text
    events = exec_events(client, NS, ws, "sha256sum /workspace/big.bin; head -c 1500000 /dev/zero | tr '\\0' x")
    out = output_of(events)
    assert out.startswith(hashlib.sha256(data).hexdigest())
    assert out.count("x") == 1_500_000


async def _terminal_via(server, ws: str, via: int) -> None:
    url = server.url.replace("http", "ws", 1) + ws_url(NS, ws, "pty")
    for _ in range(200):
        async with connect(url, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as conn:
            port = conn.local_address[1]
            if await asyncio.to_thread(accepting_worker, server, port) != via:
                continue
            s = TerminalSession(conn)
            await s.until(lambda s: s.frame("session") is not None)
            await s.type("echo term-$((40+2)); hostname\r")
            await s.until(lambda s: b"term-42" in s.screen.replace(b"echo term-", b""))
            assert ws.encode() in s.screen
            return
    raise AssertionError(f"worker {via} never accepted the terminal's connection")


@pytest.mark.parametrize("via", [0, 1])
async def test_a_terminal_websocket_reaches_the_workspace_of_the_other_worker(server, names, via):
    await _terminal_via(server, names[1 - via], via)


def test_a_fork_takes_its_source_from_the_other_worker(server, names, through):
    """The edge asks the source's owner for a snapshot and the fork's owner restores it: two workers, one fork."""
    source = names[0]
    fork = owned_by(1, "fork")
    assert exec_events(through[1], NS, source, "echo forked-base > /workspace/base.txt")[-1]["exit_code"] == 0
    resp = through[0].put(ws_url(NS, fork), json={"from": {"namespace": NS, "workspace": source}})
    assert resp.status_code == 201 and resp.json()["state"] == "stopped", resp.text
    events = exec_events(through[0], NS, fork, "cat /workspace/base.txt")
    assert output_of(events) == "forked-base\n"
    assert next(e for e in events if e["type"] == "started")["container"] == "restored"
    assert through[1].delete(ws_url(NS, fork), params={"confirm": "true"}).status_code == 200


def test_the_port_proxy_crosses_workers_with_the_real_client_address(server, through):
    """A service in a workspace of worker 1, reached through worker 0: a forged X-Forwarded-For is replaced by the
    address the accepting worker saw, a streamed body arrives whole, repeated Set-Cookie headers survive."""
    ws = owned_by(1, "svc")
    client = through[0]
    assert put_workspace(client, NS, ws).status_code in (200, 201)
    app = Path(__file__).with_name("service_app.py").read_bytes()
    assert client.put(ws_url(NS, ws, "files"), params={"path": "/workspace/app.py"}, content=app).status_code == 200
    spec = {"command": "python3 app.py 8000", "port": 8000, "health": {"path": "/health"}}
    assert client.put(ws_url(NS, ws, "services", "web"), json=spec).status_code == 201
    base = ws_url(NS, ws, "ports", "8000")
    wait_until(lambda: client.get(base + "/health").status_code == 200, 30, what="the service through the proxy")
    body = os.urandom(3 * 1024 * 1024)
    response = client.post(
        base + "/echo", content=iter([body[:1000], body[1000:]]), headers={"X-Forwarded-For": "6.6.6.6"}
    )
    assert response.status_code == 200, response.text
    echoed = response.json()
    assert echoed["headers"]["x-forwarded-for"] == "127.0.0.1"
    assert echoed["size"] == len(body) and echoed["sha256"] == hashlib.sha256(body).hexdigest()
    assert response.headers.get_list("set-cookie") == ["a=1; Path=/", "b=2; Path=/"]
    assert "authorization" not in echoed["headers"]


def test_each_workspace_runs_one_sandbox_in_its_owner(server, names, through):
    pids = workers_of(server)
    for index, ws in enumerate(names):
        for client in through:  # used through both workers again: still the one sandbox
            assert exec_events(client, NS, ws, "true")[-1]["exit_code"] == 0
        found = sandboxes(server, ws)
        assert len(found) == 1, found
        assert found[0][1] == pids[index]  # the owner's child


def test_a_revoked_key_and_a_deleted_workspace_are_gone_for_every_worker_at_once(server, through):
    gone = owned_by(0, "gone")
    assert put_workspace(through[0], NS, gone).status_code in (200, 201)
    minted = through[0].post("/v1/keys", json={"label": "mw", "namespace": NS, "scopes": ["exec"]})
    assert minted.status_code == 201, minted.text
    key = minted.json()["key"]
    keyed = [client_through(server, index, key) for index in range(2)]
    try:
        for client in keyed:
            assert client.get(ws_url(NS, gone)).status_code == 200
        # revoked through worker 1; refused at once by every worker, each one's own connection included
        assert through[1].delete(f"/v1/keys/{minted.json()['id']}").status_code == 200
        for _ in range(10):
            for client in keyed:
                assert client.get(ws_url(NS, gone)).status_code == 401
            fresh = httpx.get(server.url + ws_url(NS, gone), headers={"Authorization": f"Bearer {key}"})
            assert fresh.status_code == 401
    finally:
        for client in keyed:
            client.close()
    # deleted through worker 1 (its owner is 0): gone for both, and from the listing
    assert through[1].delete(ws_url(NS, gone), params={"confirm": "true"}).status_code == 200
    for client in through:
        assert client.get(ws_url(NS, gone)).json()["error"]["code"] == "workspace_not_found"
        listed = client.get("/v1/workspaces", params={"namespace": NS}).json()["workspaces"]
        assert gone not in {w["workspace"] for w in listed}


def test_shutdown_stops_every_worker_and_sandbox_and_keeps_the_files(start_server):
    srv = start_server(env=WORKERS)
    w0, w1 = owned_by(0, "down"), owned_by(1, "down")  # names of their own: the module's server runs too
    with srv.client() as client:
        for ws in (w0, w1):
            assert put_workspace(client, NS, ws).status_code in (200, 201)
            assert exec_events(client, NS, ws, f"echo kept > /workspace/{ws}.txt")[-1]["exit_code"] == 0
    pids = workers_of(srv)
    assert len(pids) == 2 and all(sandboxes(srv, ws) for ws in (w0, w1))
    assert srv.stop(timeout=60) == 0
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists()
    assert not sandboxes(srv, w0) and not sandboxes(srv, w1)
    assert "worker" not in srv.output().split("Listening on", 1)[1].lower().replace("worker processes", "")
    srv.start()
    with srv.client() as client:
        for ws in (w0, w1):
            events = exec_events(client, NS, ws, f"cat /workspace/{ws}.txt")
            assert output_of(events) == "kept\n"
            assert next(e for e in events if e["type"] == "started")["container"] == "restarted"


def test_idle_alarms_run_in_each_owner(start_server):
    """Each workspace's idle alarm is armed and fired by its owner: both save and stop, and come back restored."""
    srv = start_server(env={**WORKERS, "IDLE_SECONDS": "2"})
    names = owned_by(0, "idle"), owned_by(1, "idle")
    with srv.client() as client:
        for ws in names:
            assert put_workspace(client, NS, ws).status_code in (200, 201)
            assert exec_events(client, NS, ws, f"echo saved > /workspace/{ws}.txt")[-1]["exit_code"] == 0
        for ws in names:
            wait_until(lambda ws=ws: client.get(ws_url(NS, ws)).json()["state"] == "stopped", 90, what="idle stop")
        for ws in names:
            events = exec_events(client, NS, ws, f"cat /workspace/{ws}.txt")
            assert output_of(events) == "saved\n"
            assert next(e for e in events if e["type"] == "started")["container"] == "restored"


def test_a_worker_that_dies_stops_the_server_with_an_error(start_server):
    srv = start_server(env=WORKERS)
    wait_until(lambda: "Listening on" in srv.output(), 30, what="every worker serving")
    victim = workers_of(srv)[1]
    os.kill(victim, signal.SIGKILL)
    assert srv.proc.wait(60) == 1
    assert "was killed by SIGKILL; stopping the server" in srv.output(), srv.output()
    assert not workers_of(srv)


@pytest.mark.parametrize("value", ["two", "-1", "65"])
def test_a_bad_worker_count_is_refused(tmp_path, value):
    env = {**os.environ, "SANDBOX_API_TOKEN": TOKEN}
    result = subprocess.run(
        [*flarebox_command(), "serve", "--port", "1", "--data-dir", str(tmp_path / "d"), "--workers", value],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--workers / FLAREBOX_WORKERS" in result.stderr and "whole number 1-64, 0 or 'auto'" in result.stderr


def test_a_concurrent_mix_on_two_workers_has_no_errors():
    """bench/loadgen.py's mix (exec, writes, reads checked by sha256, status) from 8 clients on 4 workspaces."""
    from bench import loadgen

    server = loadgen.Server(idle_seconds=600, workers=2)
    try:
        names = loadgen.setup(server, 4)
        assert {owner(loadgen.NS, name, 2) for name in names} == {0, 1}
        tally = loadgen.mix(server, names, 8, 10)
        assert tally.errors == [], (tally.errors[:10], server.log_tail())
        assert all(len(tally.samples[kind]) >= 10 for kind in loadgen.KINDS)
    finally:
        server.stop()
