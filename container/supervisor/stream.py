"""Turn a journal into NDJSON: output frames from an offset, heartbeats during silence, then the terminal event.

Everything available is sent at once, cut into frames of at most MAX_OUTPUT_FRAME_CHARS code points, and written
as one buffer per wake-up: coalescing keeps per-event overhead low when a command prints fast.
"""

import asyncio
from collections.abc import AsyncIterator

from flarebox_supervisor.journal import Journal
from protocol import limits
from protocol.events import encode_event, heartbeat_event, output_event

_BATCH_CHARS = 64 * limits.MAX_OUTPUT_FRAME_CHARS  # most code points encoded per wake-up (bounds one write)


def encode_frames(text: str, offset: int) -> bytes:
    step = limits.MAX_OUTPUT_FRAME_CHARS
    return b"".join(encode_event(output_event(text[i : i + step], offset + i)) for i in range(0, len(text), step))


async def follow(journal: Journal, offset: int, heartbeat_seconds: float) -> AsyncIterator[bytes]:
    position = offset
    while True:
        changed = journal.changed()
        if journal.size > position:
            text = journal.read(position, _BATCH_CHARS)
            yield encode_frames(text, position)
            position += len(text)
            continue
        if journal.terminal is not None:
            yield encode_event(journal.terminal)
            return
        try:
            await asyncio.wait_for(changed.wait(), heartbeat_seconds)
        except TimeoutError:
            yield encode_event(heartbeat_event())
