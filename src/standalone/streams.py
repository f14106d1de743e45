"""ports.Streams: a response body the workspace writes into while the server sends it (Cloudflare: TransformStream).

A bounded queue gives backpressure (a slow client slows the relay, never grows memory without bound): a writer waits
while QUEUE_CHUNKS chunks or QUEUE_BYTES bytes are queued. When the client goes away the server closes the readable;
the next write raises StreamClosed and `pipe_from` stops reading the container, so a dead client never keeps a relay
running.

One reader (the server sending the response), any number of writers (a relay and its heartbeats). A deque and bare
futures instead of asyncio.Queue: a chunk that finds room costs no wake-up of anything but the waiting reader.
"""

import asyncio
import json
import logging
from collections import deque
from typing import Any

from durable.ports import ContainerGone

log = logging.getLogger("flarebox.streams")

QUEUE_CHUNKS = 64
QUEUE_BYTES = 1024 * 1024
# queued small chunks are joined into one read up to this size: fewer sends and TCP segments for bursts of small
# events; a bulk transfer's large chunks pass one by one (joining them would only copy them once more)
COALESCE_BYTES = 64 * 1024
_EOF = object()
_ABORT = object()


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
        if sink.reader_gone:
            raise StopAsyncIteration
        items = sink.items
        while not items:
            waiter = sink.getter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                sink.getter = None
        item = items.popleft()
        if item is _EOF:
            sink.reader_gone = True
            raise StopAsyncIteration
        if item is _ABORT:
            sink.reader_gone = True
            raise StreamClosed("the stream's source failed midway")
        size = len(item)
        if items and size < COALESCE_BYTES:
            parts = [item]
            while items and items[0] is not _EOF and items[0] is not _ABORT:
                if size + len(items[0]) > COALESCE_BYTES:
                    break
                more = items.popleft()
                size += len(more)
                parts.append(more)
            if len(parts) > 1:
                item = b"".join(parts)
        sink.taken(size)
        return item

    async def aclose(self) -> None:
        """The server stopped sending (client disconnected or response done): release any blocked writer, and
        interrupt a relay waiting on an interruptible body."""
        sink = self._sink
        sink.reader_gone = True
        sink.drain()
        waiting = sink._body_wait
        if waiting is not None and not waiting.done():
            sink._interrupted = True
            waiting.cancel()


class QueueSink:
    def __init__(self, maxsize: int = QUEUE_CHUNKS, maxbytes: int = QUEUE_BYTES):
        self.items: deque = deque()
        self.size = 0  # bytes queued
        self.maxsize = maxsize
        self.maxbytes = maxbytes
        self.getter: asyncio.Future | None = None  # the reader, waiting for an item
        self._putters: deque[asyncio.Future] = deque()  # writers waiting for room
        self.reader_gone = False
        self.closed = False
        self.readable = _Readable(self)
        self._body_wait: asyncio.Task | None = None  # pipe_from's task, while it waits on an interruptible body
        self._interrupted = False

    def _full(self) -> bool:
        return len(self.items) >= self.maxsize or self.size >= self.maxbytes

    def taken(self, size: int) -> None:
        self.size -= size
        self._wake_putters()

    def _wake_putters(self) -> None:
        while self._putters:
            waiter = self._putters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def drain(self) -> None:
        self.items.clear()
        self.size = 0
        self._wake_putters()

    async def _put(self, item: object, size: int) -> None:
        while self._full() and not self.reader_gone:
            waiter = asyncio.get_running_loop().create_future()
            self._putters.append(waiter)
            await waiter
        if self.reader_gone:
            return
        self.items.append(item)
        self.size += size
        getter = self.getter
        if getter is not None and not getter.done():
            getter.set_result(None)

    async def write(self, data: bytes) -> None:
        if self.reader_gone:
            raise StreamClosed("the client closed the stream")
        if self.closed:
            raise StreamClosed("the stream was already closed")
        if not data:
            return
        await self._put(bytes(data), len(data))
        if self.reader_gone:  # woke up because the reader left and drained the queue
            self.drain()
            raise StreamClosed("the client closed the stream")

    async def pipe_from(self, body: Any) -> None:
        """Copy a container response body (an async iterator of bytes) into this sink. Returns at its normal end,
        or early when the client is gone; raises ContainerGone when the body fails midway — unless the stream's
        terminal event had already passed (the sandbox stopped right after it): the client has its outcome, and a
        second terminal event would break the one-terminal-event rule."""
        last: list[bytes] = [b"", b""]  # the last two chunks: enough to hold the final line
        # a body that says so (a proxied answer: an SSE stream may be silent for hours) is interrupted when the
        # reader leaves, instead of at its next chunk: its upstream connection closes at once
        watched = getattr(body, "interruptible", False)
        try:
            iterator = body.__aiter__()
            while True:
                if watched:
                    self._body_wait = asyncio.current_task()
                try:
                    chunk = await iterator.__anext__()
                except StopAsyncIteration:
                    break
                finally:
                    self._body_wait = None
                last[0], last[1] = last[1], chunk
                try:
                    await self.write(chunk)
                except StreamClosed:
                    return
        except asyncio.CancelledError:
            if not self._interrupted:
                raise
            asyncio.current_task().uncancel()  # the reader left: as if the next write had failed
            return
        except (ContainerGone, StreamClosed) as exc:
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
        await self._end(_EOF)

    async def abort(self) -> None:
        """The reader's next read fails instead of ending: the server then drops the connection."""
        await self._end(_ABORT)

    async def _end(self, marker: object) -> None:
        if self.closed:
            return
        self.closed = True
        if self.reader_gone:
            return
        await self._put(marker, 0)


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


async def close_body(payload: Any) -> None:
    """Close a response body that was being sent (its producer stops: the relay, the container's stream), whatever
    state it is in; a failure to close is logged, never raised over the answer's own outcome."""
    aclose = getattr(payload, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except Exception:
            log.debug("closing a response stream failed", exc_info=True)
