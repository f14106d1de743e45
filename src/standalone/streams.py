"""ports.Streams: a response body the workspace writes into while the server sends it (Cloudflare: TransformStream).

A bounded queue gives backpressure (a slow client slows the relay, never grows memory without bound). When the
client goes away the server closes the readable; the next write raises StreamClosed and `pipe_from` stops reading
the container, so a dead client never keeps a relay running.
"""

import asyncio
import json
from typing import Any

from durable.ports import ContainerGone

QUEUE_CHUNKS = 64
_EOF = object()


class StreamClosed(ConnectionError):
    """The reader (the HTTP client) is gone; nothing more can be written."""


class _Readable:
    """The async iterator the server sends as the response body."""

    def __init__(self, sink: "QueueSink"):
        self._sink = sink

    def __aiter__(self) -> "_Readable":
        return self

    async def __anext__(self) -> bytes:
        sink = self._sink
        if sink.reader_gone or sink.eof_seen:
            raise StopAsyncIteration
        item = await sink.queue.get()
        if item is _EOF:
            sink.reader_gone = True
            raise StopAsyncIteration
        # coalesce what is already queued into one chunk: fewer sends and TCP segments for bursts of small events
        parts = [item]
        while not sink.queue.empty():
            more = sink.queue.get_nowait()
            if more is _EOF:
                sink.eof_seen = True
                break
            parts.append(more)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def aclose(self) -> None:
        """The server stopped sending (client disconnected or response done): release any blocked writer."""
        self._sink.reader_gone = True
        self._sink.drain()


class QueueSink:
    def __init__(self, maxsize: int = QUEUE_CHUNKS):
        self.queue: asyncio.Queue = asyncio.Queue(maxsize)
        self.reader_gone = False
        self.eof_seen = False  # EOF taken off the queue while coalescing; the next read ends the stream
        self.closed = False
        self.readable = _Readable(self)

    def drain(self) -> None:
        while not self.queue.empty():
            self.queue.get_nowait()

    async def write(self, data: bytes) -> None:
        if self.reader_gone:
            raise StreamClosed("the client closed the stream")
        if self.closed:
            raise StreamClosed("the stream was already closed")
        if not data:
            return
        await self.queue.put(bytes(data))
        if self.reader_gone:  # woke up because the reader left and drained the queue
            self.drain()
            raise StreamClosed("the client closed the stream")

    async def pipe_from(self, body: Any) -> None:
        """Copy a container response body (an async iterator of bytes) into this sink. Returns at its normal end,
        or early when the client is gone; raises ContainerGone when the body fails midway — unless the stream's
        terminal event had already passed (the sandbox stopped right after it): the client has its outcome, and a
        second terminal event would break the one-terminal-event rule."""
        last: list[bytes] = [b"", b""]  # the last two chunks: enough to hold the final line
        try:
            async for chunk in body:
                last[0], last[1] = last[1], chunk
                try:
                    await self.write(chunk)
                except StreamClosed:
                    return
        except (ContainerGone, StreamClosed, asyncio.CancelledError) as exc:
            if isinstance(exc, ContainerGone) and ends_with_terminal(last[0] + last[1]):
                return
            raise
        except Exception as exc:  # a reset socket, a truncated chunked body...: the sandbox went away
            if ends_with_terminal(last[0] + last[1]):
                return
            raise ContainerGone(f"container stream ended abnormally: {type(exc).__name__}") from exc
        finally:
            aclose = getattr(body, "aclose", None)
            if aclose is not None:
                try:
                    await aclose()
                except Exception:  # closing a broken stream may fail again; nothing left to do with it
                    pass

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.reader_gone:
            return
        await self.queue.put(_EOF)


def ends_with_terminal(data: bytes) -> bool:
    """Whether `data` ends with a complete `exit` or `error` event line."""
    if not data.endswith(b"\n"):
        return False
    line = data[:-1].rsplit(b"\n", 1)[-1]
    try:
        event = json.loads(line)
    except ValueError:
        return False
    return isinstance(event, dict) and event.get("type") in ("exit", "error")


class QueueStreams:
    def open(self) -> QueueSink:
        return QueueSink()
