"""A client's WebSocket over ASGI messages (ports.Socket), for the terminal route.

The edge decides first: until the workspace accepts the socket, the request can still be refused with an ordinary
HTTP answer (the ASGI "websocket.http.response" extension, which uvicorn offers), so a wrong token is a 401 like on
every route. Accepting selects the `flarebox` subprotocol when the client offered it (never the bearer
subprotocol, which would echo the credential).
"""

import asyncio
from typing import Any

from worker.auth import SUBPROTOCOL


class AsgiSocket:
    def __init__(self, scope: dict, receive, send):
        self._receive = receive
        self._send = send
        offered = [p.strip() for p in scope.get("subprotocols", ())]
        self._subprotocol = SUBPROTOCOL if SUBPROTOCOL in offered else None
        self.accepted = False
        self.closed = asyncio.Event()  # set once either side closed: the ASGI call may return then

    async def accept(self) -> None:
        message = await self._receive()  # websocket.connect comes first
        if message["type"] != "websocket.connect":
            self.closed.set()
            raise ConnectionError("the client left before its upgrade was answered")
        await self._send({"type": "websocket.accept", "subprotocol": self._subprotocol})
        self.accepted = True

    async def receive(self) -> bytes | str | None:
        if self.closed.is_set():
            return None
        message = await self._receive()
        if message["type"] == "websocket.receive":
            data = message.get("bytes")
            return data if data is not None else message.get("text", "")
        self.closed.set()  # websocket.disconnect
        return None

    async def send(self, frame: bytes | str) -> None:
        if self.closed.is_set():
            raise ConnectionError("the client's socket is closed")
        message: dict[str, Any] = {"type": "websocket.send"}
        message["bytes" if isinstance(frame, bytes) else "text"] = frame
        try:
            await self._send(message)
        except Exception as exc:  # uvicorn raises its own ClientDisconnected (an OSError) or a RuntimeError
            self.closed.set()
            raise ConnectionError("the client's socket is closed") from exc

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        try:
            await self._send({"type": "websocket.close", "code": code, "reason": reason[:120]})
        except Exception:
            pass  # already gone

    async def refuse(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """Answer the upgrade with an HTTP response instead (nothing was accepted)."""
        await self._send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await self._send({"type": "websocket.http.response.body", "body": body})
        self.closed.set()
