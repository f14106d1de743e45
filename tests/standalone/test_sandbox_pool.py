"""SandboxContainer.fetch over a pooled connection the supervisor has already given up on (issue 17): when the
request head could not be written, or an idempotent GET got no answer on a reused connection, the request goes once
more on a fresh connection instead of failing with container_exited; a written POST is never sent twice. A fake
supervisor on a unix socket plays the peer."""

import socket
import threading
import time

import pytest

from durable.ports import ContainerGone
from standalone.sandbox import SandboxContainer
from standalone.snapshots import SnapshotStore
from standalone.supervisor_http import SupervisorConnections

pytestmark = pytest.mark.timeout(30)

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class FakeSupervisor:
    """Answers the first request; `deaf`: stops reading that connection first (shutdown SHUT_RD: the next write to
    it fails with EPIPE, yet it does not look closed) and closes it a moment later; else reads the next request on
    it and hangs up unanswered. Then answers one later connection, if one comes. Counts the request heads read."""

    def __init__(self, path: str, deaf: bool):
        self.heads = 0
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen()
        self.listener.settimeout(1)
        self.deaf = deaf
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _read_head(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        self.heads += 1

    def _serve(self) -> None:
        first, _ = self.listener.accept()
        self._read_head(first)
        if self.deaf:
            # stop reading before answering: the client's next head can then never get in ahead of the shutdown
            first.shutdown(socket.SHUT_RD)
            first.sendall(OK)
            time.sleep(0.3)
        else:
            first.sendall(OK)
            self._read_head(first)
        first.close()
        try:
            later, _ = self.listener.accept()
        except TimeoutError:
            return
        self._read_head(later)
        later.sendall(OK)
        later.close()


@pytest.fixture
def container(tmp_path, monkeypatch):
    box = SandboxContainer("ns", "pool", tmp_path / "live", tmp_path / "run", SnapshotStore(tmp_path / "snaps"))
    monkeypatch.setattr(box, "running", lambda: True)
    box._client = SupervisorConnections(str(tmp_path / "sv.sock"), None, 10.0)
    yield box, str(tmp_path / "sv.sock")


async def test_a_request_that_was_never_written_goes_again_on_a_fresh_connection(container):
    box, path = container
    fake = FakeSupervisor(path, deaf=True)
    assert await (await box.fetch("GET", "/health")).read() == b"ok"
    # the pooled connection is dead for writing; the POST must not fail because of it
    assert await (await box.fetch("POST", "/exec", body=b"{}")).read() == b"ok"
    assert fake.heads == 2
    box._client.close()


async def test_a_request_that_was_written_is_not_repeated(container):
    box, path = container
    fake = FakeSupervisor(path, deaf=False)
    assert await (await box.fetch("GET", "/health")).read() == b"ok"
    with pytest.raises(ContainerGone):  # read, then no answer: it may have acted, so never a second time
        await box.fetch("POST", "/exec", body=b"{}")
    fake.thread.join()
    assert fake.heads == 2
    box._client.close()


async def test_a_get_without_an_answer_on_a_reused_connection_goes_again(container):
    box, path = container
    fake = FakeSupervisor(path, deaf=False)
    assert await (await box.fetch("GET", "/health")).read() == b"ok"
    assert await (await box.fetch("GET", "/files?path=/x")).read() == b"ok"
    assert fake.heads == 3
    box._client.close()
