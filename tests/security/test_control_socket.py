"""The supervisor's control socket, attacked from inside a workspace the way a prompt-injected agent would: through
exec only. Break 1 (steering the server into another workspace's sandbox) and break 5 (bricking a workspace name
past DELETE) of the isolation issue, through a real `flarebox serve`; and the server's own peer check, with a
stranger planted on the host path.
"""

import asyncio
import contextlib
import hashlib
import os
import socket
import threading
import time

import httpx
import pytest
import sandbox_fixtures as fx
from e2e import exec_events, output_of, run_ok, terminal, ws_url

from durable.ports import ContainerGone, StartSpec
from standalone.peer import descends_from, parent_pid
from standalone.supervisor_http import SupervisorConnections

short_tmp, make_sandbox = fx.short_tmp, fx.make_sandbox
pytestmark = pytest.mark.timeout(180)

POOL_EXPIRY_WAIT = 7  # the server's pooled connections to a supervisor expire after ~5 s of disuse


def _key(data_dir, ns: str, ws: str) -> str:
    """A workspace's runtime key, computed the way an attacker who read /proc/self/mountinfo would."""
    root = (data_dir / "workspaces" / ns / ws / "root").resolve()
    return hashlib.sha256(f"{ns}/{ws}\0{root}".encode()).hexdigest()[:12]


def test_a_workspace_cannot_point_its_socket_at_another_workspace(secure_server):
    srv = secure_server
    with srv.client() as client:
        for name in ("swap-a", "swap-b"):
            assert client.put(ws_url("swap", name), json={}).status_code in (200, 201)
            run_ok(client, "swap", name, "true")
        victim_sock = srv.data_dir / "run" / _key(srv.data_dir, "swap", "swap-b") / "sv.sock"
        assert victim_sock.exists()  # the victim's real socket, the attack's target
        attack = (
            "cd /run/flarebox 2>/dev/null && mv sv.sock mine.sock && "
            f"ln -s {victim_sock} sv.sock && echo swapped || echo no-swap"
        )
        out, _ = run_ok(client, "swap", "swap-a", attack)
        assert out.strip() == "no-swap"
        time.sleep(POOL_EXPIRY_WAIT)  # let every pooled connection expire, as the attack did
        assert run_ok(client, "swap", "swap-a", "hostname")[0] == "swap-a\n"
        assert run_ok(client, "swap", "swap-b", "hostname")[0] == "swap-b\n"
        # the file API of A writes into A, never B
        url = ws_url("swap", "swap-a", "files")
        assert client.put(url, params={"path": "/workspace/planted"}, content=b"x").status_code in (200, 201)
        assert run_ok(client, "swap", "swap-b", "test -e /workspace/planted && echo yes || echo no")[0] == "no\n"


def test_a_workspace_cannot_brick_its_name_past_delete(secure_server):
    srv = secure_server
    with srv.client() as client:
        assert client.put(ws_url("brick", "w"), json={}).status_code in (200, 201)
        brick = "rm -f /run/flarebox/sv.sock; mkdir -p /run/flarebox/sv.sock/x 2>/dev/null && echo bricked || echo no"
        assert run_ok(client, "brick", "w", brick)[0] == "no\n"
        assert client.post(ws_url("brick", "w", "stop")).status_code == 200
        assert run_ok(client, "brick", "w", "echo alive")[0] == "alive\n"  # restarts cleanly
        assert client.delete(ws_url("brick", "w"), params={"confirm": "true"}).status_code == 200
        assert not (srv.data_dir / "run" / _key(srv.data_dir, "brick", "w")).exists()
        assert client.put(ws_url("brick", "w"), json={}).status_code == 201
        events = exec_events(client, "brick", "w", "echo again")
        assert terminal(events).get("exit_code") == 0 and output_of(events) == "again\n"


def _spec() -> StartSpec:
    return StartSpec(image="hermes", instance="lite", env={}, enable_internet=False)


_OK = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"ok":true}'


def _impostor(path: str, stop: threading.Event, accepted: list) -> socket.socket:
    """A stranger (this test process) listening on `path`, answering like a supervisor would."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(8)
    sock.settimeout(0.2)

    def serve():
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            accepted.append(1)
            with conn, contextlib.suppress(OSError):  # a refused peer is hung up on before it can answer
                conn.recv(65536)
                conn.sendall(_OK)

    threading.Thread(target=serve, daemon=True).start()
    return sock


async def test_the_server_refuses_a_stranger_on_the_socket_path(make_sandbox):
    """Even if something replaced the socket on the host, the server checks who listens (SO_PEERCRED) and refuses
    anyone who is not a process of this workspace's own sandbox."""
    sandbox = make_sandbox()
    await sandbox.start(_spec())
    response = await sandbox.fetch("GET", "/health")
    assert response.status == 200 and (await response.json())["ok"] is True
    sandbox._client.close()  # drop the kept connection to the real supervisor
    path = str(sandbox.socket_path)
    sandbox._client = SupervisorConnections(path, sandbox._expected_peer, 10.0)
    os.unlink(sandbox.socket_path)
    stop, accepted = threading.Event(), []
    impostor = _impostor(path, stop, accepted)
    try:
        with pytest.raises(ContainerGone, match="cannot be reached"):
            await sandbox.fetch("GET", "/health")
        for _ in range(50):  # the stranger's accept() may come after our hang-up
            if accepted:
                break
            await asyncio.sleep(0.05)
        assert accepted  # it was the stranger that was refused, not a missing socket
        async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=path)) as unchecked:
            assert (await unchecked.get("http://sandbox/health")).json() == {"ok": True}  # what it would have said
    finally:
        stop.set()
        impostor.close()


def test_descends_from_walks_the_real_process_tree():
    assert descends_from(os.getpid(), os.getpid())
    assert descends_from(os.getpid(), parent_pid(os.getpid()))
    assert descends_from(os.getpid(), 1)
    assert not descends_from(parent_pid(os.getpid()), os.getpid())
    assert not descends_from(1, os.getpid())
    assert not descends_from(2**22 + 12345, 1)  # no such process
