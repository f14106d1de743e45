"""Writing an exec stream: NDJSON events into a StreamSink, heartbeats while the workspace writes nothing, and
the supervisor's own stream piped through untouched.

A client that went away must not break the workspace: after the first failed write the writer goes quiet.
"""

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from durable.ports import NDJSON_TYPE, Clock, ContainerGone, Response, Streams, StreamSink
from protocol import limits
from protocol.errors import ProtocolError
from protocol.events import encode_event, error_event, heartbeat_event

log = logging.getLogger("flarebox.relay")


class EventWriter:
    def __init__(self, sink: StreamSink, clock: Clock):
        self._sink = sink
        self._clock = clock
        self._last_ms = clock.now_ms()
        self._beat: asyncio.Task | None = None
        self.broken = False

    @property
    def readable(self) -> Any:
        """The client's end of the stream, for the Response body."""
        return self._sink.readable

    async def event(self, event: dict) -> None:
        if self.broken:
            return
        self._last_ms = self._clock.now_ms()
        try:
            await self._sink.write(encode_event(event))
        except Exception:  # the reader is gone; the rest of the work still finishes
            self.broken = True
            log.debug("exec stream reader went away", exc_info=True)

    async def pipe(self, body: Any) -> None:
        """Relay a supervisor stream. Raises ContainerGone when it ends abnormally."""
        await self._sink.pipe_from(body)

    def start_heartbeat(self) -> None:
        if self._beat is None:
            self._beat = asyncio.ensure_future(self._heartbeats())

    async def stop_heartbeat(self) -> None:
        beat, self._beat = self._beat, None
        if beat is not None:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat

    async def _heartbeats(self) -> None:
        period_ms = limits.HEARTBEAT_SECONDS * 1000
        while not self.broken:
            wait_ms = self._last_ms + period_ms - self._clock.now_ms()
            if wait_ms > 0:
                await self._clock.sleep(wait_ms / 1000)
            else:
                await self.event(heartbeat_event())

    async def close(self) -> None:
        await self.stop_heartbeat()
        try:
            await self._sink.close()
        except Exception:
            log.debug("closing an exec stream failed", exc_info=True)


class InFlight:
    """Work the idle alarm must not cut, counted while it runs (`with in_flight:`): exec and reattach streams from
    boot to their last byte, file transfers from boot to the supervisor's answer. Around a command (its boot, the
    tail of its stream) the supervisor counts no running command, so the workspace counts these itself."""

    def __init__(self) -> None:
        self.count = 0

    def __enter__(self) -> None:
        self.count += 1

    def __exit__(self, *exc_info: object) -> None:
        self.count -= 1


def stream_response(streams: Streams, clock: Clock, relay: Callable[[EventWriter], Awaitable[None]]) -> Response:
    """A streamed NDJSON response whose events `relay` writes in a task that outlives the request."""
    writer = EventWriter(streams.open(), clock)
    clock.spawn(relay(writer))
    return Response(200, writer.readable, {"content-type": NDJSON_TYPE, "cache-control": "no-store"})


@contextlib.asynccontextmanager
async def relaying(writer: EventWriter, in_flight: InFlight, what: str) -> AsyncIterator[None]:
    """A stream being relayed: in flight while it lasts, and a failure becomes its terminal event."""
    with in_flight:
        try:
            yield
        except ProtocolError as err:
            await writer.event(error_event(err.code, err.message))
        except ContainerGone as gone:
            await writer.event(error_event("container_exited", str(gone) or None))
        except ConnectionError:  # the client went away mid-stream (both runtimes' StreamClosed): nobody to tell
            log.debug("%s: the client left", what)
        except Exception:
            log.exception("%s failed", what)
            await writer.event(error_event("internal_error"))
