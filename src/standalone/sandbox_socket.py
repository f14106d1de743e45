"""A WebSocket to a sandbox's supervisor (ports.Socket): the terminal route's upstream, with the `websockets` library
over the sandbox's unix socket.

Like every connection to the supervisor, it is used only when its peer is the sandbox (peer.py): the socket is
connected and checked here, then handed to the library. The supervisor's refusal of the upgrade (a plain HTTP
error answer) comes back as its ProtocolError.
"""

import asyncio
import json
import socket
from collections.abc import Callable

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from durable.ports import ContainerGone
from protocol.errors import ERRORS, ProtocolError
from standalone.peer import descends_from, peer_credentials

CONNECT_SECONDS = 10
# The largest frame the supervisor sends: a resumed session's whole scrollback (256 KiB) in one, with room to spare
MAX_FRAME_BYTES = 1024 * 1024


class SupervisorSocket:
    def __init__(self, conn: ClientConnection):
        self._conn = conn

    async def accept(self) -> None:  # an upstream is connected, never accepted
        raise NotImplementedError

    async def receive(self) -> bytes | str | None:
        try:
            return await self._conn.recv()
        except ConnectionClosed:
            return None

    async def send(self, frame: bytes | str) -> None:
        try:
            await self._conn.send(frame)
        except ConnectionClosed as exc:
            raise ConnectionError("the supervisor's socket is closed") from exc

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self._conn.close(code, reason)


async def open_socket(path: str, target: str, expected: Callable[[], tuple[int, int] | None]) -> SupervisorSocket:
    """Connect to the supervisor at unix socket `path`, check its peer, and open the WebSocket `target`."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.setblocking(False)
    try:
        async with asyncio.timeout(CONNECT_SECONDS):
            await asyncio.get_running_loop().sock_connect(sock, path)
        pid, uid, _ = peer_credentials(sock)
        peer = expected()
        if peer is None or uid != peer[0] or not descends_from(pid, peer[1]):
            raise ContainerGone(f"the supervisor socket is answered by a stranger (pid {pid}, uid {uid})")
    except (TimeoutError, OSError) as exc:
        sock.close()
        raise ContainerGone(f"the sandbox cannot be reached: {exc.__class__.__name__}") from None
    except BaseException:
        sock.close()
        raise
    try:
        conn = await connect(
            f"ws://sandbox{target}",
            sock=sock,
            open_timeout=CONNECT_SECONDS,
            max_size=MAX_FRAME_BYTES,
            compression=None,  # a local socket: compressing terminal bytes would only cost CPU
            ping_interval=None,  # the supervisor is local and answers or is gone (the container's state says)
        )
    except InvalidStatus as refused:
        raise _refusal(refused.response.status_code, refused.response.body or b"") from None
    except (TimeoutError, OSError, WebSocketException) as exc:
        sock.close()
        raise ContainerGone(f"the supervisor did not open the terminal: {exc.__class__.__name__}") from None
    return SupervisorSocket(conn)


def _refusal(status: int, body: bytes) -> ProtocolError:
    try:
        err = json.loads(body)["error"]
        if err["code"] in ERRORS and isinstance(err.get("message"), str):
            return ProtocolError(err["code"], err["message"])
    except (ValueError, KeyError, TypeError):
        pass
    return ProtocolError("internal_error", f"the sandbox refused the terminal with HTTP {status}")
