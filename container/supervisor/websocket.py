"""A server WebSocket on one of httpserver's connections: websockets' sans-I/O protocol does the framing, the
handshake's checks, pings and the close handshake; this moves its bytes and hands out whole messages.

Imported by the terminal route on its first request: most sandboxes never open a terminal.
"""

import asyncio
import json
import logging
from dataclasses import dataclass

from websockets.frames import CloseCode, Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol

from flarebox_supervisor.httpserver import Request

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
QUEUED_BYTES = 1024 * 1024  # messages received and not yet taken by the handler before reading pauses
_log = logging.getLogger("flarebox_supervisor.websocket")
_log.setLevel(logging.WARNING)  # not a line in the sandbox's log per terminal opened and closed


@dataclass(frozen=True, slots=True)
class Message:
    data: bytes | str  # bytes for a binary message, str for a text one

    @property
    def binary(self) -> bool:
        return isinstance(self.data, bytes)


class WebSocket:
    """The handler's side: ok() (the request is a valid handshake), prepare() (switch), then send and receive."""

    def __init__(self, request: Request, close_seconds: float):
        self._request = request
        self._connection = request.connection
        self._close_seconds = close_seconds
        self._protocol = ServerProtocol(max_size=MAX_MESSAGE_BYTES, logger=_log)
        # the protocol parses the handshake itself before it reads frames: it is given the head httptools parsed
        head = "".join(f"{name}: {value}\r\n" for name, value in request.headers.items())
        self._protocol.receive_data(f"GET / HTTP/1.1\r\n{head}\r\n".encode("latin-1"))
        events = self._protocol.events_received()  # empty when it cannot parse that head: no handshake then
        self._response = self._protocol.accept(events[0]) if events else None
        self._messages: asyncio.Queue[Message | None] = asyncio.Queue()
        self._queued = 0
        self._paused = False
        self._fragments: list[bytes] = []
        self._fragment_text = False
        self._closed = asyncio.get_running_loop().create_future()

    def ok(self) -> bool:
        return self._response is not None and self._response.status_code == 101 and self._request.upgrade

    async def prepare(self) -> None:
        """Answer 101 and take the connection over."""
        self._protocol.send_response(self._response)
        self._connection.upgraded = self
        self._flush()
        tail, self._connection.upgrade_tail = self._connection.upgrade_tail, b""
        if tail:
            self.data_received(tail)
        if not self._paused:
            self._connection.transport.resume_reading()  # paused since the upgrade request's head
        await self._connection.drain()

    # -- out ---------------------------------------------------------------------------------------------------

    async def send_bytes(self, data: bytes) -> None:
        self._open().send_binary(data)
        await self._send()

    async def send_json(self, data) -> None:
        self._open().send_text(json.dumps(data).encode())
        await self._send()

    async def close(self, code: int = 1000) -> None:
        """The close handshake: ours, then the client's answer (waited for at most close_seconds)."""
        if self._protocol.state is State.OPEN:
            self._protocol.send_close(code)
            self._flush()
        try:
            async with asyncio.timeout(self._close_seconds):
                await asyncio.shield(self._closed)
        finally:
            self._end()

    def _open(self) -> ServerProtocol:
        if self._protocol.state is not State.OPEN or self._connection.lost:
            raise ConnectionResetError("the WebSocket is closing")
        return self._protocol

    async def _send(self) -> None:
        self._flush()
        await self._connection.drain()

    def _flush(self) -> None:
        """What the protocol has to send; b"" among it means it is done with the stream (after the close
        handshake, or failing the connection), which then closes."""
        done = False
        for data in self._protocol.data_to_send():
            if data:
                self._connection.write(data)
            else:
                done = True
        if done:
            self._end()

    # -- in ----------------------------------------------------------------------------------------------------

    async def receive(self) -> Message | None:
        """The client's next whole message; None once the WebSocket is closed (by either side, or broken)."""
        if self._closed.done() and self._messages.empty():
            return None
        message = await self._messages.get()
        if message is not None:
            self._queued -= len(message.data)
            if self._paused and self._queued <= QUEUED_BYTES and not self._connection.lost:
                self._paused = False
                self._connection.transport.resume_reading()
        return message

    def data_received(self, data: bytes) -> None:
        self._protocol.receive_data(data)
        for frame in self._protocol.events_received():
            if frame.opcode in (Opcode.TEXT, Opcode.BINARY):
                self._fragments, self._fragment_text = [frame.data], frame.opcode is Opcode.TEXT
            elif frame.opcode is Opcode.CONT:
                self._fragments.append(frame.data)
            else:
                continue  # ping, pong and close are the protocol's own business
            if frame.fin:
                self._deliver(b"".join(self._fragments))
                self._fragments = []
        try:
            self._flush()  # pongs, the answer to a close, or the close for a protocol error
        except ConnectionResetError:
            self._end()
        if self._protocol.state is State.CLOSED:
            self._end()

    def _deliver(self, data: bytes) -> None:
        if self._fragment_text:
            try:
                message = Message(data.decode())
            except UnicodeDecodeError:
                self._protocol.fail(CloseCode.INVALID_DATA, "a text message that is not UTF-8")
                return
        else:
            message = Message(data)
        self._messages.put_nowait(message)
        self._queued += len(message.data)
        if not self._paused and self._queued > QUEUED_BYTES and not self._connection.lost:
            self._paused = True  # a client typing (pasting) faster than the pty takes it waits in its socket
            self._connection.transport.pause_reading()

    def connection_lost(self) -> None:
        self._end()

    def _end(self) -> None:
        if not self._closed.done():
            self._closed.set_result(None)
            self._messages.put_nowait(None)
        if not self._connection.lost:
            self._connection.transport.close()
