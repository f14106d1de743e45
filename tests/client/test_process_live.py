"""RemoteProcess (the plugin's process handle) with the real client against a real `flarebox serve`: a stream cut
by a loopback proxy is reattached by request id from the last offset; cancel before and during a command; stdin
staged through PUT /files when it is large or not UTF-8. No Hermes needed: the handle is plain Python."""

import os
import socket
import threading
import time
import uuid

import pytest
from e2e import serving

from flarebox_hermes.client import Client
from flarebox_hermes.process import RemoteProcess

pytestmark = pytest.mark.timeout(120)

NS = "clientlive"


@pytest.fixture(scope="module")
def server():
    with serving() as proc:
        yield proc


@pytest.fixture
def workspace(server):
    name = "w" + uuid.uuid4().hex[:10]
    with Client(server.url, server.token) as client:
        client.put_workspace(NS, name, {"persistent": False})
        yield client, name
        try:
            client.delete_workspace(NS, name)
        except Exception:
            pass


class CuttingProxy:
    """A loopback TCP proxy that forwards one connection and cuts it after `limit` response bytes."""

    def __init__(self, upstream_port: int, limit: int):
        self.limit = limit
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cut = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        try:
            down, _ = self.listener.accept()
        except OSError:
            return
        up = socket.create_connection(("127.0.0.1", self.upstream_port))

        def pump_up():
            try:
                while data := down.recv(65536):
                    up.sendall(data)
            except OSError:
                pass

        threading.Thread(target=pump_up, daemon=True).start()
        sent = 0
        try:
            while sent < self.limit and (data := up.recv(min(65536, self.limit - sent))):
                down.sendall(data)
                sent += len(data)
        except OSError:
            pass
        self.cut.set()
        for sock in (down, up):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def close(self):
        self.listener.close()


def read_all(proc: RemoteProcess, timeout: float = 60) -> bytes:
    chunks = []
    deadline = time.monotonic() + timeout
    fd = proc.stdout.fileno()
    while time.monotonic() < deadline:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(timeout)
    return b"".join(chunks)


def make_process(client, name, command, *, exec_client=None, stdin=None, timeout=60):
    def run(request, offset):
        if offset is None:
            return (exec_client or client).exec(NS, name, request)
        return client.reattach(NS, name, request["request_id"], offset)

    def stage(data: bytes) -> str:
        path = f"/tmp/.stdin-{uuid.uuid4().hex}"  # noqa: S108 - inside the sandbox
        client.write_file(NS, name, path, data, mode=0o600)
        return path

    return RemoteProcess(
        command=command,
        request_fields={"timeout": timeout, "login": False, "cwd": None},
        run_fn=run,
        cancel_fn=lambda rid: client.cancel(NS, name, rid),
        stage_fn=stage,
        stdin=stdin,
        inline_stdin_limit=64 * 1024,
    )


def test_cut_stream_is_reattached_without_loss_or_duplication(server, workspace):
    client, name = workspace
    proxy = CuttingProxy(server.port, limit=1500)  # headers plus a few output frames, then the line goes dead
    try:
        with Client(f"http://127.0.0.1:{proxy.port}", server.token) as cut_client:
            command = "for i in $(seq 1 60); do echo line $i; sleep 0.03; done; exit 7"
            proc = make_process(client, name, command, exec_client=cut_client)
            output = read_all(proc)
    finally:
        proxy.close()
    assert proxy.cut.is_set()
    assert output.decode() == "".join(f"line {i}\n" for i in range(1, 61))
    assert proc.returncode == 7 and proc.error is None
    assert not hasattr(proc, "pid")


def test_kill_during_a_command_cancels_it_remotely(server, workspace):
    client, name = workspace
    proc = make_process(client, name, "echo started; sleep 60")
    time.sleep(1.0)
    started = time.monotonic()
    proc.kill()
    proc.kill()  # idempotent
    assert time.monotonic() - started < 2  # kill() itself never waits for the network round trip
    read_all(proc, timeout=30)
    assert proc.returncode == 130
    check = make_process(client, name, "pgrep -fx 'sleep 60' || echo gone")
    assert read_all(check) == b"gone\n"


def test_kill_before_start_is_safe(server, workspace):
    client, name = workspace
    proc = make_process(client, name, "sleep 30", stdin="x" * 200_000)  # staging delays the exec
    proc.kill()
    read_all(proc, timeout=30)
    assert proc.returncode == 130


def test_large_and_non_utf8_stdin_is_staged_byte_exact(server, workspace):
    client, name = workspace
    raw = os.urandom(300_000)
    text = raw.decode("utf-8", "surrogateescape")  # how Hermes carries bytes that are not UTF-8
    proc = make_process(client, name, "sha256sum | cut -c1-64; ls /tmp | grep -c '^.stdin-' || true", stdin=text)
    out = read_all(proc).decode().split()
    import hashlib

    assert out[0] == hashlib.sha256(raw).hexdigest()
    assert out[1] == "0"  # the staged file was removed before the command ran
    small = make_process(client, name, "cat", stdin="日本語 🙂 $(x)\n")
    assert read_all(small).decode() == "日本語 🙂 $(x)\n"


def test_unknown_outcome_is_an_error_not_an_exit_code(server, workspace):
    client, name = workspace

    def refused(request, offset):
        raise ConnectionError  # not a client error: the reader must still end the handle

    proc = RemoteProcess(command="true", request_fields={"timeout": 5}, run_fn=refused, cancel_fn=lambda rid: None)
    read_all(proc)
    assert proc.error and proc.returncode == 1
    with Client("http://127.0.0.1:9", server.token) as dead:
        proc = make_process(dead, name, "true")
        read_all(proc)
    assert proc.error_code == "transport" and "did not run" in proc.error


def test_output_over_the_limit_is_reported_not_truncated_silently(server, workspace):
    client, name = workspace
    proc = make_process(client, name, "head -c 2100000 /dev/zero | tr '\\0' a; echo never-reached")
    output = read_all(proc).decode()
    assert proc.returncode == 1 and proc.error is None  # the command's own outcome, not a connection failure
    assert output.endswith("(output_limit)]\n")
    assert "never-reached" not in output


def test_kill_never_waits_for_a_slow_cancel():
    gate = threading.Event()
    cancels = []

    def run(request, offset):
        yield {"type": "started", "request_id": request["request_id"], "container": "fresh", "snapshot": None}
        gate.wait(10)
        yield {"type": "exit", "exit_code": 130, "reason": "cancelled", "duration_ms": 1}

    def slow_cancel(request_id):
        cancels.append(request_id)
        time.sleep(3)  # a server that is slow to answer the cancel
        gate.set()

    proc = RemoteProcess(command="sleep 60", request_fields={}, run_fn=run, cancel_fn=slow_cancel)
    started = time.monotonic()
    proc.kill()
    proc.kill()
    assert time.monotonic() - started < 1  # 3 s cancel, but kill() returned at once
    assert proc.wait(15) == 130
    assert cancels == [proc.request_id]  # exactly one remote cancel, for this command
