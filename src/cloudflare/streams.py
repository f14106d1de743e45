"""ports.Streams over a JS TransformStream: the readable side is the response body, the workspace writes status
and heartbeat lines into the writable side, then hands it the supervisor's stream with `pipeTo` — the runtime moves
those bytes, no Python runs per chunk beyond a counter (see the silence guard below)."""

import asyncio
import logging
from typing import Any

import js
from pyodide.ffi import JsException, create_once_callable, create_proxy

from cloudflare.jsutil import is_null, jsobj, uint8
from durable.ports import ContainerGone
from protocol import limits

log = logging.getLogger("flarebox.cloudflare.streams")

# Chunks the readable side buffers before a writer waits for the client (like the standalone runtime's queue):
# lines written before the client starts reading (status events during a boot) never block the workspace.
BUFFERED_CHUNKS = 64
# The silence guard (standalone.sandbox.SILENCE_SECONDS on Cloudflare): the supervisor answers at once and sends a
# heartbeat at least every HEARTBEAT_SECONDS on a stream, so this much silence — no response head, or no byte of
# a supervisor stream while the client is reading — means the container is frozen or wedged, and the request ends
# (container_exited) instead of hanging until the platform's own limits. Read at each use: the test harness
# shortens it.
SILENCE_SECONDS = 3 * limits.HEARTBEAT_SECONDS
# The watchdog looks this many times per silence period (a frozen stream ends within SILENCE_SECONDS plus one look)
_LOOKS_PER_PERIOD = 6

# Streams that heartbeat (the supervisor's NDJSON streams), marked by the container adapter: a JS WeakMap, so a
# mark lives exactly as long as its stream.
_HEARTBEATING = js.WeakMap.new()


def expect_heartbeats(body: Any) -> None:
    """Mark a supervisor stream: a pipe from it ends with ContainerGone after SILENCE_SECONDS without a byte."""
    _HEARTBEATING.set(body, True)


def silence_message(seconds: float) -> str:
    return (
        f"the container stopped answering: nothing from its supervisor for {seconds:g} s (a healthy one sends a "
        f"heartbeat every {limits.HEARTBEAT_SECONDS:g} s); the command's outcome is unknown — reattach by request "
        "id to see it"
    )


class StreamClosed(ConnectionError):
    """The client went away; nothing more can be written."""


class _Progress:
    """What the silence watchdog sees of a pipe: chunks that went through, and the stage's controller (whose
    desiredSize says whether the client side is full — then a quiet source is backpressure, not silence)."""

    def __init__(self) -> None:
        self.chunks = 0
        self.controller: Any = None
        self.silenced = False

    def count(self, *_chunk: Any) -> int:
        # the writable strategy's size(): the one piece of Python per chunk — a counter, no timer, no await
        self.chunks += 1
        return 1

    def started(self, controller: Any) -> None:
        self.controller = controller

    def client_waiting(self) -> bool:
        """True when the stage has room: its source is asked for bytes (the client side is not full)."""
        desired = None if self.controller is None else self.controller.desiredSize
        return not is_null(desired) and desired > 0


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
        # preventAbort: if the container's stream breaks, the client's stream stays open for a terminal event.
        options = jsobj({"preventClose": True, "preventAbort": True})
        try:
            if _HEARTBEATING.has(body):
                await self._pipe_watched(body, options, SILENCE_SECONDS)
            else:
                await body.pipeTo(self._stream.writable, options)
        except JsException as exc:
            try:  # which side failed? a writable that still accepts writes means the container's side broke
                await self._get_writer().ready
            except JsException:
                raise StreamClosed("the client closed the stream") from exc
            raise ContainerGone("the container's stream ended abnormally") from exc

    async def _pipe_watched(self, body: Any, options: Any, silence: float) -> None:
        """body → a counting stage → this sink, with a watchdog that aborts the first pipe (cancelling the
        container's stream) once no chunk came for `silence` seconds while the client side had room.

        pipeTo has no timeout, and a JS transform that resets a timer per chunk is impossible here (no eval in
        workerd: only Python callbacks). So the stage's writable strategy counts chunks in its size() — one
        synchronous Python call per chunk, no await, no timer; with the stage it costs about 3 µs per chunk under
        Pyodide (4.5 µs relayed against 1.5 for a bare pipe) — and the watchdog looks at the count a few times per
        period. The stage has no transform (identity, native); its controller, taken once in start(), tells
        backpressure from silence: a client that does not read stalls the pipe too."""
        progress = _Progress()
        size = create_proxy(progress.count)
        writable_strategy = jsobj({"highWaterMark": 1})
        writable_strategy.size = size
        transformer = js.Object.new()
        transformer.start = create_once_callable(progress.started)
        stage = js.TransformStream.new(transformer, writable_strategy, jsobj({"highWaterMark": 1}))
        controller = js.AbortController.new()
        inward = body.pipeTo(stage.writable, jsobj({"signal": controller.signal}))
        outward = stage.readable.pipeTo(self._stream.writable, options)
        watchdog = asyncio.ensure_future(_watch(progress, controller, silence))
        try:
            try:
                await outward
            finally:
                watchdog.cancel()
                try:
                    await inward  # settled once outward is: the stage is closed, errored or cancelled by now
                except JsException:
                    pass
        except JsException:
            if progress.silenced:
                raise ContainerGone(silence_message(silence)) from None
            raise
        finally:
            size.destroy()  # no write reaches the stage any more

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._get_writer().close()
        except JsException:
            pass  # the client is gone already; nothing to flush

    async def abort(self) -> None:
        """Error the stream: the client's read of the body fails (the connection breaks) instead of ending."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._get_writer().abort(js.Error.new("the stream's source failed midway"))
        except JsException:
            pass  # the client is gone already


async def _watch(progress: _Progress, controller: Any, silence: float) -> None:
    step = silence / _LOOKS_PER_PERIOD
    seen = progress.chunks
    quiet = 0.0
    while True:
        await asyncio.sleep(step)
        if progress.chunks != seen or not progress.client_waiting():
            seen, quiet = progress.chunks, 0.0  # bytes came, or the client side is full: not the container's silence
            continue
        quiet += step
        if quiet >= silence - 1e-9:
            log.warning("a supervisor stream was silent for %g s; ending it", silence)
            progress.silenced = True
            controller.abort(js.Error.new(silence_message(silence)))
            return


class JsStreams:
    def open(self) -> JsSink:
        return JsSink()
