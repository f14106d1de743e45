"""The server's HTTP/1.1 client to a supervisor (standalone/supervisor_http.py), against real unix-socket peers:
kept-alive reuse, streamed bodies both ways, and every way a hostile answer can go wrong ending in ContainerGone
with the connection never reused. (Retries on a dead kept connection: test_sandbox_pool.py; endless answers:
tests/security/test_fake_supervisor.py.)"""

import asyncio
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from durable.ports import ContainerGone
from standalone.supervisor_http import SEND_BUFFER_BYTES, SupervisorConnections

pytestmark = pytest.mark.timeout(30)


class Peer:
    """A unix-socket server answering each request head with `answer(head, reader)` (raw bytes; None hangs up),
    `close_after` the first answer; counts connections and heads."""

    def __init__(self, path: Path, answer, close_after: bool = False):
        self.path, self.answer, self.close_after = path, answer, close_after
        self.connections = 0
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []
        self._tasks: set[asyncio.Task] = set()

    async def __aenter__(self) -> "Peer":
        self.server = await asyncio.start_unix_server(self._handle, path=str(self.path))
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._tasks.add(asyncio.current_task())
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                reply = await self.answer(head, reader)
                if reply is None:
                    return
                writer.write(reply)
                await writer.drain()
                if self.close_after:
                    return
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


def ok(body: bytes = b"ok") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)


@pytest.fixture
def sock_path():
    base = Path(tempfile.mkdtemp(prefix="fbx-", dir="/tmp"))  # noqa: S108 - short: unix socket paths < 108 bytes
    try:
        yield base / "sv.sock"
    finally:
        shutil.rmtree(base, ignore_errors=True)


async def _read(answer) -> bytes:
    return b"".join([chunk async for chunk in answer.chunks()])


async def test_one_connection_serves_request_after_request(sock_path):
    async def answer(head, reader):
        return ok(b"n%d" % len(peer.heads))

    async with Peer(sock_path, answer) as peer:
        pool = SupervisorConnections(str(sock_path), None, 5.0)
        try:
            bodies = [await _read(await pool.request("GET", "/health", None, None, 5.0)) for _ in range(5)]
        finally:
            pool.close()
    assert bodies == [b"n1", b"n2", b"n3", b"n4", b"n5"]
    assert peer.connections == 1


def _send_buffer_cap_and_default() -> tuple[int, int]:
    with socket.socket(socket.AF_UNIX) as plain:
        default = plain.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    return int(Path("/proc/sys/net/core/wmem_max").read_text()), default


async def test_a_connection_sends_from_a_wide_buffer(sock_path):
    """A file PUT is written to the supervisor in megabyte pieces: its socket's send buffer is widened from the
    kernel's ~200 KiB default (as far as net.core.wmem_max allows; Linux reports twice what it keeps)."""
    cap, default = _send_buffer_cap_and_default()
    if min(cap, SEND_BUFFER_BYTES) * 2 <= default:
        pytest.skip(f"net.core.wmem_max ({cap}) allows no wider send buffer than the default")

    async with Peer(sock_path, lambda head, reader: asyncio.sleep(0, ok())):
        pool = SupervisorConnections(str(sock_path), None, 5.0)
        try:
            await _read(await pool.request("GET", "/health", None, None, 5.0))
            (conn,) = pool._idle
            sent = conn.transport.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
        finally:
            pool.close()
    assert sent == min(cap, SEND_BUFFER_BYTES) * 2 > default


async def test_a_body_left_unread_is_never_followed_on_the_same_connection(sock_path):
    async def answer(head, reader):
        return ok(b"x" * 100_000)

    async with Peer(sock_path, answer) as peer:
        pool = SupervisorConnections(str(sock_path), None, 5.0)
        try:
            first = await pool.request("GET", "/files?path=a", None, None, 5.0)
            chunks = first.chunks()
            assert await chunks.__anext__()  # part of it only
            await chunks.aclose()
            assert await _read(await pool.request("GET", "/health", None, None, 5.0)) == b"x" * 100_000
        finally:
            pool.close()
    assert peer.connections == 2  # the half-read one was closed, not reused


async def test_a_streamed_request_body_goes_chunked_and_arrives_whole(sock_path):
    async def answer(head, reader):
        assert b"transfer-encoding: chunked" in head.lower()
        body = b""
        while True:
            size = int((await reader.readline()).strip(), 16)
            if size == 0:
                await reader.readline()
                break
            body += await reader.readexactly(size)
            await reader.readline()
        peer.bodies.append(body)
        return ok()

    async def parts():
        for i in range(50):
            yield b"%04d" % i * 1000

    async with Peer(sock_path, answer) as peer:
        pool = SupervisorConnections(str(sock_path), None, 5.0)
        try:
            assert await _read(await pool.request("PUT", "/files?path=x", {}, parts(), 5.0)) == b"ok"
        finally:
            pool.close()
    assert peer.bodies == [b"".join(b"%04d" % i * 1000 for i in range(50))]


async def test_a_bytes_body_carries_its_length(sock_path):
    async def answer(head, reader):
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        peer.bodies.append(await reader.readexactly(length))
        return ok()

    async with Peer(sock_path, answer) as peer:
        pool = SupervisorConnections(str(sock_path), None, 5.0)
        try:
            await _read(await pool.request("POST", "/exec", {"Content-Type": "application/json"}, b'{"a":1}', 5.0))
        finally:
            pool.close()
    assert peer.bodies == [b'{"a":1}']
    assert b"content-type: application/json" in peer.heads[0].lower()


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",  # then the connection closes
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # not a chunk size
    ],
)
async def test_a_body_that_breaks_off_is_container_gone(sock_path, reply):
    async def answer(head, reader):
        return reply

    async with Peer(sock_path, answer, close_after=True):
        pool = SupervisorConnections(str(sock_path), None, 5.0)
        try:
            answer = await pool.request("GET", "/exec/x", None, None, 5.0)
            with pytest.raises(ContainerGone, match="broke off"):
                await _read(answer)
        finally:
            pool.close()


async def test_a_malformed_or_oversized_head_is_container_gone(sock_path):
    replies = [b"NOT HTTP AT ALL\r\n\r\n", b"HTTP/1.1 200 OK\r\nX: " + b"y" * 3_000_000 + b"\r\n\r\n"]

    async def answer(head, reader):
        return replies[len(peer.heads) - 1]

    async with Peer(sock_path, answer) as peer:
        pool = SupervisorConnections(str(sock_path), None, 5.0)
        try:
            for _ in replies:
                with pytest.raises(ContainerGone, match="malformed answer"):
                    await pool.request("GET", "/health", None, None, 5.0)
        finally:
            pool.close()
    assert peer.connections == 2  # neither connection was kept


async def test_silence_ends_the_wait_with_a_message_that_says_what_to_do(sock_path):
    async def answer(head, reader):
        await asyncio.sleep(10)

    async with Peer(sock_path, answer):
        pool = SupervisorConnections(str(sock_path), None, 5.0)
        try:
            with pytest.raises(ContainerGone, match="nothing from its supervisor for 0.3 s.*reattach"):
                await pool.request("POST", "/exec", None, b"{}", 0.3)
        finally:
            pool.close()


async def test_a_stream_that_goes_silent_mid_body_ends_too(sock_path):
    async def answer(head, reader):
        return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"  # and then nothing

    async with Peer(sock_path, answer):
        pool = SupervisorConnections(str(sock_path), None, 5.0)
        try:
            answer = await pool.request("POST", "/exec", None, b"{}", 0.3)
            chunks = answer.chunks()
            assert await chunks.__anext__() == b"abc"
            with pytest.raises(ContainerGone, match="nothing from its supervisor"):
                await chunks.__anext__()
        finally:
            pool.close()


async def test_nobody_listening_is_container_gone(sock_path):
    pool = SupervisorConnections(str(sock_path), None, 5.0)
    with pytest.raises(ContainerGone, match="cannot be reached"):
        await pool.request("GET", "/health", None, None, 1.0)


async def test_a_peer_that_is_not_the_sandbox_is_refused(sock_path):
    async def answer(head, reader):
        return ok()

    async with Peer(sock_path, answer) as peer:
        pool = SupervisorConnections(str(sock_path), lambda: (12345, 1), 5.0)  # a uid that is not ours
        with pytest.raises(ContainerGone, match="answered by a stranger"):
            await pool.request("GET", "/health", None, None, 1.0)
    assert peer.heads == []  # refused before a byte was sent


async def test_close_ends_a_stream_in_progress(sock_path):
    async def answer(head, reader):
        return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"

    async with Peer(sock_path, answer):
        pool = SupervisorConnections(str(sock_path), None, 5.0)
        answer = await pool.request("GET", "/exec/x", None, None, 5.0)
        chunks = answer.chunks()
        assert await chunks.__anext__() == b"abc"
        pool.close()
        with pytest.raises(ContainerGone):
            await asyncio.wait_for(chunks.__anext__(), 5)
        with pytest.raises(ContainerGone, match="not running"):
            await pool.request("GET", "/health", None, None, 1.0)
