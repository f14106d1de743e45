"""HTTP/1.1 to a sandbox's supervisor on its unix socket: an asyncio protocol parsing with httptools (llhttp, in C),
connections kept alive.

Every exec, file and status call of a workspace is one request here, so this client is made for that path alone
(a general client cost the server about a third of its CPU per exec): a connection is opened, its peer checked
once (peer.py), kept after a complete exchange and reused. The supervisor runs inside the sandbox, so its answers
are hostile input: the head is bounded, every wait for a byte is bounded by a silence timeout, reading
pauses while the consumer is behind, and an answer that is malformed or breaks off is ContainerGone, its
connection never reused.

A kept connection the supervisor has closed, or is closing, costs a retry, not a failure: the request goes once
more on a fresh connection when that is harmless — its head never went out, or a GET got no answer on a reused
connection. A written POST is never sent twice. (The supervisor has no HEAD routes: HEAD is not supported.)
"""

import asyncio
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httptools

from durable.ports import ContainerGone
from standalone.peer import descends_from, peer_credentials

MAX_HEAD_BYTES = 64 * 1024  # the supervisor's response head
IDLE_SECONDS = 5.0  # a kept connection unused this long is closed instead of reused
MAX_IDLE = 4
_HIGH_WATER = 1024 * 1024  # bytes received and not yet consumed before reading pauses
# The kernel's default send buffer of a unix socket (~200 KiB): a bulk body (a file PUT) filled it every few hundred
# KiB, and each time the rest of a piece was copied into asyncio's buffer and out again. 4 MiB halved the server's
# CPU per 100 MiB PUT (148 → 74 ms). The kernel caps it at net.core.wmem_max.
SEND_BUFFER_BYTES = 4 * 1024 * 1024
_REPEATABLE = frozenset(("GET",))  # (the supervisor has no HEAD routes)
_UNANSWERED = "the sandbox closed the connection without answering"

Expected = Callable[[], tuple[int, int] | None]  # (host uid, bwrap pid) of the sandbox running now, or None


class Silent(Exception):
    """Nothing from the supervisor within the timeout (`connecting`: it did not accept the connection)."""

    def __init__(self, waited: float, connecting: bool = False):
        super().__init__(waited)
        self.waited = waited
        self.connecting = connecting


def silence_message(waited: float, connecting: bool = False) -> str:
    if connecting:
        return "the sandbox cannot be reached: its supervisor does not accept connections"
    return (
        f"the sandbox stopped answering: nothing from its supervisor for {waited:g} s (a healthy one sends a "
        "heartbeat every 10 s); the command's outcome is unknown — reattach by request id to see it"
    )


class _Stale(Exception):
    """A kept connection failed before the supervisor answered anything (`head_unsent`: nothing of the request
    reached it)."""

    def __init__(self, head_unsent: bool):
        super().__init__()
        self.head_unsent = head_unsent


class _Connection(asyncio.Protocol):
    """One socket to the supervisor. What arrives is parsed at once (httptools: llhttp, in C) into the answer's
    head and body chunks, which wait here for the one exchange using the connection."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.idle_since = 0.0
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future | None = None
        self._reading_paused = False
        self._writing_paused = False
        self.ended = False  # the supervisor closed its side (or the connection broke)
        self.failure: str | None = None  # why its answer cannot be used
        self._new_answer()

    def _new_answer(self) -> None:
        self.status = 0
        self.header_pairs: list[tuple[str, str]] = []
        self.head_bytes = 0  # bytes received before the head was complete
        self.head_done = False
        self.message_done = False
        self.keep_alive = False
        self.extra = False  # bytes came after the answer's end: never reused
        self.answers = 0
        self.chunks: deque[bytes] = deque()
        self._buffered = 0

    # -- asyncio.Protocol --------------------------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        # a bulk body (a file PUT) is written in large pieces: with asyncio's default 64 KiB high-water mark every
        # piece would wait for the supervisor to read it before the next one is produced
        transport.set_write_buffer_limits(high=_HIGH_WATER)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
            except OSError:
                pass  # refused: the default works, only slower

    def data_received(self, data: bytes) -> None:
        if self.failure is not None:
            return
        if not self.head_done:
            self.head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self._fail("the sandbox sent a malformed answer")
        else:
            if not self.head_done and self.head_bytes > MAX_HEAD_BYTES:
                self._fail("the sandbox sent a malformed answer: its head is too large")
            elif self._buffered > _HIGH_WATER and not self._reading_paused:
                self._reading_paused = True
                self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> None:
        self.ended = True
        self._wake()  # returning None: the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        self._wake()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._wake()

    # -- httptools callbacks -----------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.answers += 1
        if self.answers > 1:
            self.extra = True  # a second answer to one request: unsolicited

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_pairs.append((name.decode("latin-1").lower(), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        if self.answers > 1:
            return
        self.status = self._parser.get_status_code()
        self.keep_alive = self._parser.should_keep_alive()
        self.head_done = True
        if self.status < 200:  # never asked for (no Expect, no Upgrade on this path)
            self._fail("the sandbox sent a malformed answer: an informational status")

    def on_body(self, body: bytes) -> None:
        if self.answers == 1 and body:
            self.chunks.append(body)
            self._buffered += len(body)

    def on_message_complete(self) -> None:
        if self.answers == 1:
            self.message_done = True

    # -- used by the exchange ----------------------------------------------------------------------------------

    def _fail(self, why: str) -> None:
        self.failure = why
        self.transport.close()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    @property
    def reusable(self) -> bool:
        """Its answer was read whole, with nothing after it, and both sides keep the connection."""
        return (
            self.message_done
            and self.keep_alive
            and not self.extra
            and not self.ended
            and self.failure is None
            and not self.chunks
            and not self.transport.is_closing()
        )

    @property
    def closing(self) -> bool:
        return self.transport.is_closing()

    def next_request(self) -> None:
        """Ready for the next exchange (on a connection just opened, or found reusable)."""
        self._new_answer()

    async def wait(self, timeout: float) -> None:
        """Until something happens on the connection, at most `timeout` seconds (Silent)."""
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(timeout):
                await self._waiter
        except TimeoutError:
            raise Silent(timeout) from None
        finally:
            self._waiter = None

    def take_chunks(self) -> bytes:
        data = self.chunks.popleft() if len(self.chunks) == 1 else b"".join(self.chunks)
        self.chunks.clear()
        self._buffered = 0
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()
        return data

    async def drain(self, timeout: float) -> None:
        while self._writing_paused and not self.transport.is_closing():
            await self.wait(timeout)
        if self.transport.is_closing():
            raise ConnectionResetError("the supervisor closed the connection")

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class SupervisorConnections:
    """The server's connections to one sandbox's supervisor socket at `path`; `expected` names the only peer
    allowed to answer (None: any, for tests of the client itself)."""

    def __init__(self, path: str, expected: Expected | None, connect_seconds: float):
        self._path = path
        self._expected = expected
        self._connect_seconds = connect_seconds
        self._idle: list[_Connection] = []
        self._open: set[_Connection] = set()
        self._closed = False

    async def request(
        self,
        method: str,
        target: str,
        headers: dict[str, str] | None,
        body: Any,
        timeout: float,
    ) -> "Answer":
        """Send one request; the answer once its head is in. `timeout` bounds every wait for the supervisor.
        ContainerGone when it cannot be reached or does not answer properly."""
        request = _request(method, target, headers, body)
        kept = self._take()
        if kept is not None:
            try:
                return await self._attempt(kept, request, timeout)
            except _Stale as stale:
                if not (stale.head_unsent or method in _REPEATABLE):
                    raise ContainerGone(_UNANSWERED) from None
        try:
            return await self._attempt(await self._connect(), request, timeout)
        except _Stale:
            raise ContainerGone(_UNANSWERED) from None

    async def _attempt(self, conn: "_Connection", request: "_Request", timeout: float) -> "Answer":
        try:
            return await self._exchange(conn, request, timeout)
        except BaseException:
            self._retire(conn)
            raise

    def close(self) -> None:
        """Close every connection, in use or kept (the sandbox is stopping)."""
        self._closed = True
        for conn in list(self._open):
            conn.close()
        self._open.clear()
        self._idle.clear()

    # -- connections -----------------------------------------------------------------------------------------

    def _take(self) -> _Connection | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable and now - conn.idle_since < IDLE_SECONDS:
                return conn
            self._retire(conn)
        return None

    def _give_back(self, conn: _Connection) -> None:
        if self._closed or not conn.reusable or len(self._idle) >= MAX_IDLE:
            self._retire(conn)
            return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    def _retire(self, conn: _Connection) -> None:
        conn.close()
        self._open.discard(conn)

    async def _connect(self) -> _Connection:
        if self._closed:
            raise ContainerGone("the sandbox is not running")
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_seconds):
                transport, conn = await loop.create_unix_connection(_Connection, self._path)
        except TimeoutError:
            raise ContainerGone(silence_message(self._connect_seconds, connecting=True)) from None
        except OSError as exc:
            raise ContainerGone(f"the sandbox cannot be reached: {type(exc).__name__}") from None
        if self._expected is not None:
            try:
                pid, uid, _ = peer_credentials(transport.get_extra_info("socket"))
            except OSError as exc:
                transport.close()
                raise ContainerGone(f"the sandbox cannot be reached: {type(exc).__name__}") from None
            expected = self._expected()
            if expected is None or uid != expected[0] or not descends_from(pid, expected[1]):
                transport.close()
                raise ContainerGone(
                    f"the sandbox cannot be reached: its socket is answered by a stranger (pid {pid}, uid {uid})"
                )
        self._open.add(conn)
        return conn

    # -- one exchange ----------------------------------------------------------------------------------------

    async def _exchange(self, conn: _Connection, request: "_Request", timeout: float) -> "Answer":
        conn.next_request()
        body = request.body
        conn.transport.write(request.head + body if request.whole and body else request.head)
        if conn.closing:  # the write failed at once: nothing reached the supervisor
            raise _Stale(head_unsent=True)
        if not request.whole:
            await self._send_body(conn, body, timeout, request.chunked)
        try:
            while not conn.head_done and conn.failure is None:
                if conn.ended:
                    if conn.head_bytes == 0:
                        raise _Stale(head_unsent=False)
                    raise ContainerGone("the sandbox sent a malformed answer: it broke off")
                await conn.wait(timeout)
        except Silent as silent:
            raise ContainerGone(silence_message(silent.waited)) from None
        if not conn.head_done:
            raise ContainerGone(conn.failure)
        return Answer(self, conn, timeout)  # a body that went wrong already is reported while it is read

    @staticmethod
    async def _send_body(conn: _Connection, body: Any, timeout: float, chunked: bool) -> None:
        """A streamed request body (chunked unless its length was declared). If the supervisor stops reading it
        (it answered early, or it is gone), the rest is not sent and its answer, if any, is read all the same."""
        try:
            async for chunk in body:
                if chunk:
                    conn.transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk) if chunked else chunk)
                    await conn.drain(timeout)
            if chunked:
                conn.transport.write(b"0\r\n\r\n")
        except ConnectionError:
            return
        except Silent as silent:
            raise ContainerGone(silence_message(silent.waited)) from None


class Answer:
    """The supervisor's answer: status and headers, and the body as an iterator of chunks (ContainerGone if it
    breaks off or stalls). The connection goes back for reuse only after the whole body was read."""

    def __init__(self, pool: SupervisorConnections, conn: _Connection, timeout: float):
        self.status = conn.status
        self.header_pairs = conn.header_pairs
        self.timeout = timeout
        self._pool = pool
        self._conn: _Connection | None = conn

    async def chunks(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            return
        complete = False
        try:
            while True:
                if conn.chunks:
                    yield conn.take_chunks()
                elif conn.message_done:
                    complete = True
                    return
                elif conn.failure is not None or conn.ended:
                    raise ContainerGone("the sandbox stopped while answering: the answer broke off")
                else:
                    await conn.wait(self.timeout)
        except Silent as silent:
            raise ContainerGone(silence_message(silent.waited)) from None
        finally:
            self.release(complete)

    def release(self, complete: bool = False) -> None:
        """Done with the answer: a connection whose exchange completed is kept, any other closed."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if complete:
            self._pool._give_back(conn)
        else:
            self._pool._retire(conn)


@dataclass(frozen=True)
class _Request:
    head: bytes
    body: Any  # None, bytes, or an async iterator of bytes
    whole: bool  # the body (if any) goes with the head in one write
    chunked: bool  # a streamed body of no declared length


def _request(method: str, target: str, headers: dict[str, str] | None, body: Any) -> _Request:
    """The request, its head made here. Everything in it comes from the server's own code, never from the sandbox;
    a line break in it would still be refused (ValueError) rather than sent."""
    fields = {"host": "sandbox"}
    for name, value in (headers or {}).items():
        fields[name.lower()] = value
    whole = body is None or isinstance(body, bytes | bytearray | memoryview)
    if body is None:
        fields.pop("content-length", None)
        if method != "GET":
            fields["content-length"] = "0"
    elif whole:
        fields["content-length"] = str(len(body))
    elif "content-length" not in fields:  # a streamed body of a declared length goes as it is, else chunked
        fields["transfer-encoding"] = "chunked"
    lines = [f"{method} {target} HTTP/1.1", *(f"{name}: {value}" for name, value in fields.items())]
    if any("\r" in line or "\n" in line for line in lines):
        raise ValueError("a line break inside the request head")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return _Request(head, body, whole, chunked="transfer-encoding" in fields)
