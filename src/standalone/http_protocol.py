"""uvicorn's httptools protocol (llhttp, in C: the server's parser costs a fraction of h11's), with the documented
answers for a request head that is too large or malformed, or a client too slow.

An unfinished request head may grow to MAX_HEAD_BYTES; past that the client gets 431 `headers_too_large` and the
connection is closed (stock uvicorn buffers it without bound). Heads that arrive whole but exceed
server.MAX_HEADER_BYTES are refused by the app itself, with the same answer. Any request llhttp cannot parse (a
header without a value where one is required, a bad request line) is 400 `malformed_request`, in the protocol's JSON
shape instead of uvicorn's plain text.

Stock uvicorn also waits for ever for a head that trickles in (its keep-alive timer stops at the first byte) and for
a body that stops arriving. Here a head must be whole HEAD_SECONDS after the connection (or its previous response)
began, and a body may pause at most BODY_SECONDS while the server is reading it; otherwise the client gets
408 `request_timeout` (if nothing was answered yet) and the connection is closed. Environment variables
FLAREBOX_HEAD_TIMEOUT_SECONDS / FLAREBOX_BODY_TIMEOUT_SECONDS override them (the Worker runtime has Cloudflare's
edge in front, so these are not wrangler vars).
"""

import json
import os

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from protocol.errors import ProtocolError

MAX_HEAD_BYTES = 64 * 1024  # an unfinished request head may be this large
WRITE_BUFFER_BYTES = 1024 * 1024  # an answer's bytes buffered for a slow client before its sender waits
READ_AHEAD_BYTES = 1024 * 1024  # a request body's bytes received ahead of the app before reading pauses


def _seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "")
    try:
        value = float(raw) if raw else default
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None
    if not value > 0:
        raise ValueError(f"{name} must be > 0")
    return value


HEAD_SECONDS = _seconds("FLAREBOX_HEAD_TIMEOUT_SECONDS", 30.0)
BODY_SECONDS = _seconds("FLAREBOX_BODY_TIMEOUT_SECONDS", 60.0)

_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


def _error_answer(code: str) -> bytes:
    """A whole HTTP/1.1 answer carrying the protocol's error `code`, for a connection about to be closed."""
    err = ProtocolError(code)
    body = json.dumps(err.body(), separators=(",", ":")).encode()
    return b"HTTP/1.1 %d %b\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%b" % (
        err.status,
        _REASONS[err.status],
        len(body),
        body,
    )


class FlareboxHttpToolsProtocol(HttpToolsProtocol):
    _watchdog = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        # a bulk answer (a file GET) leaves in large pieces: asyncio's default 64 KiB high-water mark would stop
        # the relay after every piece until the client has read it
        transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)
        self._waiting_since = self._last_byte = self.loop.time()
        self._in_head = True  # between requests or inside a head: what comes next is (part of) a head
        self._head_bytes = 0  # bytes of the head being received
        self._watch()

    def data_received(self, data: bytes) -> None:
        self._last_byte = self.loop.time()
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
            self._refuse("headers_too_large")

    # parser callbacks: where a head ends and the next one begins

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        """uvicorn's, with a read-ahead of READ_AHEAD_BYTES instead of 64 KiB: a bulk body (a file PUT) then
        crosses in pieces of up to a megabyte, not thousands of 64 KiB ones, each paying a pause and resume of
        reading (two epoll_ctl calls), an ASGI message and a wake-up of the relay (PUT of 100 MiB: 13% less server
        CPU). The bound is per connection, like the write buffer's, and below what the kernel's own TCP receive
        buffer already holds for a client that sends before it is answered.

        A piece that finds nothing waiting is kept as it came: uvicorn's `receive()` hands the app `bytes(body)`,
        which for a bytes object is that object, so a body the app keeps up with crosses without a copy (uvicorn's
        own appends every piece to a bytearray and copies that again: two copies of every byte uploaded). Pieces
        that queue up behind a slow app are joined into a bytearray as before."""
        cycle = self.cycle
        if (self.parser.should_upgrade() and self._should_upgrade()) or cycle.response_complete:
            return
        if not cycle.body:
            cycle.body = body
        elif isinstance(cycle.body, bytes):
            cycle.body = bytearray(cycle.body)
            cycle.body += body
        else:
            cycle.body += body
        if len(cycle.body) > READ_AHEAD_BYTES:
            self.flow.pause_reading()
        cycle.message_event.set()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head, self._head_bytes = True, 0

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._waiting_since = self.loop.time()  # the next head's time starts now

    def handle_websocket_upgrade(self) -> None:
        self._stop_watching()  # the WebSocket protocol has timers of its own (pings)
        super().handle_websocket_upgrade()

    def connection_lost(self, exc) -> None:
        self._stop_watching()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """llhttp refused the request: answered in the protocol's own shape, never uvicorn's plain text — a client
        parses every error the same way."""
        self._refuse("malformed_request")

    # the deadlines

    def _refuse(self, code: str) -> None:
        self.transport.write(_error_answer(code))
        self.transport.close()

    def _stop_watching(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    def _watch(self) -> None:
        """One timer per connection, re-armed for the next deadline (not per chunk received)."""
        self._watchdog = None
        if self.transport.is_closing():
            return
        now = self.loop.time()
        cycle = self.cycle
        idle = cycle is None or cycle.response_complete
        if self._in_head and idle:
            due = self._waiting_since + HEAD_SECONDS
        elif not self._in_head and cycle is not None and cycle.more_body and not cycle.response_complete:
            if self.flow.read_paused or cycle.waiting_for_100_continue:
                self._last_byte = now  # the server is not reading: the client is not late
            due = self._last_byte + BODY_SECONDS
        else:
            due = now + min(HEAD_SECONDS, BODY_SECONDS)  # the app has the whole request; look again later
        if now >= due:
            self._time_out()
        else:
            self._watchdog = self.loop.call_later(due - now, self._watch)

    def _time_out(self) -> None:
        cycle = self.cycle
        if self._in_head:
            if self._head_bytes:  # part of a head came: answered although no request was ever seen whole
                self.transport.write(_error_answer("request_timeout"))
        elif cycle is not None and not cycle.response_started:
            cycle.response_started = cycle.response_complete = cycle.disconnected = True  # the app's answer is moot
            self.transport.write(_error_answer("request_timeout"))
            cycle.message_event.set()  # the app's receive() now reports a disconnect
        self.transport.close()
