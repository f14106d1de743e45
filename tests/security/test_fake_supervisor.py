"""A process in a sandbox that answers in the supervisor's place must not make the server buffer without bound.

The attack: a hostile HTTP server on a unix socket answers every request with 200 and an ENDLESS chunked body
(64 KiB chunks), or drips one byte every 0.5 s for ever. The server's real client code talks to it: the standalone
`SandboxResponse` behind a client built as `SandboxContainer` builds its own, the supervisor calls the workspace
makes (health, error_of, make_dir, sync), and `SandboxContainer._health`. Each must end promptly, having pulled
at most CONTROL_BODY_BYTES and about one chunk, with the server's Python memory (tracemalloc peak) staying small.

The hostile server stops sending after SAFETY_BYTES and stalls instead of closing: to the client the body is still
endless, and code that buffers everything (the bug) fails the byte count without eating the host's memory.
"""

import asyncio
import contextlib
import shutil
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from durable import supervisor_client as supervisor
from durable.ports import ContainerGone
from protocol.errors import ProtocolError
from protocol.limits import CONTROL_BODY_BYTES
from standalone import sandbox
from standalone.sandbox import SandboxContainer, SandboxResponse
from standalone.snapshots import SnapshotStore
from standalone.supervisor_http import SupervisorConnections

pytestmark = pytest.mark.timeout(60)

CHUNK = 64 * 1024
SAFETY_BYTES = 64 * 1024 * 1024
# what may reach the socket beyond what the client read: one chunk in flight plus the kernel's socket buffers
SLACK_BYTES = 2 * 1024 * 1024
MEMORY_BUDGET = 16 * 1024 * 1024  # Python allocations while one attack runs (a buffered body would be 64 MiB)
PROMPT_SECONDS = 3.0


class HostileSupervisor:
    """Answers every request on `path` with `status`, chunked, for ever: `flood` (64 KiB chunks as fast as the
    client reads) or `drip` (one byte every 0.5 s). Runs its own event loop in a thread."""

    def __init__(self, path: Path, mode: str = "flood", status: int = 200):
        self.path, self.mode, self.status = path, mode, status
        self.requests = 0
        self.largest = 0  # bytes of the largest response body sent
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "HostileSupervisor":
        self._thread.start()
        assert self._ready.wait(10), "the hostile server did not start"
        return self

    def __exit__(self, *exc) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        tasks: set[asyncio.Task] = set()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            tasks.add(asyncio.current_task())
            try:
                await self._answer(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
                pass
            finally:
                writer.close()
                tasks.discard(asyncio.current_task())

        server = await asyncio.start_unix_server(handle, path=str(self.path))
        self._ready.set()
        await self._stop.wait()
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:  # keep-alive: one answer per request head (a request body is never read: it is ignored)
            await reader.readuntil(b"\r\n\r\n")
            self.requests += 1
            head = f"HTTP/1.1 {self.status} X\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
            writer.write(head.encode())
            sent = 0
            while sent < SAFETY_BYTES:
                data = b"x" * CHUNK if self.mode == "flood" else b"x"
                writer.write(b"%x\r\n%b\r\n" % (len(data), data))
                await writer.drain()
                sent += len(data)
                self.largest = max(self.largest, sent)
                if self.mode == "drip":
                    await asyncio.sleep(0.5)
            await asyncio.sleep(3600)  # endless to the client, without costing the host its memory


class HostileContainer:
    """`Container.fetch` as SandboxContainer does it — the same client, timeouts and SandboxResponse — over the
    hostile socket (the container's own client also checks its peer, which this test does not need)."""

    def __init__(self, socket_path: Path, read_seconds: float | None = None):
        self.client = _client(socket_path)
        self.read_seconds = read_seconds

    def running(self) -> bool:
        return True

    async def fetch(self, method, path, *, body=None, headers=None, timeout=None) -> SandboxResponse:
        wait = sandbox.SILENCE_SECONDS if timeout is None else timeout
        answer = await self.client.request(method, path, headers, body, wait)
        return SandboxResponse(answer, read_seconds=self.read_seconds or timeout)


def _client(socket_path: Path) -> SupervisorConnections:
    return SupervisorConnections(str(socket_path), None, sandbox.CONNECT_SECONDS)


@pytest.fixture
def socket_dir():
    path = Path(tempfile.mkdtemp(prefix="fbx-", dir="/tmp"))  # noqa: S108 - short: unix socket paths < 108 bytes
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def watched():
    """Elapsed seconds and the Python memory peak (tracemalloc, every thread) of the block."""
    result = {}
    tracemalloc.start()
    started = time.monotonic()
    try:
        yield result
    finally:
        result["seconds"] = time.monotonic() - started
        result["peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


async def _error_of(container):
    resp = await container.fetch("POST", "/exec", body=b"{}", headers={"content-type": "application/json"})
    return await supervisor.error_of(resp)


ATTACKS = {
    "health": (lambda c: supervisor.health(c), lambda r: r is None),
    "error_of": (_error_of, lambda r: isinstance(r, ProtocolError) and r.code == "exec_failed"),
    "make_dir": (lambda c: supervisor.make_dir(c, "/workspace/x"), lambda r: r is False),
    "sync": (lambda c: supervisor.sync(c), lambda r: r is None),  # a running container is snapshotted anyway
}


async def _attack(container, attack) -> tuple:
    """(what `attack` returned, what it cost) for one control call against the hostile supervisor."""
    try:
        with watched() as seen:
            result = await asyncio.wait_for(attack(container), 30)
    finally:
        container.client.close()
    return result, seen


def assert_bounded(hostile: HostileSupervisor, seen: dict) -> None:
    assert hostile.largest <= CONTROL_BODY_BYTES + SLACK_BYTES, f"{hostile.largest} bytes pulled"
    assert seen["peak"] < MEMORY_BUDGET, f"{seen['peak']} bytes of Python memory"
    assert seen["seconds"] < PROMPT_SECONDS, f"{seen['seconds']:.1f} s"


@pytest.mark.parametrize("status", [200, 500])
@pytest.mark.parametrize("call", sorted(ATTACKS))
async def test_an_endless_control_answer_is_refused_at_the_cap(socket_dir, call, status):
    attack, expected = ATTACKS[call]
    with HostileSupervisor(socket_dir / "sv.sock", status=status) as hostile:
        result, seen = await _attack(HostileContainer(hostile.path), attack)
    assert expected(result), result
    assert hostile.requests == 1
    assert hostile.largest > CONTROL_BODY_BYTES  # it really sent past the cap: the client stopped reading there
    assert_bounded(hostile, seen)


async def test_the_refusal_says_why(socket_dir):
    with HostileSupervisor(socket_dir / "sv.sock") as hostile:
        container = HostileContainer(hostile.path)
        try:
            resp = await container.fetch("GET", "/health")
            with pytest.raises(ContainerGone, match=f"more than {CONTROL_BODY_BYTES} bytes for a control answer"):
                await asyncio.wait_for(resp.json(), 30)
        finally:
            container.client.close()


@pytest.mark.parametrize("call", sorted(ATTACKS))
async def test_a_slow_drip_ends_by_the_total_deadline(socket_dir, call):
    attack, expected = ATTACKS[call]
    with HostileSupervisor(socket_dir / "sv.sock", mode="drip") as hostile:
        result, seen = await _attack(HostileContainer(hostile.path, read_seconds=1.0), attack)
    assert expected(result), result
    assert 1.0 <= seen["seconds"] < PROMPT_SECONDS


async def test_the_deadline_defaults_to_the_requests_timeout(socket_dir):
    with HostileSupervisor(socket_dir / "sv.sock", mode="drip") as hostile:
        container = HostileContainer(hostile.path)  # no read_seconds: the request's own timeout bounds the read
        try:
            resp = await container.fetch("GET", "/health", timeout=1.0)
            started = time.monotonic()
            with pytest.raises(ContainerGone, match="did not finish a control answer in 1 s"):
                await asyncio.wait_for(resp.read(), 30)
            assert time.monotonic() - started < PROMPT_SECONDS
            resp = await container.fetch("GET", "/health")
            assert resp.read_seconds == sandbox.CONTROL_READ_SECONDS  # a request without one: 30 s
        finally:
            container.client.close()


async def test_startup_polling_refuses_an_endless_health(socket_dir):
    """`SandboxContainer._health` polls /health itself: an impostor answering it endlessly costs each poll at
    most the cap, and the start ends with startup_timeout."""
    box = SandboxContainer(
        "ns", "ws", socket_dir / "live", socket_dir / "run", SnapshotStore(socket_dir / "snaps"), startup_timeout=1.0
    )
    box.socket_dir.mkdir(parents=True)
    box.running = lambda: True  # no bwrap here: the impostor stands in for the whole sandbox
    with HostileSupervisor(box.socket_path) as hostile:
        box._client = _client(box.socket_path)
        try:
            with watched() as seen, pytest.raises(ProtocolError) as err:
                await asyncio.wait_for(box._health(), 30)
        finally:
            box._client.close()
    assert err.value.code == "startup_timeout"
    assert hostile.requests >= 1
    assert_bounded(hostile, seen)
