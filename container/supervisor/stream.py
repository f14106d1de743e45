"""Turn a journal into NDJSON: output frames from an offset, heartbeats during silence, then the terminal event.

Everything available is sent at once, cut into frames of at most MAX_OUTPUT_FRAME_CHARS code points, and written
as one buffer per wake-up: coalescing keeps per-event overhead low when a command prints fast.
"""

import asyncio
import time
from collections.abc import AsyncIterator
from json.encoder import encode_basestring

from flarebox_supervisor.journal import Journal
from protocol import limits
from protocol.events import encode_event, heartbeat_event

_BATCH_CHARS = 64 * limits.MAX_OUTPUT_FRAME_CHARS  # most code points encoded per wake-up (bounds one write)
# While a command runs, a frame that is not yet full waits this long for more output: a fast printer then costs one
# event per 16 Ki code points instead of one per pipe read; a slow one sees its output at most this much later.
COALESCE_SECONDS = 0.005


class Final(bytes):
    """The last chunk a follow yields (the terminal event): the HTTP layer sends it with the end of the body."""


def encode_frames(text: str, offset: int) -> bytes:
    """Output events for `text`, byte-identical to encode_event(output_event(...)) but without building a dict and
    running the general encoder per frame (this is the hot path when a command prints fast)."""
    step = limits.MAX_OUTPUT_FRAME_CHARS
    return "".join(
        f'{{"type":"output","data":{encode_basestring(text[i : i + step])},"offset":{offset + i}}}\n'
        for i in range(0, len(text), step)
    ).encode("utf-8")


async def follow(journal: Journal, offset: int, heartbeat_seconds: float) -> AsyncIterator[bytes]:
    position = offset
    while True:
        changed = journal.changed()
        position = max(position, journal.first)  # a service's log (a ring) may have dropped what was not sent yet
        if journal.size > position:
            if journal.terminal is None and journal.size - position < limits.MAX_OUTPUT_FRAME_CHARS:
                await _fill(journal, position + limits.MAX_OUTPUT_FRAME_CHARS)
                position = max(position, journal.first)
            text = journal.read(position, _BATCH_CHARS)
            yield encode_frames(text, position)
            position += len(text)
            continue
        if journal.terminal is not None:
            yield Final(encode_event(journal.terminal))
            return
        try:
            async with asyncio.timeout(heartbeat_seconds):
                await changed.wait()
        except TimeoutError:
            yield encode_event(heartbeat_event())


async def _fill(journal: Journal, size: int) -> None:
    """Wait up to COALESCE_SECONDS for the journal to reach `size` code points or to end."""
    deadline = time.monotonic() + COALESCE_SECONDS
    while journal.size < size and journal.terminal is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        try:
            async with asyncio.timeout(remaining):
                await journal.changed().wait()
        except TimeoutError:
            return
