"""The supervisor's HTTP/1.1 server: httptools (llhttp, in C) parses, a table routes, handlers answer.

Written here instead of served by aiohttp because every sandbox pays for its server at start and while idle:
importing aiohttp.web took 0.18–0.27 s and ~17 MiB more than asyncio + httptools, and its request handling was
0.4–0.5 ms of each exec's round trip. The supervisor has one kind of client (the standalone server or the Durable
Object), so this is HTTP/1.1 for that: requests answered one at a time per connection, in order, connections kept
alive; bodies with Content-Length or chunked, streamed to the handler with reading paused while it is behind;
answers with Content-Length, or chunked when streamed. No HEAD (a GET here can be an export or a stream). A
WebSocket (websocket.py) takes the connection over after its handshake.

Every answer a caller's mistake causes is a protocol error (error_body); a failure of a handler after its answer
began breaks the connection, so a client never takes a short answer for a whole one.
"""

import asyncio
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl, unquote

import httptools

from protocol.errors import ERRORS, ProtocolError, error_body
from protocol.limits import MAX_BODY_BYTES

log = logging.getLogger("flarebox_supervisor")

MAX_HEAD_BYTES = 64 * 1024  # request line and headers
READ_AHEAD_BYTES = 1024 * 1024  # body received and not yet taken by the handler before reading pauses
KEEP_ALIVE_SECONDS = 75.0  # an idle kept connection is closed after this long (the client reconnects)
SHUTDOWN_SECONDS = 5.0  # at shutdown, for answers under way to finish
_WRITE_HIGH_WATER = 1024 * 1024
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# the answers this server gives (http.HTTPStatus would cost every start milliseconds of enum building); another
# status goes out with an empty reason phrase, which HTTP/1.1 allows
_REASONS = {
    200: b"OK",
    201: b"Created",
    204: b"No Content",
    400: b"Bad Request",
    401: b"Unauthorized",
    403: b"Forbidden",
    404: b"Not Found",
    405: b"Method Not Allowed",
    408: b"Request Timeout",
    409: b"Conflict",
    411: b"Length Required",
    413: b"Content Too Large",
    415: b"Unsupported Media Type",
    426: b"Upgrade Required",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
    504: b"Gateway Timeout",
    507: b"Insufficient Storage",
}

Handler = Callable[["Request"], Awaitable["Response | StreamResponse"]]


class Query(dict):
    """A request's query parameters, each its first value; `repeated` names those given more than once."""

    def __init__(self, raw: bytes):
        super().__init__()
        self.repeated: set[str] = set()
        try:
            pairs = parse_qsl(raw.decode("utf-8"), keep_blank_values=True, errors="strict")
        except UnicodeDecodeError:
            raise ProtocolError("invalid_query", "the query is not UTF-8") from None
        for key, value in pairs:
            if key in self:
                self.repeated.add(key)
            else:
                self[key] = value


class Application(dict):
    """What handlers share (request.app[...]), the routes, and what runs at shutdown."""

    def __init__(self) -> None:
        super().__init__()
        self._static: dict[str, dict[str, Handler]] = {}
        self._patterns: list[tuple[tuple[str, ...], dict[str, Handler]]] = []
        self.on_shutdown: list[Callable[[Application], Awaitable[None]]] = []

    def add_route(self, method: str, path: str, handler: Handler) -> None:
        """`path` is literal, or has whole {name} segments, which match one non-empty segment each."""
        if "{" not in path:
            self._static.setdefault(path, {})[method] = handler
            return
        segments = tuple(path.split("/"))
        for known, methods in self._patterns:
            if known == segments:
                methods[method] = handler
                return
        self._patterns.append((segments, {method: handler}))

    def resolve(self, method: str, raw_path: bytes) -> tuple[Handler, dict[str, str]]:
        try:
            segments = [unquote(part, errors="strict") for part in raw_path.decode("ascii").split("/")]
        except UnicodeError:
            raise ProtocolError("not_found") from None
        if any("/" in segment for segment in segments):  # an encoded slash is part of a segment, never a separator
            raise ProtocolError("not_found")
        methods, match = self._static.get("/".join(segments)), {}
        if methods is None:
            methods, match = self._match(segments)
        if methods is None:
            raise ProtocolError("not_found")
        handler = methods.get(method)
        if handler is None:
            raise ProtocolError("method_not_allowed")
        return handler, match

    def _match(self, segments: list[str]) -> tuple[dict[str, Handler] | None, dict[str, str]]:
        for pattern, methods in self._patterns:
            if len(pattern) != len(segments):
                continue
            match = {}
            for want, got in zip(pattern, segments, strict=True):
                if want.startswith("{"):
                    if not got:
                        break
                    match[want[1:-1]] = got
                elif want != got:
                    break
            else:
                return methods, match
        return None, {}


class Request:
    """One request: its head, parsed, and its body, read as it arrives."""

    def __init__(self, connection: "_Connection", method: str, url: bytes, headers: dict[str, str]):
        self.app: Application = connection.app
        self.method = method
        try:
            parsed = httptools.parse_url(url)
            self.raw_path: bytes = parsed.path or b""
            self._raw_query: bytes = parsed.query or b""
        except httptools.HttpParserInvalidURLError:
            self.raw_path, self._raw_query = b"", b""  # routes nowhere: not_found
        self.headers = headers  # names in lower case; a repeated header's values joined by ", "
        self.match_info: dict[str, str] = {}
        self.connection = connection
        self.body_done = False
        self.keep_alive = True
        self.upgrade = False  # the head asked to switch protocols (the rest of the connection is not HTTP)
        self._discarded = False
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._body_waiter: asyncio.Future | None = None
        self._asked_continue = headers.get("expect", "").lower() == "100-continue"
        self._query: Query | None = None

    @property
    def transport(self) -> asyncio.Transport | None:
        return self.connection.transport

    @property
    def query(self) -> Query:
        if self._query is None:
            self._query = Query(self._raw_query)
        return self._query

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";", 1)[0].strip().lower()

    @property
    def content_length(self) -> int | None:
        value = self.headers.get("content-length")
        return int(value) if value is not None and value.isascii() and value.isdigit() else None

    async def readany(self) -> bytes:
        """The next piece of the body as it arrived; b"" at its end. Raises ConnectionResetError when the client
        goes away before the end."""
        if self._asked_continue:
            self._asked_continue = False
            self.connection.write(_CONTINUE)
        while not self._chunks:
            if self.body_done:
                return b""
            if self.connection.lost:
                raise ConnectionResetError("the client went away mid-body")
            self._body_waiter = asyncio.get_running_loop().create_future()
            await self._body_waiter
        chunk = self._chunks.popleft()
        self._buffered -= len(chunk)
        self.connection.body_taken()
        return chunk

    async def read(self, max_bytes: int = MAX_BODY_BYTES) -> bytes:
        """The whole body; payload_too_large past `max_bytes`."""
        parts, size = [], 0
        while chunk := await self.readany():
            size += len(chunk)
            if size > max_bytes:
                raise ProtocolError("payload_too_large", f"the body is larger than {max_bytes} bytes")
            parts.append(chunk)
        return b"".join(parts)

    # -- fed by the connection ----------------------------------------------------------------------------------

    def _received(self, chunk: bytes) -> None:
        if self._discarded:
            return
        self._chunks.append(chunk)
        self._buffered += len(chunk)
        self._wake()

    def _ended(self) -> None:
        self.body_done = True
        self._wake()

    def _wake(self) -> None:
        if self._body_waiter is not None and not self._body_waiter.done():
            self._body_waiter.set_result(None)

    def _discard(self) -> None:
        """The handler is done: what is left of the body is dropped, as it arrives."""
        self._discarded = True
        self._chunks.clear()
        self._buffered = 0


def _head(status: int, headers: dict[str, str], framing: bytes, close: bool) -> bytes:
    lines = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b""))]
    lines += [f"{name}: {value}\r\n".encode("latin-1") for name, value in headers.items()]
    lines.append(framing)
    if close:
        lines.append(b"Connection: close\r\n")
    lines.append(b"\r\n")
    return b"".join(lines)


class Response:
    """A whole answer, sent in one write."""

    def __init__(
        self, body: bytes = b"", status: int = 200, headers: dict[str, str] | None = None, content_type: str = ""
    ):
        self.body = body
        self.status = status
        self.headers = dict(headers or {})
        if content_type:
            self.headers["Content-Type"] = content_type

    def encode(self, close: bool) -> bytes:
        return _head(self.status, self.headers, b"Content-Length: %d\r\n" % len(self.body), close) + self.body


def json_response(data, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    body = json.dumps(data).encode()
    return Response(body, status, {"Content-Type": "application/json; charset=utf-8", **(headers or {})})


def error_response(code: str, message: str | None = None, headers: dict[str, str] | None = None) -> Response:
    return json_response(error_body(code, message), ERRORS[code][0], headers)


class StreamResponse:
    """An answer written as it is made: with `content_length`, exactly that many bytes; else chunked, its end
    written by write_eof (without it the connection breaks: a cut answer is never a whole one)."""

    def __init__(self, headers: dict[str, str] | None = None, status: int = 200, content_length: int | None = None):
        self.status = status
        self.headers = dict(headers or {})
        self.content_length = content_length
        self.finished = False
        self._connection: _Connection | None = None

    async def prepare(self, request: Request) -> None:
        """Send the head now."""
        self._connection = request.connection
        self._connection.answer_started = True
        if self.content_length is None:
            framing = b"Transfer-Encoding: chunked\r\n"
        else:
            framing = b"Content-Length: %d\r\n" % self.content_length
        self._connection.write(_head(self.status, self.headers, framing, not request.connection.keep_alive))
        await self._connection.drain()

    async def write(self, data: bytes) -> None:
        if not data:
            return
        if self.content_length is None:
            data = b"%x\r\n%b\r\n" % (len(data), data)
        self._connection.write(data)
        await self._connection.drain()

    async def write_eof(self, data: bytes = b"") -> None:
        """`data` and the end of the answer, in one write."""
        if self.finished:
            return
        if self.content_length is None:
            data = (b"%x\r\n%b\r\n0\r\n\r\n" % (len(data), data)) if data else b"0\r\n\r\n"
        self.finished = True
        if data:
            self._connection.write(data)
        await self._connection.drain()


class _Connection(asyncio.Protocol):
    """One client connection: bytes in to the parser, requests out to their handlers one at a time, in order."""

    def __init__(self, server: "Server"):
        self.server = server
        self.app = server.app
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.keep_alive = True  # of the request being answered
        self.answer_started = False  # its head is out: an error can no longer be an answer of its own
        self.upgraded = None  # the WebSocket (websocket.py) that took the connection over
        self.upgrade_tail = b""  # bytes after an upgrade request's head, for the WebSocket
        self._parser = httptools.HttpRequestParser(self)
        self._requests: deque[Request] = deque()
        self._current: Request | None = None  # being parsed
        self._answering: Request | None = None
        self._head_too_large = False
        self._head_bytes = 0
        self._url = b""
        self._headers: dict[str, str] = {}
        self.worker: asyncio.Task | None = None
        self._reading_paused = False
        self._drain_waiter: asyncio.Future | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._idle_since: float | None = None  # when the connection last fell idle; None while a request is on it

    # -- asyncio.Protocol --------------------------------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=_WRITE_HIGH_WATER)
        self.server.connections.add(self)
        self._start_idle()

    def data_received(self, data: bytes) -> None:
        if self.upgraded is not None:
            self.upgraded.data_received(data)
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            offset = exc.args[0] if exc.args and isinstance(exc.args[0], int) else len(data)
            self.upgrade_tail = data[offset:]
            self.transport.pause_reading()  # until a WebSocket takes over (or the answer refuses it)
        except httptools.HttpParserCallbackError:
            if not self._head_too_large:
                log.exception("request parsing failed")
            self._refuse("headers_too_large" if self._head_too_large else "internal_error")
        except httptools.HttpParserError:
            self._refuse("malformed_request", "the request is not valid HTTP/1.1")
        else:
            self._maybe_pause()

    def eof_received(self) -> bool:
        return False  # the transport closes; a handler still running finds the connection lost

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.server.connections.discard(self)
        self._cancel_idle()
        if self.upgraded is not None:
            self.upgraded.connection_lost()
        self.resume_writing()  # a writer waiting to drain wakes up to find the connection lost
        for request in (self._current, self._answering, *self._requests):
            if request is not None:
                request._wake()

    def pause_writing(self) -> None:
        if self._drain_waiter is None or self._drain_waiter.done():
            self._drain_waiter = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drain_waiter is not None and not self._drain_waiter.done():
            self._drain_waiter.set_result(None)

    # -- httptools callbacks -----------------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self._idle_since = None  # busy: the idle timer, if it fires now, looks again later
        self._url, self._headers, self._head_bytes = b"", {}, 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self._headers[key] = f"{self._headers[key]}, {text}" if key in self._headers else text

    def on_headers_complete(self) -> None:
        method = self._parser.get_method().decode("ascii", "replace")
        request = Request(self, method, self._url, self._headers)
        request.keep_alive = self._parser.should_keep_alive()
        request.upgrade = self._parser.should_upgrade()
        self._current = request
        self._requests.append(request)
        if self.worker is None or self.worker.done():
            self.worker = asyncio.get_running_loop().create_task(self._work())

    def on_body(self, body: bytes) -> None:
        if self._current is not None:
            self._current._received(body)

    def on_message_complete(self) -> None:
        if self._current is not None:
            self._current._ended()
            self._current = None

    # -- writing -----------------------------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.lost or self.transport.is_closing():
            raise ConnectionResetError("cannot write to a closed connection")
        self.transport.write(data)

    async def drain(self) -> None:
        if self._drain_waiter is not None and not self._drain_waiter.done():
            await self._drain_waiter
        if self.lost:
            raise ConnectionResetError("the client went away")

    def body_taken(self) -> None:
        if self._reading_paused and self._buffered() <= READ_AHEAD_BYTES and not self.lost:
            self._reading_paused = False
            self.transport.resume_reading()

    # -- requests ----------------------------------------------------------------------------------------------

    async def _work(self) -> None:
        while self._requests and not self.lost:
            request = self._requests.popleft()
            self._answering = request
            try:
                keep = await self._answer(request)
            finally:
                self._answering = None
                request._discard()
                self.body_taken()
            if not keep:
                if not self.lost:
                    self.transport.close()
                return
        self._start_idle()

    async def _answer(self, request: Request) -> bool:
        """Run the request's handler and send its answer; whether the connection can carry another request."""
        self.keep_alive = request.keep_alive and not request.upgrade
        self.answer_started = False
        response: Response | StreamResponse
        try:
            handler, request.match_info = self.app.resolve(request.method, request.raw_path)
            response = await handler(request)
        except ProtocolError as exc:
            response = error_response(exc.code, exc.message)
        except (ConnectionError, OSError) as exc:
            if self.lost or self.transport.is_closing():
                return False  # the client went away mid-answer; nothing left to say
            log.exception("request failed: %s", exc)
            response = error_response("internal_error")
        except Exception:
            log.exception("request failed")
            response = error_response("internal_error")
        if self.upgraded is not None or self.lost:
            return False  # a WebSocket had the connection; it is over now
        if self.answer_started:  # a stream: whole only if it was ended (a failure midway breaks the connection)
            return isinstance(response, StreamResponse) and response.finished and self.keep_alive
        if isinstance(response, StreamResponse):  # returned without sending anything: an empty answer
            response = Response(status=response.status, headers=response.headers)
        try:
            self.write(response.encode(close=not self.keep_alive))
        except ConnectionResetError:
            return False
        return self.keep_alive

    # -- flow control and the rest -------------------------------------------------------------------------------

    def _buffered(self) -> int:
        total = sum(request._buffered for request in self._requests)
        if self._answering is not None:
            total += self._answering._buffered
        return total

    def _maybe_pause(self) -> None:
        if not self._reading_paused and self._buffered() > READ_AHEAD_BYTES:
            self._reading_paused = True
            self.transport.pause_reading()

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            self._head_too_large = True
            raise ValueError("the request head is too large")  # httptools raises HttpParserCallbackError

    def _refuse(self, code: str, message: str | None = None) -> None:
        """A request that cannot be parsed: answered (when nothing else is being answered) and the connection
        closed, since where the next request would start is unknown."""
        self._requests.clear()
        if self._answering is None and not self.lost:
            self.transport.write(error_response(code, message).encode(close=True))
            self.transport.close()
        elif not self.lost:
            self.transport.close()

    def _start_idle(self) -> None:
        """Idle from now. One timer per connection, re-armed when it fires early, instead of one cancelled and
        made anew around every request (a timer heap entry each time, on the exec path)."""
        loop = asyncio.get_running_loop()
        self._idle_since = loop.time()
        if self._idle is None and not self.lost:
            self._idle = loop.call_later(KEEP_ALIVE_SECONDS, self._idle_expired)

    def _cancel_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _idle_expired(self) -> None:
        self._idle = None
        if self.lost or self.upgraded is not None:
            return  # a WebSocket's own pings look after it
        loop = asyncio.get_running_loop()
        idle_since = self._idle_since
        busy = idle_since is None or self._answering is not None or bool(self._requests)
        left = KEEP_ALIVE_SECONDS if busy else idle_since + KEEP_ALIVE_SECONDS - loop.time()
        if left > 0:
            self._idle = loop.call_later(left, self._idle_expired)
        else:
            self.transport.close()

    def close(self) -> None:
        if not self.lost:
            self.transport.abort()


class Server:
    """The app served on a listening socket until stopped."""

    def __init__(self, app: Application):
        self.app = app
        self.connections: set[_Connection] = set()
        self._server: asyncio.base_events.Server | None = None

    async def start(self, **where) -> None:
        """`where`: sock=, or path= (a unix socket), or host= and port=."""
        loop = asyncio.get_running_loop()
        if "sock" in where:
            self._server = await loop.create_unix_server(lambda: _Connection(self), sock=where["sock"])
        elif "path" in where:
            self._server = await loop.create_unix_server(lambda: _Connection(self), path=where["path"])
        else:
            self._server = await loop.create_server(lambda: _Connection(self), where["host"], where["port"])

    @property
    def name(self) -> str:
        return ", ".join(str(sock.getsockname()) for sock in self._server.sockets)

    async def stop(self) -> None:
        """Stop accepting, run the shutdown hooks (they end what handlers wait on), then close every connection."""
        self._server.close()
        for hook in self.app.on_shutdown:
            try:
                await hook(self.app)
            except Exception:
                log.exception("shutdown hook failed")
        # answers under way (a stream whose command the hooks just killed) get to finish, for a while
        working = [c.worker for c in self.connections if c.worker is not None and not c.worker.done()]
        if working:
            await asyncio.wait(working, timeout=SHUTDOWN_SECONDS)
        for connection in list(self.connections):
            connection.close()
        await asyncio.sleep(0)
