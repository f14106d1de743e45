"""The standalone port proxy's HTTP/1.1 client (standalone/upstream.py) against a stand-in supervisor and raw
services on loopback: the descriptor hand-over refuses everything but one TCP socket to the asked port, kept-alive
connections are reused only after a whole exchange, and a broken or malformed answer is never passed off as whole."""

import array
import asyncio
import os
import socket
import struct
import threading
import time

import pytest

from durable.ports import ContainerGone
from protocol.errors import ProtocolError
from standalone import upstream
from standalone.upstream import PortConnections, open_port_socket

pytestmark = pytest.mark.timeout(60)

HANDED_OVER = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
ME = (os.getuid(), os.getpid())  # the stand-in supervisor is a thread of this process: its peer is us


class FakeSupervisor:
    """Answers POST /port-sockets/{port} on a unix socket. `hand(conn, port)` sends the answer; by default the real
    supervisor's: connect to 127.0.0.1:port and pass that socket over."""

    def __init__(self, path, hand=None):
        self.path = str(path)
        self.hand = hand or self.connect_and_pass
        self.requests: list[bytes] = []
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    head += conn.recv(4096)
                self.requests.append(head)
                port = int(head.split(b" ")[1].rsplit(b"/", 1)[1])
                self.hand(conn, port)

    @staticmethod
    def connect_and_pass(conn, port):
        try:
            upstream_sock = socket.create_connection(("127.0.0.1", port))
        except OSError:
            body = b'{"error":{"code":"upstream_unavailable"}}'
            conn.sendall(
                b"HTTP/1.1 502 Bad Gateway\r\nX-Flarebox-Proxy-Error: upstream_unavailable\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            return
        with upstream_sock:
            send_fds(conn, [upstream_sock.fileno()])

    def close(self):
        self.sock.close()


def send_fds(conn, fds, data=HANDED_OVER):
    conn.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])


class Service:
    """A raw HTTP/1.1 service: `answer(conn, request_head, n)` handles the n-th request (any connection); records
    every connection and request head."""

    def __init__(self, answer):
        self.answer = answer
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []
        self.closed = threading.Event()  # a connection of ours saw EOF
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn):
        buffered = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buffered:
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        data = b""
                    if not data:
                        self.closed.set()
                        return
                    buffered += data
                head, _, buffered = buffered.partition(b"\r\n\r\n")
                self.heads.append(head)
                try:
                    buffered = self._body(conn, head, buffered)
                    if self.answer(conn, head, len(self.heads)) is False:
                        return
                except OSError:
                    self.closed.set()
                    return

    @staticmethod
    def _recv(conn) -> bytes:
        data = conn.recv(65536)
        if not data:
            raise ConnectionResetError("the client closed its connection")
        return data

    def _body(self, conn, head, buffered):
        lower = head.lower()
        if b"content-length:" in lower:
            length = int(lower.split(b"content-length:")[1].split(b"\r\n")[0])
            while len(buffered) < length:
                buffered += self._recv(conn)
            self.bodies.append(buffered[:length])
            return buffered[length:]
        if b"transfer-encoding: chunked" in lower:
            body = b""
            while True:
                while b"\r\n" not in buffered:
                    buffered += self._recv(conn)
                size_line, _, buffered = buffered.partition(b"\r\n")
                size = int(size_line, 16)
                while len(buffered) < size + 2:
                    buffered += self._recv(conn)
                body, buffered = body + buffered[:size], buffered[size + 2 :]
                if size == 0:
                    self.bodies.append(body)
                    return buffered
        self.bodies.append(None)  # no body at all
        return buffered

    def close(self):
        self.sock.close()


def ok(body=b"hello", extra=b""):
    def answer(conn, head, n):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), extra, body))

    return answer


@pytest.fixture
def supervisor(tmp_path):
    made = []

    def make(hand=None):
        sup = FakeSupervisor(tmp_path / f"sv{len(made)}.sock", hand)
        made.append(sup)
        return sup

    yield make
    for sup in made:
        sup.close()


@pytest.fixture
def service():
    made = []

    def make(answer):
        made.append(Service(answer))
        return made[-1]

    yield make
    for svc in made:
        svc.close()


def pool_for(sup) -> PortConnections:
    return PortConnections(lambda port, closer: open_port_socket(sup.path, lambda: ME, port, 5, closer))


async def get(pool, port, path="/", method="GET", headers=None, body=None, head_seconds=5.0):
    response = await pool.request(port, method, path, headers or {}, body, head_seconds)
    return response, await response.read(1 << 24)


async def closed(svc: "Service", seconds: float) -> bool:
    """Whether the service saw one of its connections closed, within `seconds` (the loop runs meanwhile)."""
    return await asyncio.to_thread(svc.closed.wait, seconds)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def test_a_plain_get_has_no_body_and_its_connection_is_reused(supervisor, service):
    svc = service(ok())
    sup = supervisor()
    pool = pool_for(sup)
    for _ in range(3):
        response, body = await get(pool, svc.port, "/a?b=c", headers={"x-custom": "kept", "host": "forged"})
        assert (response.status, body) == (200, b"hello")
    assert svc.connections == 1 and len(sup.requests) == 1  # one hand-over, one upstream connection
    head = svc.heads[0].decode().lower()
    assert head.startswith("get /a?b=c http/1.1\r\n")
    assert f"host: 127.0.0.1:{svc.port}" in head and "x-custom: kept" in head and "forged" not in head
    assert "transfer-encoding" not in head and "content-length" not in head
    assert svc.bodies == [None, None, None]
    pool.close()


async def test_bodies_go_with_their_length_or_chunked(supervisor, service):
    svc = service(ok(b"done"))
    pool = pool_for(supervisor())

    async def chunks():
        yield b"ab"
        yield b""
        yield b"cd"

    await get(pool, svc.port, method="POST", headers={"content-length": "4"}, body=chunks())
    await get(pool, svc.port, method="PUT", body=chunks())
    assert svc.bodies == [b"abcd", b"abcd"]
    assert b"transfer-encoding: chunked" in svc.heads[1].lower() and b"content-length" not in svc.heads[1].lower()
    assert svc.connections == 1
    pool.close()


async def test_an_idle_connection_the_service_closed_is_not_reused(supervisor, service):
    def close_after(conn, head, n):
        ok()(conn, head, n)
        return False  # then close the connection

    svc = service(close_after)
    pool = pool_for(supervisor())
    for _ in range(2):
        assert (await get(pool, svc.port))[1] == b"hello"
        await asyncio.sleep(0.1)  # its FIN arrives
    assert svc.connections == 2
    pool.close()


@pytest.mark.parametrize("method, repeated", [("GET", True), ("POST", False)])
async def test_a_reused_connection_that_dies_unanswered(supervisor, service, method, repeated):
    """The service reads the second request and closes without a word: a GET goes again on a fresh connection;
    a POST may have had its effect, so it is 502 instead."""

    def drop_second(conn, head, n):
        if n == 2:
            return False
        ok()(conn, head, n)

    svc = service(drop_second)
    pool = pool_for(supervisor())
    await get(pool, svc.port, method=method)
    if repeated:
        assert (await get(pool, svc.port, method=method))[1] == b"hello"
        assert svc.connections == 2 and len(svc.heads) == 3
    else:
        with pytest.raises(ProtocolError) as err:
            await get(pool, svc.port, method=method)
        assert err.value.code == "upstream_unavailable" and len(svc.heads) == 2
    pool.close()


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",  # then EOF
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",  # no last chunk
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # not a chunk size
    ],
)
async def test_an_answer_broken_midway_is_container_gone(supervisor, service, answer):
    def send_and_close(conn, head, n):
        conn.sendall(answer)
        return False

    svc = service(send_and_close)
    pool = pool_for(supervisor())
    response = await pool.request(svc.port, "GET", "/", {}, None, 5)
    assert response.status == 200
    with pytest.raises(ContainerGone):
        await response.read()
    pool.close()


@pytest.mark.parametrize(
    "answer, reused",
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA", False),  # bytes after the answer
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", False),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", True),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", True),
    ],
)
async def test_only_a_clean_keep_alive_answer_leaves_its_connection_for_the_next(supervisor, service, answer, reused):
    def send(conn, head, n):
        conn.sendall(answer if n == 1 else b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    svc = service(send)
    pool = pool_for(supervisor())
    assert (await get(pool, svc.port))[1] == b"ok"  # whole, whatever follows it
    assert (await get(pool, svc.port))[1] == b"ok"
    assert svc.connections == (1 if reused else 2)
    pool.close()


async def test_a_close_delimited_answer_ends_at_eof(supervisor, service):
    def http10(conn, head, n):
        conn.sendall(b"HTTP/1.0 200 OK\r\n\r\nuntil the end")
        return False

    svc = service(http10)
    pool = pool_for(supervisor())
    assert (await get(pool, svc.port))[1] == b"until the end"
    pool.close()


async def test_no_head_in_time_is_upstream_timeout_and_the_connection_closes(supervisor, service):
    svc = service(lambda conn, head, n: time.sleep(30))
    pool = pool_for(supervisor())
    started = time.monotonic()
    with pytest.raises(ProtocolError) as err:
        await pool.request(svc.port, "GET", "/", {}, None, 0.5)
    assert err.value.code == "upstream_timeout" and time.monotonic() - started < 3
    pool.close()


async def test_a_slow_upload_is_not_cut_by_the_head_timeout(supervisor, service):
    svc = service(ok(b"got it"))
    pool = pool_for(supervisor())

    async def slow():
        for _ in range(4):
            await asyncio.sleep(0.3)
            yield b"x"

    response, body = await get(pool, svc.port, method="POST", body=slow(), head_seconds=0.5)
    assert body == b"got it" and svc.bodies == [b"xxxx"]
    pool.close()


async def test_a_failing_client_body_is_the_clients_error_and_ends_the_connection(supervisor, service):
    svc = service(ok())
    pool = pool_for(supervisor())

    async def too_big():
        yield b"x"
        raise ProtocolError("payload_too_large")

    with pytest.raises(ProtocolError) as err:
        await pool.request(svc.port, "POST", "/", {}, too_big(), 5)
    assert err.value.code == "payload_too_large"
    assert await closed(svc, 5)
    pool.close()


async def test_an_early_answer_to_an_unread_upload_streams_and_the_connection_is_not_reused(supervisor, service):
    def refuse(conn, head, n):
        conn.sendall(b"HTTP/1.1 413 Too Large\r\nContent-Length: 2\r\n\r\nno")

    class Early(Service):
        def _body(self, conn, head, buffered):
            return b""  # never reads the upload

    svc = Early(refuse)
    pool = pool_for(supervisor())
    gate = asyncio.Event()

    async def endless():
        yield b"x" * 65536
        await gate.wait()
        yield b"never"

    response = await pool.request(svc.port, "POST", "/", {"content-length": "100000000"}, endless(), 5)
    assert (response.status, await response.read()) == (413, b"no")
    assert await closed(svc, 5)  # the half-sent request is not followed by another on that connection
    svc.close()
    pool.close()


async def test_nothing_listening_is_upstream_unavailable(supervisor):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ProtocolError) as err:
        await open_port_socket(supervisor().path, lambda: ME, port, 5)
    assert err.value.code == "upstream_unavailable"


async def test_a_stranger_on_the_supervisor_socket_is_refused(supervisor, service):
    svc = service(ok())
    sup = supervisor()
    # nobody; the right process under another uid; our uid, but not below the named sandbox process
    for stranger in (lambda: None, lambda: (ME[0] + 1, ME[1]), lambda: (ME[0], 4_000_000)):
        with pytest.raises(ContainerGone):
            await open_port_socket(sup.path, stranger, svc.port, 5)
    assert sup.requests == [] or all(b"port-sockets" in r for r in sup.requests)


def _listening() -> socket.socket:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    return listener


@pytest.mark.parametrize(
    "what",
    ["pipe", "unix socket", "udp socket", "listening socket", "other port", "two sockets", "no socket", "garbage"],
)
async def test_whatever_else_the_sandbox_hands_over_is_refused_and_closed(supervisor, service, what):
    svc = service(ok())
    keep = []

    def hand(conn, port):
        if what == "pipe":
            r, w = os.pipe()
            keep.extend((r, w))
            send_fds(conn, [r])
        elif what == "unix socket":
            a, b = socket.socketpair()
            keep.extend((a, b))
            send_fds(conn, [a.fileno()])
        elif what == "udp socket":
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            udp.connect(("127.0.0.1", port))
            keep.append(udp)
            send_fds(conn, [udp.fileno()])
        elif what == "listening socket":
            listener = _listening()
            keep.append(listener)
            send_fds(conn, [listener.fileno()])
        elif what == "other port":
            listener = _listening()
            other = socket.create_connection(listener.getsockname())
            keep.extend((listener, other))
            send_fds(conn, [other.fileno()])
        elif what == "two sockets":
            first, second = socket.create_connection(("127.0.0.1", port)), socket.create_connection(("127.0.0.1", port))
            keep.extend((first, second))
            send_fds(conn, [first.fileno(), second.fileno()])
        elif what == "no socket":
            conn.sendall(HANDED_OVER)
        else:
            conn.sendall(b"\x00\x01 not http at all\r\n\r\n")

    sup = supervisor(hand)
    before = open_fds()
    with pytest.raises((ProtocolError, ContainerGone)) as err:
        await open_port_socket(sup.path, lambda: ME, svc.port, 5)
    if isinstance(err.value, ProtocolError):
        assert err.value.code == "upstream_unavailable"
    for item in keep:
        os.close(item) if isinstance(item, int) else item.close()
    for _ in range(40):  # (the service's ends of the sandbox's own connections close as their threads see EOF)
        if open_fds() <= before:
            break
        await asyncio.sleep(0.05)
    assert open_fds() <= before  # nothing received is left open


async def test_idle_connections_expire(supervisor, service, monkeypatch):
    monkeypatch.setattr(upstream, "IDLE_SECONDS", 0.2)
    svc = service(ok())
    pool = pool_for(supervisor())
    await get(pool, svc.port)
    assert await closed(svc, 3)  # closed by the pool's timer, not by a next request
    await get(pool, svc.port)
    assert svc.connections == 2
    pool.close()


async def test_a_client_that_leaves_a_silent_stream_frees_the_upstream_at_once(supervisor, service):
    """Through the server's own sink: the reader's close interrupts the relay waiting on a silent body."""
    from standalone.streams import QueueSink

    def first_event_then_silence(conn, head, n):
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata:1\r\n")
        if conn.recv(1) == b"":  # silent, until the proxy lets go
            svc.closed.set()
        return False

    svc = service(first_event_then_silence)
    pool = pool_for(supervisor())
    response = await pool.request(svc.port, "GET", "/sse", {}, None, 5)
    sink = QueueSink()
    relay = asyncio.ensure_future(sink.pipe_from(response.body))
    assert await sink.readable.__anext__() == b"data:1"
    await asyncio.sleep(0.1)
    await sink.readable.aclose()  # the client left
    await asyncio.wait_for(relay, 2)
    assert await closed(svc, 3)
    pool.close()


class KeepsADuplicate:
    """A hostile supervisor: it hands the socket over, keeps a duplicate (so shares the open file description) and
    then makes it blocking and lingering, as if to freeze whoever uses or closes it."""

    def __init__(self, then_close: bool = False):
        self.then_close = then_close  # let go of the duplicate after meddling: the server's close is then the last
        self.kept: list[socket.socket] = []

    def __call__(self, conn, port):
        handed = socket.create_connection(("127.0.0.1", port))
        send_fds(conn, [handed.fileno()])
        self.kept.append(handed)

        def meddle():
            for _ in range(50):  # for a while, in case the server sets its flags after receiving
                handed.setblocking(True)
                handed.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 30))
                time.sleep(0.01)
            if self.then_close:
                self.kept.remove(handed)
                handed.close()

        threading.Thread(target=meddle, daemon=True).start()

    def close(self):
        for sock in self.kept:
            sock.close()


async def ticking(seconds: float) -> float:
    """The longest the event loop went without running this task, over `seconds`."""
    worst, last, end = 0.0, time.monotonic(), time.monotonic() + seconds
    while time.monotonic() < end:
        await asyncio.sleep(0.01)
        now = time.monotonic()
        worst, last = max(worst, now - last), now
    return worst


async def test_a_shared_descriptor_made_blocking_never_blocks_the_event_loop(supervisor, service):
    def slow(conn, head, n):  # by the time the server waits for the body, the sandbox has long meddled
        time.sleep(0.1)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n")
        time.sleep(0.5)
        conn.sendall(b"hello")

    svc = service(slow)
    hostile = KeepsADuplicate()
    pool = pool_for(supervisor(hostile))
    ticker = asyncio.ensure_future(ticking(1.0))
    await asyncio.sleep(0.05)
    response, body = await get(pool, svc.port)  # waits 0.5 s on a socket the sandbox made blocking
    assert body == b"hello"
    assert await ticker < 0.2
    pool.close()
    hostile.close()


async def test_closing_a_shared_descriptor_the_sandbox_made_linger_never_blocks_the_event_loop(supervisor):
    """The service never reads, so an upload stays unsent; the sandbox set SO_LINGER to 30 s on the shared
    socket and let go of its copy; no head comes in time and the connection is closed: close() then waits for the
    unsent bytes — in the closer thread, not in the event loop."""
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen()
    accepted = []
    threading.Thread(target=lambda: accepted.append(mute.accept()[0]), daemon=True).start()
    mute.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    hostile = KeepsADuplicate(then_close=True)
    pool = pool_for(supervisor(hostile))

    async def stuffing():
        while True:
            yield b"x" * 65536

    ticker = asyncio.ensure_future(ticking(2.0))
    started = time.monotonic()
    with pytest.raises(ProtocolError) as err:
        await pool.request(mute.getsockname()[1], "POST", "/", {}, stuffing(), 1.0)
    assert err.value.code == "upstream_timeout" and time.monotonic() - started < 3
    assert hostile.kept == []  # it had let go: ours was the last descriptor
    assert await ticker < 0.2
    pool.close()
    hostile.close()
    mute.close()
    for conn in accepted:
        conn.close()
