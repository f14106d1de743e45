"""uvicorn's h11 protocol, with the documented answers for a request head that is too large or malformed, or a
client too slow.

A request head bigger than h11's buffer limit (serve.MAX_INCOMPLETE_EVENT) never reaches the ASGI app: h11 raises
"Receive buffer too long" (its status hint is 431) and stock uvicorn answers a plain-text 400 instead. Heads that fit
the buffer but exceed server.MAX_HEADER_BYTES are refused by the app itself, with the same answer. Any other request
h11 cannot parse (a header without a value where one is required, a bad request line) is 400 `malformed_request`.

Stock uvicorn also waits for ever for a head that trickles in (its keep-alive timer stops at the first byte) and for
a body that stops arriving. Here a head must be whole HEAD_SECONDS after the connection (or its previous response)
began, and a body may pause at most BODY_SECONDS while the server is reading it; otherwise the client gets
408 `request_timeout` (if nothing was answered yet) and the connection is closed. Environment variables
FLAREBOX_HEAD_TIMEOUT_SECONDS / FLAREBOX_BODY_TIMEOUT_SECONDS override them (the Worker runtime has Cloudflare's
edge in front, so these are not wrangler vars).
"""

import json
import os

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from protocol.errors import ProtocolError


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


def _error_bytes(code: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    err = ProtocolError(code)
    body = json.dumps(err.body(), separators=(",", ":")).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    return err.status, headers, body


class FlareboxH11Protocol(H11Protocol):
    _watchdog = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._waiting_since = self._last_byte = self.loop.time()
        self._watch()

    def data_received(self, data: bytes) -> None:
        self._last_byte = self.loop.time()
        super().data_received(data)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._waiting_since = self.loop.time()  # the next head's time starts now

    def connection_lost(self, exc) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
        super().connection_lost(exc)

    def _watch(self) -> None:
        """One timer per connection, re-armed for the next deadline (not per chunk received)."""
        self._watchdog = None
        if self.transport.is_closing():
            return
        now = self.loop.time()
        cycle = self.cycle
        if self.conn.their_state is h11.IDLE:
            due = self._waiting_since + HEAD_SECONDS
        elif self.conn.their_state is h11.SEND_BODY and cycle is not None and not cycle.response_complete:
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
        if self.conn.their_state is h11.IDLE:
            if self.conn.trailing_data[0]:  # part of a head came: h11 cannot answer a request it never saw
                status, headers, body = _error_bytes("request_timeout")
                head = b"".join(k + b": " + v + b"\r\n" for k, v in headers)
                self.transport.write(b"HTTP/1.1 %d Request Timeout\r\n%s\r\n%s" % (status, head, body))
        elif cycle is not None and not cycle.response_started:
            status, headers, body = _error_bytes("request_timeout")
            cycle.response_started = cycle.response_complete = cycle.disconnected = True  # the app's answer is moot
            response = h11.Response(status_code=status, headers=headers, reason=b"Request Timeout")
            for event in (response, h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
            cycle.message_event.set()  # the app's receive() now reports a disconnect
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """h11 refused the request (malformed HTTP, or a head over its buffer): answered in the protocol's own
        shape, never uvicorn's plain text — a client parses every error the same way."""
        buffered, _ = self.conn.trailing_data
        too_large = len(buffered) > self.config.h11_max_incomplete_event_size
        status, headers, body = _error_bytes("headers_too_large" if too_large else "malformed_request")
        for event in (h11.Response(status_code=status, headers=headers), h11.Data(data=body), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event))
        self.transport.close()
