"""The standalone port proxy's own HTTP/1.1 client: the server talks to a service inside the sandbox directly.

The sandbox's loopback lives in its own network namespace, which only the sandbox's processes reach. So the server
asks the supervisor (POST /port-sockets/{port}, on its peer-checked unix socket) to connect there and hand the
connected socket over (SCM_RIGHTS), then speaks HTTP/1.1 on it itself: no Python hop inside the sandbox, and the
connection is kept alive and reused by the next request to that port, as any reverse proxy does with its upstreams.

Everything from the sandbox is hostile:
- the handed-over descriptor is used only if it is exactly one, a connected TCP socket to 127.0.0.1:{port}
  (received close-on-exec; anything else is closed unread, and the request is 502 upstream_unavailable);
- the sandbox may keep a duplicate of it, and so share its open file description: it could clear O_NONBLOCK (a
  plain recv would then block the server's event loop) or set SO_LINGER (close would block). So every call on it
  passes MSG_DONTWAIT, its epoll registration is removed while it is still open, and it is closed off the event
  loop, by its pool's closer thread (one per sandbox: a close the sandbox holds up holds up only its own);
- the answer is parsed by h11 (a bounded head, strict framing); a body that breaks off or overruns is an error, and
  the client's connection is then dropped, never ended as if the body were whole (ContainerGone);
- a connection is reused only after a complete exchange: the whole request sent, the whole answer read to its
  declared end with not one byte more, keep-alive on both sides, and on reuse nothing waiting on it (an unsolicited
  byte or an EOF retires it). A request that fails on a reused connection before any answer byte is sent again on a
  fresh one only when that is harmless (GET, HEAD or OPTIONS without a body); otherwise it is 502.
Idle connections close after IDLE_SECONDS (below the usual keep-alive timeouts of servers), at most MAX_IDLE per port.
"""

import array
import asyncio
import json
import logging
import os
import queue
import socket
import stat
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import h11

from durable.ports import ContainerGone
from protocol import limits
from protocol.errors import ProtocolError
from protocol.proxy import HOP_BY_HOP
from standalone.peer import descends_from, peer_credentials

log = logging.getLogger("flarebox.upstream")

READ_BYTES = 1024 * 1024  # one read from the service: large, so a bulk body crosses the server in few chunks
MAX_HEAD_BYTES = 64 * 1024  # the service's response head (h11's buffer limit)
IDLE_SECONDS = 2.0
MAX_IDLE = 8
CONNECT_SECONDS = 10.0
CLOSER_IDLE_SECONDS = 5.0  # a closer thread with nothing to close for this long ends (the next close starts one)
_ANSWER_BYTES = 16 * 1024  # the supervisor's answer to a socket request
HANDED_OVER = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"  # (flarebox_supervisor.port_sockets)
_FD_BYTES = array.array("i").itemsize
_DONTWAIT = socket.MSG_DONTWAIT
# Host is set to the upstream's; Expect was answered by this server (uvicorn sends the 100 Continue itself)
_REQUEST_DROP = HOP_BY_HOP | {"host", "expect"}
_REPEATABLE = frozenset(("GET", "HEAD", "OPTIONS"))


class _Stale(Exception):
    """A reused connection failed before any byte of the answer: the service had closed it meanwhile."""


class _ClientFailed(Exception):
    """The client's request body failed (it left, or it went over the limit): its error, not the service's."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


# ---- closing what the sandbox handed over ---------------------------------------------------------------------------


class Closer:
    """Closes descriptors from the sandbox in a thread of its own: one with SO_LINGER set by the sandbox (which
    shares it) could block close() for as long as the sandbox likes, and the event loop serves every workspace."""

    def __init__(self) -> None:
        self._fds: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def close(self, fd: int) -> None:
        self._fds.put(fd)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="flarebox-upstream-closer", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                fd = self._fds.get(timeout=CLOSER_IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._fds.empty():
                        self._thread = None
                        return
                continue
            try:
                os.close(fd)
            except OSError:
                pass


class _Conn:
    """A handed-over socket: non-blocking calls whatever the sandbox does to the shared file description."""

    def __init__(self, sock: socket.socket, closer: Closer):
        self.sock = sock
        self.fd = sock.fileno()
        self.closer = closer
        self.loop = asyncio.get_running_loop()
        self.closed = False
        self._waits: dict[bool, asyncio.Future] = {}  # True: waiting to read, False: to write

    async def _wait(self, reading: bool) -> None:
        loop, fd = self.loop, self.fd
        waiter = loop.create_future()
        self._waits[reading] = waiter
        (loop.add_reader if reading else loop.add_writer)(fd, _set_once, waiter)
        try:
            await waiter
        finally:
            if not self.closed:  # (once closed the number may belong to another socket already)
                (loop.remove_reader if reading else loop.remove_writer)(fd)
                self._waits.pop(reading, None)

    async def recv(self, size: int) -> bytes:
        while True:
            try:
                return self.sock.recv(size, _DONTWAIT)
            except (BlockingIOError, InterruptedError):
                pass
            if self.closed:
                raise ConnectionAbortedError("the connection was closed")
            await self._wait(True)

    async def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[self.sock.send(view, _DONTWAIT) :]
                continue
            except (BlockingIOError, InterruptedError):
                pass
            if self.closed:
                raise ConnectionAbortedError("the connection was closed")
            await self._wait(False)

    def quiet(self) -> bool:
        """An idle kept-alive connection must have nothing to read: a byte is unsolicited, b"" the service's close."""
        try:
            self.sock.recv(1, socket.MSG_PEEK | _DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        return False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        # out of epoll while the descriptor is still ours: a registration outliving our descriptor (the sandbox
        # holds another) would keep reporting events for a number that is no longer this socket
        self.loop.remove_reader(self.fd)
        self.loop.remove_writer(self.fd)
        for waiter in self._waits.values():
            waiter.cancel()
        self._waits.clear()
        self.closer.close(self.sock.detach())


def _set_once(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


# ---- the hand-over ---------------------------------------------------------------------------------------------------


async def _recvmsg(sock: socket.socket, size: int, ancillary: int) -> tuple[bytes, list, int]:
    """recvmsg on the (server-owned) control socket; asyncio has no sock_recvmsg."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            data, ancdata, flags, _ = sock.recvmsg(size, ancillary, socket.MSG_CMSG_CLOEXEC)
            return data, ancdata, flags
        except (BlockingIOError, InterruptedError):
            pass
        ready = loop.create_future()
        loop.add_reader(sock.fileno(), _set_once, ready)
        try:
            await ready
        finally:
            loop.remove_reader(sock.fileno())


def _descriptors(ancdata: list) -> list[int]:
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received = array.array("i")
            received.frombytes(payload[: len(payload) - len(payload) % _FD_BYTES])
            fds.extend(received)
    return fds


def _tcp_socket_to(fd: int, port: int, closer: Closer) -> socket.socket:
    """The handed-over descriptor as a socket, if it is a connected TCP socket to 127.0.0.1:`port`; else it is
    closed and the request is 502."""
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise OSError("not a socket")
        sock = socket.socket(fileno=fd)  # reads the family, type and protocol from the descriptor
    except OSError:
        closer.close(fd)
        raise ProtocolError("upstream_unavailable", "the sandbox handed over something else than a socket") from None
    try:
        fits = (
            sock.family == socket.AF_INET
            and sock.type == socket.SOCK_STREAM
            and sock.proto == socket.IPPROTO_TCP
            and not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            and sock.getpeername() == ("127.0.0.1", port)
        )
        if fits:
            sock.setblocking(False)  # (and MSG_DONTWAIT on every call: the flag is shared with the sandbox)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:  # not connected, or gone already
        fits = False
    if not fits:
        closer.close(sock.detach())
        raise ProtocolError("upstream_unavailable", f"the sandbox handed over no TCP connection to port {port}")
    return sock


def _parse_answer(data: bytes) -> tuple[int, dict[str, str]]:
    """The supervisor's answer to a socket request: (status, headers); ContainerGone when it is not HTTP."""
    if data == HANDED_OVER:  # what the supervisor sends with the socket, byte for byte: no parser needed
        return 200, {}
    conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=_ANSWER_BYTES)
    conn.send(h11.Request(method="POST", target="/port-sockets", headers=[("host", "sandbox")]))
    conn.receive_data(data)
    conn.receive_data(b"")
    try:
        event = conn.next_event()
        while isinstance(event, h11.InformationalResponse):
            event = conn.next_event()
    except h11.RemoteProtocolError:
        event = None
    if not isinstance(event, h11.Response):
        raise ContainerGone("the sandbox's supervisor answered a socket request with no HTTP answer")
    return event.status_code, {k.decode("latin-1"): v.decode("latin-1") for k, v in event.headers}


async def open_port_socket(
    control_path: str,
    expected: Callable[[], tuple[int, int] | None],
    port: int,
    head_seconds: float,
    closer: Closer | None = None,
) -> socket.socket:
    """A new connection to `port` inside the sandbox, made by its supervisor and handed over.

    `expected()` names the sandbox running now, (host uid, bwrap pid), as for every supervisor connection: the
    control socket's peer must run as that uid and descend from that bwrap (peer.py). Descriptors that are not
    taken go to `closer`."""
    closer = closer or Closer()
    loop = asyncio.get_running_loop()
    control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fds: list[int] = []
    try:
        control.setblocking(False)
        try:
            async with asyncio.timeout(CONNECT_SECONDS):
                await loop.sock_connect(control, control_path)
            pid, uid, _ = peer_credentials(control)
        except (OSError, TimeoutError) as exc:
            raise ContainerGone(f"the sandbox cannot be reached: {type(exc).__name__}") from None
        peer = expected()
        if peer is None or uid != peer[0] or not descends_from(pid, peer[1]):
            raise ContainerGone(f"the supervisor socket is answered by a stranger (pid {pid}, uid {uid})")
        answer = bytearray()
        try:
            # the supervisor bounds its own connect by head_seconds
            async with asyncio.timeout(head_seconds + CONNECT_SECONDS):
                request = f"POST /port-sockets/{port} HTTP/1.1\r\nHost: sandbox\r\nContent-Length: 0\r\n"
                await loop.sock_sendall(control, (request + "Connection: close\r\n\r\n").encode())
                while True:
                    data, ancdata, flags = await _recvmsg(control, _ANSWER_BYTES, socket.CMSG_SPACE(_FD_BYTES))
                    fds += _descriptors(ancdata)
                    if flags & socket.MSG_CTRUNC:  # (the kernel dropped the ones that did not fit)
                        raise ContainerGone("the sandbox's supervisor handed over more than one descriptor")
                    if not data:
                        break
                    answer += data
                    if len(answer) > _ANSWER_BYTES:
                        raise ContainerGone("the sandbox's supervisor sent too long an answer to a socket request")
        except TimeoutError:
            raise ProtocolError("upstream_timeout", f"port {port} did not accept a connection in time") from None
        except OSError as exc:
            raise ContainerGone(f"the sandbox stopped while answering: {type(exc).__name__}") from None
        status, headers = _parse_answer(bytes(answer))
        code = headers.get("x-flarebox-proxy-error")
        if code is not None:  # nothing listens, or it did not accept in time
            raise ProtocolError("upstream_timeout" if code == "upstream_timeout" else "upstream_unavailable")
        if status != 200 or len(fds) != 1:
            raise ProtocolError("upstream_unavailable", f"the sandbox handed over no connection to port {port}")
        sock = _tcp_socket_to(fds.pop(), port, closer)
    finally:
        control.close()
        for fd in fds:  # whatever was not taken
            closer.close(fd)
    return sock


# ---- the pool and the exchanges -----------------------------------------------------------------------------------


def _keep_alive(event: h11.Request | h11.Response) -> bool:
    if b"close" in {t.strip().lower() for v in _values(event.headers, b"connection") for t in v.split(b",")}:
        return False
    return event.http_version >= b"1.1"


def _values(headers: Any, name: bytes) -> list[bytes]:
    return [value for key, value in headers if key == name]


class PortConnections:
    """The kept-alive connections to a sandbox's ports (one pool per running sandbox) and the requests on them.
    `opener(port, closer)` makes a new connection (open_port_socket, bound to the sandbox)."""

    def __init__(self, opener: Callable[[int, Closer], Awaitable[socket.socket]]):
        self._open = opener
        self.closer = Closer()
        self._idle: dict[int, deque[tuple[_Conn, float]]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self.closed = False

    # ---- the pool -------------------------------------------------------------------------------------------------
    def _take(self, port: int) -> _Conn | None:
        idle = self._idle.get(port)
        now = time.monotonic()
        while idle:
            conn, since = idle.pop()  # the most recently used first: the rest expire
            if now - since < IDLE_SECONDS and conn.quiet():
                return conn
            conn.close()
        return None

    def _give_back(self, port: int, conn: _Conn) -> None:
        if self.closed:
            conn.close()
            return
        idle = self._idle.setdefault(port, deque())
        idle.append((conn, time.monotonic()))
        while len(idle) > MAX_IDLE:
            idle.popleft()[0].close()
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(IDLE_SECONDS, self._expire)

    def _expire(self) -> None:
        self._timer = None
        now = time.monotonic()
        for idle in self._idle.values():
            while idle and now - idle[0][1] >= IDLE_SECONDS:
                idle.popleft()[0].close()
        if any(self._idle.values()) and not self.closed:
            self._timer = asyncio.get_running_loop().call_later(IDLE_SECONDS, self._expire)

    def close(self) -> None:
        """The sandbox is gone (or replaced): every idle connection closes; busy ones close when their request ends."""
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for idle in self._idle.values():
            while idle:
                idle.pop()[0].close()

    # ---- requests -------------------------------------------------------------------------------------------------
    async def request(
        self, port: int, method: str, target: str, headers: dict[str, str], body: Any, head_seconds: float
    ) -> "PortResponse":
        """One request; returns at the response head (the body streams from the answer). ProtocolError
        upstream_unavailable / upstream_timeout as the relay answered them; the client's own body error as is."""
        conn = self._take(port)
        if conn is not None:
            try:
                return await _Exchange(self, port, conn, True).start(method, target, headers, body, head_seconds)
            except _Stale:
                pass  # sent once more on a fresh connection: _Stale is raised only where that is harmless
        conn = _Conn(await self._open(port, self.closer), self.closer)
        try:
            return await _Exchange(self, port, conn, False).start(method, target, headers, body, head_seconds)
        except _Stale:  # (not raised for a fresh connection)
            raise ProtocolError("upstream_unavailable") from None


class _Exchange:
    """One request and its answer on one connection."""

    def __init__(self, pool: PortConnections, port: int, conn: _Conn, reused: bool):
        self.pool = pool
        self.port = port
        self.conn = conn
        self.reused = reused
        self.loop = conn.loop
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.sender: asyncio.Task | None = None
        self.receiving: asyncio.Future | None = None  # a read of the head under way while the body is sent
        self.last_sent = self.loop.time()  # the head timeout counts from the last request byte sent
        self.received = False  # any byte of the answer
        self.repeatable = False
        self.done = False  # the connection was given back or closed

    # ---- sending --------------------------------------------------------------------------------------------------
    async def start(
        self, method: str, target: str, headers: dict[str, str], body: Any, head_seconds: float
    ) -> "PortResponse":
        try:
            pairs = [(b"host", f"127.0.0.1:{self.port}".encode())]
            pairs += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items() if k not in _REQUEST_DROP]
            if body is not None and "content-length" not in headers:
                pairs.append((b"transfer-encoding", b"chunked"))
            try:
                head = self.h11.send(
                    h11.Request(method=method.encode("latin-1"), target=target.encode(), headers=pairs)
                )
            except (h11.LocalProtocolError, UnicodeEncodeError):
                raise ProtocolError("invalid_field", "the request cannot be forwarded as HTTP/1.1") from None
            self.repeatable = self.reused and body is None and method in _REPEATABLE
            if body is None:
                head += self.h11.send(h11.EndOfMessage())
            try:
                await self.conn.sendall(head)
            except OSError as exc:
                self._broken_before_answer(exc)
            self.last_sent = self.loop.time()
            if body is not None:
                self.sender = asyncio.ensure_future(self._send_body(body))
            event = await self._head(head_seconds)
            return PortResponse(self, event, method)
        except BaseException:
            self.close()
            raise

    async def _send_body(self, body: Any) -> None:
        h11_conn, conn, loop = self.h11, self.conn, self.loop
        try:
            async for chunk in body:
                if not chunk:
                    continue
                for piece in h11_conn.send_with_data_passthrough(h11.Data(data=chunk)):
                    await conn.sendall(piece)
                self.last_sent = loop.time()
            await conn.sendall(h11_conn.send(h11.EndOfMessage()))
            self.last_sent = loop.time()
        except (OSError, h11.LocalProtocolError):
            raise  # the service stopped reading (or the body broke its own Content-Length): not the client's doing
        except Exception as exc:  # the client left mid-upload, or its body went over the limit
            raise _ClientFailed(exc) from exc

    # ---- the answer's head ----------------------------------------------------------------------------------------
    def _broken_before_answer(self, exc: BaseException | None) -> None:
        if self.repeatable and not self.received:
            raise _Stale
        what = type(exc).__name__ if exc is not None else "it closed the connection"
        raise ProtocolError("upstream_unavailable", f"port {self.port} answered nothing: {what}")

    def _timed_out(self, head_seconds: float) -> ProtocolError:
        return ProtocolError("upstream_timeout", f"port {self.port} sent no response head in {head_seconds:g} s")

    async def _receive_for_head(self, head_seconds: float) -> bytes:
        """The next bytes of the answer's head, waiting at most `head_seconds` after the last request byte sent;
        a client body that fails meanwhile is that failure."""
        while True:
            if self.sender is not None and self.sender.done():
                # the body is sent, or the service stopped reading it (it may answer yet; the connection then
                # closes after the answer: h11 never saw the request end)
                sender, self.sender = self.sender, None
                exc = sender.exception()
                if isinstance(exc, _ClientFailed):
                    raise exc.error
            remaining = self.last_sent + head_seconds - self.loop.time()
            if remaining <= 0:
                raise self._timed_out(head_seconds)
            # one read at a time, kept across turns of this loop: a read cancelled just as it completed would lose
            # the bytes it took off the socket
            if self.receiving is None:
                self.receiving = asyncio.ensure_future(self.conn.recv(READ_BYTES))
            receiving = self.receiving
            waiting = {receiving} if self.sender is None else {receiving, self.sender}
            await asyncio.wait(waiting, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            if receiving.done():
                self.receiving = None
                return receiving.result()  # (raises OSError for a reset connection)

    async def _receive_simple(self, head_seconds: float) -> bytes:
        remaining = self.last_sent + head_seconds - self.loop.time()
        try:
            async with asyncio.timeout(max(remaining, 0)):
                return await self.conn.recv(READ_BYTES)
        except TimeoutError:
            raise self._timed_out(head_seconds) from None

    async def _head(self, head_seconds: float) -> h11.Response:
        h11_conn = self.h11
        while True:
            try:
                event = h11_conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise ProtocolError(
                    "upstream_unavailable", f"port {self.port} answered no valid HTTP/1.1: {exc}"
                ) from None
            if event is h11.NEED_DATA:
                try:
                    if self.sender is None and self.receiving is None:  # nothing else to watch: one plain wait
                        data = await self._receive_simple(head_seconds)
                    else:
                        data = await self._receive_for_head(head_seconds)
                except OSError as exc:
                    self._broken_before_answer(exc)
                if data:
                    self.received = True
                elif not self.received:
                    self._broken_before_answer(None)
                h11_conn.receive_data(data)
            elif isinstance(event, h11.InformationalResponse):
                continue  # 100 Continue, 103 Early Hints: not passed on
            elif isinstance(event, h11.Response):
                return event
            else:  # ConnectionClosed before a head
                self._broken_before_answer(None)

    # ---- the end --------------------------------------------------------------------------------------------------
    def finish(self, reusable: bool) -> None:
        """The answer ended (whole when `reusable`): the connection goes back to the pool or closes."""
        if self.done:
            return
        sender, self.sender = self.sender, None
        if sender is not None:
            if not sender.done():
                sender.cancel()  # the service answered without reading the whole body: the request is not complete
                reusable = False
            elif sender.exception() is not None:
                reusable = False
        if reusable and self.h11.our_state is h11.DONE and self.receiving is None:
            self.done = True
            self.pool._give_back(self.port, self.conn)
        else:
            self.close()

    def close(self) -> None:
        if self.receiving is not None:
            self.receiving.cancel()
            self.receiving = None
        if self.sender is not None:
            if not self.sender.done():
                self.sender.cancel()
            else:
                self.sender.exception()  # retrieved: no "exception never retrieved" warning
            self.sender = None
        if not self.done:
            self.done = True
            self.conn.close()

    def sender_failure(self) -> BaseException | None:
        """The client's body failure, once the head came (the answer is then cut)."""
        sender = self.sender
        if sender is not None and sender.done():
            exc = sender.exception()
            if isinstance(exc, _ClientFailed):
                return exc.error
        return None


class _Body:
    """An answer's body: an async iterator of bytes that the server's sink may interrupt when the client leaves
    (streams.QueueSink.pipe_from): a silent stream then frees its upstream connection at once."""

    interruptible = True

    def __init__(self, chunks: AsyncIterator[bytes]):
        self._chunks = chunks

    def __aiter__(self) -> "_Body":
        return self

    def __anext__(self) -> Any:
        return self._chunks.__anext__()

    async def aclose(self) -> None:
        await self._chunks.aclose()


class PortResponse:
    """The service's answer (ports.ContainerResponse): status and headers now, the body streamed from the socket.
    The body raises ContainerGone when the answer breaks off or is malformed midway."""

    def __init__(self, exchange: _Exchange, event: h11.Response, method: str):
        self._exchange = exchange
        self.status = event.status_code
        self.header_pairs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in event.headers]
        self.headers = dict(self.header_pairs)
        self._keep_alive = _keep_alive(event)
        length = None
        if method != "HEAD" and self.status not in (204, 304) and not _values(event.headers, b"transfer-encoding"):
            lengths = _values(event.headers, b"content-length")
            if lengths:
                length = int(lengths[0])  # h11 checked that it is one valid number
        self.body = _Body(self._counted(length) if length is not None else self._framed())

    async def _counted(self, length: int) -> AsyncIterator[bytes]:
        """A Content-Length body, read straight from the socket (h11 would copy every byte twice)."""
        exchange = self._exchange
        whole = False
        try:
            pending, _ = exchange.h11.trailing_data  # what came with the head
            overrun = len(pending) > length  # bytes after the answer: it is whole, the connection is not reused
            pending = pending[:length]
            remaining = length - len(pending)
            if pending:
                yield pending
            conn = exchange.conn
            while remaining > 0:
                self._check_client(exchange)
                try:
                    data = await conn.recv(min(READ_BYTES, remaining))
                except OSError as exc:
                    raise ContainerGone(f"port {exchange.port} broke off its answer: {type(exc).__name__}") from None
                if not data:
                    raise ContainerGone(f"port {exchange.port} closed its answer {remaining} bytes short")
                remaining -= len(data)
                yield data
            whole = not overrun
        finally:
            exchange.finish(whole and self._keep_alive)

    async def _framed(self) -> AsyncIterator[bytes]:
        """Chunked, close-delimited or empty bodies, through h11."""
        exchange = self._exchange
        h11_conn, conn = exchange.h11, exchange.conn
        whole = False
        try:
            while True:
                try:
                    event = h11_conn.next_event()
                except h11.RemoteProtocolError as exc:
                    raise ContainerGone(f"port {exchange.port} broke off its answer: {exc}") from None
                if event is h11.NEED_DATA:
                    self._check_client(exchange)
                    try:
                        data = await conn.recv(READ_BYTES)
                    except OSError as exc:
                        raise ContainerGone(
                            f"port {exchange.port} broke off its answer: {type(exc).__name__}"
                        ) from None
                    h11_conn.receive_data(data)
                elif isinstance(event, h11.Data):
                    if event.data:
                        yield bytes(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    whole = True
                    break
                else:  # ConnectionClosed: h11 raised above for a body cut short; nothing else ends it
                    raise ContainerGone(f"port {exchange.port} closed its answer midway")
        finally:
            exchange.finish(
                whole and h11_conn.their_state is h11.DONE and not h11_conn.trailing_data[0] and self._keep_alive
            )

    @staticmethod
    def _check_client(exchange: _Exchange) -> None:
        failure = exchange.sender_failure()
        if failure is not None:
            raise ContainerGone(f"the client's request body failed: {type(failure).__name__}")

    async def read(self, limit: int = limits.CONTROL_BODY_BYTES) -> bytes:
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in self.body:
                size += len(chunk)
                if size > limit:
                    raise ContainerGone(f"port answer over {limit} bytes")
                chunks.append(chunk)
        finally:
            await self.aclose()
        return b"".join(chunks)

    async def json(self) -> Any:
        return json.loads(await self.read())

    async def aclose(self) -> None:
        await self.body.aclose()
        self._exchange.close()  # a no-op after the body's end gave the connection back
