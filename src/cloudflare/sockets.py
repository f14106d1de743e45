"""WebSockets in the Workers runtime: the terminal route (GET …/pty) from the client through the Worker and the
workspace object to the supervisor.

    client ──upgrade──▶ Worker ──stub.fetch (GET, Upgrade: websocket)──▶ object: WebSocketPair, the server end
    accepted here (JsSocket), the client end returned in the 101 ──▶ Worker: the stub's answer's `webSocket`,
    returned as is in its own 101 (the runtime couples it to the client; the Worker never accepts it)

    object ──getTcpPort(8080).fetch(…, Upgrade: websocket)──▶ supervisor: the answer's `webSocket`, accepted here
    (JsSocket) — or, without one, the supervisor's refusal (its JSON error)

The platform's rules this follows (workerd 2026-11-17, checked on the binary): an upgrade through a stub reaches
the object as a GET without a body (the method and body of the request are dropped), so the call's args travel in
the args header; a WebSocket must be accept()ed before it sends, receives or closes, and one returned in a Response
must not be; binary messages arrive as Blobs unless `binaryType` is "arraybuffer" (the standard default since
`websocket_standard_binary_type`), so it is set before accepting; a send after either side closed throws; a close
reason is at most 123 bytes of UTF-8.
"""

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import js
from pyodide.ffi import JsException, create_proxy

from cloudflare.jsutil import to_bytes, uint8
from durable.ports import Response
from worker.auth import SUBPROTOCOL

log = logging.getLogger("flarebox.cloudflare.sockets")

MAX_REASON_BYTES = 123  # a close frame's reason (RFC 6455 5.5: 125 bytes of payload, 2 of them the code)
_ENDED = object()  # the queue's mark: the other side closed or went away


@dataclass(frozen=True)
class ClientUpgrade:
    """EdgeRequest.socket in the Worker: the client asked for a WebSocket (`Upgrade: websocket`). Only a marker:
    the Worker never accepts it; the workspace object answers the upgrade (DurableObjectStub.call forwards it) and
    the Worker returns the object's socket. `subprotocol` is the one the answer selects: `flarebox` when the
    client offered it, never the bearer subprotocol (that would echo the credential)."""

    subprotocol: str | None = None

    @classmethod
    def of(cls, headers: dict[str, str]) -> "ClientUpgrade | None":
        """The marker when `headers` (lower-case names) ask for a WebSocket, else None."""
        tokens = [token.strip().lower() for token in headers.get("upgrade", "").split(",")]
        if "websocket" not in tokens:
            return None
        offered = [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",")]
        return cls(SUBPROTOCOL if SUBPROTOCOL in offered else None)


def is_upgrade(js_headers: Any) -> bool:
    value = js_headers.get("upgrade")
    return isinstance(value, str) and "websocket" in [t.strip().lower() for t in value.split(",")]


@dataclass
class SocketResponse(Response):
    """A 101 carrying a runtime WebSocket: the object's answer (its pair's client end) and the Worker's (the
    stub's answer's socket, passed on). js_response makes it `new Response(null, {status: 101, webSocket})`."""

    socket: Any = None


class JsSocket:
    """ports.Socket over one runtime WebSocket: a WebSocketPair's server end (the client's terminal, in the
    object) or the `webSocket` of a fetch's 101 (the supervisor's). Its events feed a queue through listeners
    that are removed and destroyed once the socket is done, so nothing of it outlives the connection."""

    def __init__(self, ws: Any):
        self._ws = ws
        self._queue: asyncio.Queue = asyncio.Queue()
        self._listeners: list[tuple[str, Any]] = []
        self._accepted = False
        self._closed = False  # close() was called, or the other side is gone: nothing more is sent
        self._ended = False  # receive() has seen the end
        self.close_code: int | None = None  # the other side's close, once it came
        self.close_reason = ""

    async def accept(self) -> None:
        """Start the socket: listeners and binaryType first, so no message finds it unready. Idempotent (the
        supervisor's socket is accepted by connect())."""
        if self._accepted:
            return
        self._ws.binaryType = "arraybuffer"
        for kind, handler in (("message", self._on_message), ("close", self._on_close), ("error", self._on_error)):
            proxy = create_proxy(handler)
            self._ws.addEventListener(kind, proxy)
            self._listeners.append((kind, proxy))
        try:
            self._ws.accept()
        except JsException as exc:
            self._release()
            raise ConnectionError("the WebSocket could not be accepted") from exc
        self._accepted = True

    async def receive(self) -> bytes | str | None:
        if self._ended:
            return None
        item = await self._queue.get()
        if item is _ENDED:
            self._ended = True
            return None
        if isinstance(item, str | bytes):
            return item
        try:  # a Blob's bytes (a runtime that ignored binaryType), awaited in order
            return to_bytes(await item)
        except JsException:
            self._ended = True
            return None

    async def send(self, frame: bytes | str) -> None:
        if self._closed:
            raise ConnectionError("the WebSocket is closed")
        try:
            self._ws.send(frame if isinstance(frame, str) else uint8(bytes(frame)))
        except JsException as exc:  # "Can't call WebSocket send() after close()": the other side closed
            self._closed = True
            raise ConnectionError("the WebSocket is closed") from exc

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if not self._closed:
            self._closed = True
            if self._accepted:
                try:
                    self._ws.close(code, _reason(reason))
                except JsException:
                    log.debug("a WebSocket close failed", exc_info=True)
        self._release()
        self._queue.put_nowait(_ENDED)  # a receive() still waiting ends

    # -- the runtime's events (synchronous: only the queue is touched) --------------------------------------------

    def _on_message(self, event: Any) -> None:
        data = event.data
        if isinstance(data, str):
            self._queue.put_nowait(data)
        elif hasattr(data, "to_bytes"):  # an ArrayBuffer: copied now
            self._queue.put_nowait(to_bytes(data))
        else:  # a Blob: its bytes come later, so the promise keeps its place
            self._queue.put_nowait(data.arrayBuffer())

    def _on_close(self, event: Any) -> None:
        self.close_code, self.close_reason = int(event.code), str(event.reason or "")
        self._end()

    def _on_error(self, _event: Any) -> None:
        self._end()

    def _end(self) -> None:
        self._closed = True
        self._queue.put_nowait(_ENDED)
        # not from inside the runtime's dispatch to these very listeners
        asyncio.get_event_loop().call_soon(self._release)

    def _release(self) -> None:
        listeners, self._listeners = self._listeners, []
        for kind, proxy in listeners:
            try:
                self._ws.removeEventListener(kind, proxy)
            except JsException:
                pass
            proxy.destroy()


def _reason(reason: str) -> str:
    data = reason.encode("utf-8")[:MAX_REASON_BYTES]
    return data.decode("utf-8", "ignore")  # never half a character


def socket_pair() -> tuple[Any, Any]:
    """A new WebSocketPair as (client end, server end)."""
    ends = js.Object.values(js.WebSocketPair.new())
    return ends[0], ends[1]
