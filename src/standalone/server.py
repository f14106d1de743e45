"""The ASGI adapter: an ASGI HTTP request → worker EdgeRequest → Edge.handle → the ports.Response sent back.

Thin on purpose: every decision is in worker/ and durable/. What lives here is plumbing: reading the body under a
limit, streaming response bodies (bytes or async iterators) with backpressure, and noticing a client that went away
so the stream's producer stops.
"""

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from durable.ports import Response
from protocol.errors import ProtocolError
from standalone import console
from standalone.asgi_socket import AsgiSocket
from standalone.streams import close_body
from worker.request import EdgeRequest

log = logging.getLogger("flarebox.server")

# Request headers larger than this are refused with 431 (h11 alone only bounds headers split across reads).
MAX_HEADER_BYTES = 32 * 1024


class AsgiBody:
    """ports.RequestBody over ASGI `receive`: read(limit) for JSON bodies, stream for file uploads. Single use.

    `declared`: the request announced a body (Content-Length or Transfer-Encoding). One that did not has none
    (RFC 9112 6.3): `stream_at_most` is then None, like a Cloudflare request's null body, so a proxied plain GET
    is forwarded without a body, not with an empty chunked one."""

    def __init__(self, receive, declared: bool = True):
        self._receive = receive
        self.declared = declared
        self.finished = False
        self.disconnected = False

    async def _next_chunk(self) -> bytes | None:
        if self.finished:
            return None
        message = await self._receive()
        if message["type"] == "http.disconnect":
            self.disconnected = True
            self.finished = True
            raise ConnectionResetError("the client disconnected while sending the body")
        if not message.get("more_body", False):
            self.finished = True
        return message.get("body", b"")

    async def read(self, limit: int) -> bytes:
        parts: list[bytes] = []
        size = 0
        while not self.finished:
            chunk = await self._next_chunk()
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise ProtocolError("payload_too_large", f"the body is limited to {limit} bytes")
                parts.append(chunk)
        return b"".join(parts)

    async def _iterate(self) -> AsyncIterator[bytes]:
        while not self.finished:
            chunk = await self._next_chunk()
            if chunk:
                yield chunk

    @property
    def stream(self) -> AsyncIterator[bytes]:
        return self._iterate()

    def stream_at_most(self, limit: int) -> AsyncIterator[bytes] | None:
        return self._iterate_at_most(limit) if self.declared else None

    async def _iterate_at_most(self, limit: int) -> AsyncIterator[bytes]:
        size = 0
        async for chunk in self._iterate():
            size += len(chunk)
            if size > limit:
                raise ProtocolError("payload_too_large", f"the body is limited to {limit} bytes")
            yield chunk


def _headers(scope: dict) -> dict[str, str]:
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", ()):
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


def _edge_request(scope: dict, headers: dict[str, str], body: Any, method: str, socket: Any = None) -> EdgeRequest:
    return EdgeRequest(
        method=method,
        # raw_path keeps percent-encoding so a `%` in a name reaches validation instead of being decoded
        path=(scope.get("raw_path") or scope["path"].encode()).decode("latin-1"),
        query=scope.get("query_string", b"").decode("latin-1"),
        headers=headers,
        body=body,
        socket=socket,
        client_ip=(scope.get("client") or ("",))[0] or "",
        scheme=scope.get("scheme", "http"),
    )


class FlareboxApp:
    """The ASGI application. `edge` is a worker Edge; `on_shutdown` runs at ASGI lifespan shutdown."""

    def __init__(self, edge: Any, on_shutdown=None):
        self.edge = edge
        self._on_shutdown = on_shutdown

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            return
        if sum(len(k) + len(v) for k, v in scope.get("headers", ())) > MAX_HEADER_BYTES:
            await self._send(Response.error(ProtocolError("headers_too_large")), AsgiBody(receive), receive, send)
            return
        if console.serves(scope["path"]):  # the web console's static files (standalone/console.py), not the API
            await self._send(console.respond(scope["method"], scope["path"]), AsgiBody(receive), receive, send)
            return
        headers = _headers(scope)
        body = AsgiBody(receive, "content-length" in headers or "transfer-encoding" in headers)
        request = _edge_request(scope, headers, body, scope["method"])
        try:
            response = await self.edge.handle(request)
        except ConnectionResetError:
            return  # the client left while uploading; nobody to answer
        await self._send(response, body, receive, send)

    async def _websocket(self, scope: dict, receive, send) -> None:
        """A WebSocket (the terminal route): the edge authenticates and routes it like any GET; a workspace that
        accepts it answers 101 and runs the session until a side closes. Anything else is refused over HTTP."""
        socket = AsgiSocket(scope, receive, send)
        if sum(len(k) + len(v) for k, v in scope.get("headers", ())) > MAX_HEADER_BYTES:
            response = Response.error(ProtocolError("headers_too_large"))
        else:
            request = _edge_request(scope, _headers(scope), None, "GET", socket)
            response = await self.edge.handle(request)
        if response.status == 101 and socket.accepted:
            await socket.closed.wait()
            return
        data = response.body if isinstance(response.body, bytes) else b""
        headers = [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in response.headers.items()]
        headers.append((b"content-length", str(len(data)).encode()))
        await socket.refuse(response.status, headers, data)

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._on_shutdown is not None:
                    try:
                        await self._on_shutdown()
                    except Exception:
                        log.exception("shutdown failed")
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _send(self, response: Response, body: AsgiBody, receive, send) -> None:
        payload = response.body
        pairs = [*response.headers.items(), *response.header_pairs]
        # uvicorn sends its own Date on every answer: a proxied service's would be a second one (Date is a
        # singleton field), so the server's clock speaks, as for every other answer
        headers = [(k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in pairs if k.lower() != "date"]
        if isinstance(payload, (bytes, bytearray, memoryview)) or payload is None:
            data = bytes(payload or b"")
            if not any(k == b"content-length" for k, _ in headers):
                headers.append((b"content-length", str(len(data)).encode()))
            await send({"type": "http.response.start", "status": response.status, "headers": headers})
            await send({"type": "http.response.body", "body": data})
            return
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        await self._stream(payload, body, receive, send)

    async def _stream(self, payload: Any, body: AsgiBody, receive, send) -> None:
        """Send an async-iterator body. A watcher waits for http.disconnect: uvicorn's send() silently drops data
        for a gone client, so without it a relay would keep running for nobody."""
        pump = asyncio.ensure_future(self._pump(payload, send))
        watch = asyncio.ensure_future(self._wait_disconnect(body, receive))
        try:
            done, _ = await asyncio.wait({pump, watch}, return_when=asyncio.FIRST_COMPLETED)
            if pump in done:
                pump.result()  # re-raise a producer failure (uvicorn then closes the connection)
        finally:
            for task in (pump, watch):
                task.cancel()
            await asyncio.gather(pump, watch, return_exceptions=True)
            await close_body(payload)

    @staticmethod
    async def _pump(payload: Any, send) -> None:
        async for chunk in payload:
            if chunk:
                await send({"type": "http.response.body", "body": bytes(chunk), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    @staticmethod
    async def _wait_disconnect(body: AsgiBody, receive) -> None:
        if body.disconnected:
            return
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
