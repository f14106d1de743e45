"""ports.Streams over a JS TransformStream: the readable side is the response body, the workspace writes status
and heartbeat lines into the writable side, then hands it the supervisor's stream with `pipeTo` — the runtime moves
those bytes, no Python runs per chunk."""

from typing import Any

import js
from pyodide.ffi import JsException

from cloudflare.jsutil import jsobj, uint8
from durable.ports import ContainerGone

# Chunks the readable side buffers before a writer waits for the client (like the standalone runtime's queue):
# lines written before the client starts reading (status events during a boot) never block the workspace.
BUFFERED_CHUNKS = 64


class StreamClosed(ConnectionError):
    """The client went away; nothing more can be written."""


class JsSink:
    def __init__(self) -> None:
        self._stream = js.TransformStream.new(
            None, jsobj({"highWaterMark": 1}), jsobj({"highWaterMark": BUFFERED_CHUNKS})
        )
        self.readable = self._stream.readable
        self._writer: Any = None
        self._closed = False

    def _get_writer(self) -> Any:
        if self._writer is None:
            self._writer = self._stream.writable.getWriter()
        return self._writer

    async def write(self, data: bytes) -> None:
        if self._closed:
            raise StreamClosed("the stream is closed")
        writer = self._get_writer()
        try:
            await writer.ready
            await writer.write(uint8(data))
        except JsException as exc:
            raise StreamClosed("the client closed the stream") from exc

    async def pipe_from(self, body: Any) -> None:
        if self._closed:
            raise StreamClosed("the stream is closed")
        if self._writer is not None:  # pipeTo needs the writable unlocked
            self._writer.releaseLock()
            self._writer = None
        try:
            # preventAbort: if the container's stream breaks, the client's stream stays open for a terminal event.
            await body.pipeTo(self._stream.writable, jsobj({"preventClose": True, "preventAbort": True}))
        except JsException as exc:
            try:  # which side failed? a writable that still accepts writes means the container's side broke
                await self._get_writer().ready
            except JsException:
                raise StreamClosed("the client closed the stream") from exc
            raise ContainerGone("the container's stream ended abnormally") from exc

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._get_writer().close()
        except JsException:
            pass  # the client is gone already; nothing to flush


class JsStreams:
    def open(self) -> JsSink:
        return JsSink()
