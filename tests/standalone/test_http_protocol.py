"""The server's HTTP protocol (uvicorn's httptools one, adjusted) driven byte by byte: what it does with a request
body the app has not asked for yet. A socket would hide it (the kernel buffers megabytes on loopback), so the
protocol gets a transport that records what is asked of it."""

import asyncio

import pytest
import uvicorn
from uvicorn.server import ServerState

from standalone.http_protocol import READ_AHEAD_BYTES, FlareboxHttpToolsProtocol

pytestmark = pytest.mark.timeout(30)


class RecordingTransport(asyncio.Transport):
    def __init__(self):
        super().__init__()
        self.reading = True
        self.closing = False
        self.written = bytearray()

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8080)}.get(name, default)

    def set_write_buffer_limits(self, high=None, low=None):
        pass

    def get_write_buffer_size(self):
        return 0

    def pause_reading(self):
        self.reading = False

    def resume_reading(self):
        self.reading = True

    def is_closing(self):
        return self.closing

    def write(self, data):
        self.written += data

    def close(self):
        self.closing = True


async def test_a_bulk_body_is_read_a_megabyte_ahead_of_the_app_and_no_further():
    """A file PUT crosses the server in pieces of up to READ_AHEAD_BYTES (stock uvicorn pauses past 64 KiB, so a
    100 MiB body took thousands of pause/resume rounds); past that, reading pauses until the app takes it."""
    app_started = asyncio.Event()
    release = asyncio.Event()

    async def app(scope, receive, send):
        app_started.set()
        await release.wait()

    config = uvicorn.Config(app, http=FlareboxHttpToolsProtocol, lifespan="off", log_level="warning")
    protocol = FlareboxHttpToolsProtocol(config, ServerState(), app_state={})
    transport = RecordingTransport()
    protocol.connection_made(transport)
    try:
        protocol.data_received(b"PUT /f HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % (2 * READ_AHEAD_BYTES))
        await asyncio.wait_for(app_started.wait(), 5)
        for _ in range(READ_AHEAD_BYTES // 65536):
            protocol.data_received(b"x" * 65536)
        assert transport.reading  # a whole megabyte held for the app, still reading
        protocol.data_received(b"x")
        assert not transport.reading  # one byte more: paused until the app reads
    finally:
        release.set()
        protocol.connection_lost(None)
        await asyncio.sleep(0)


async def test_a_body_piece_the_app_is_waiting_for_reaches_it_without_a_copy_and_queued_pieces_in_order():
    """Each piece llhttp hands over is a new bytes object; uvicorn appended every one to a bytearray and copied that
    again for the app (two copies of every byte of a 100 MiB PUT). A piece the app keeps up with is now handed over
    as it is; pieces that queue behind a slow app are joined, in order."""
    started = asyncio.Event()
    release = asyncio.Event()
    receives = []

    async def app(scope, receive, send):
        receives.append(receive)
        started.set()
        await release.wait()

    config = uvicorn.Config(app, http=FlareboxHttpToolsProtocol, lifespan="off", log_level="warning")
    protocol = FlareboxHttpToolsProtocol(config, ServerState(), app_state={})
    protocol.connection_made(RecordingTransport())
    try:
        protocol.data_received(b"PUT /f HTTP/1.1\r\nhost: x\r\ncontent-length: 12\r\n\r\n")
        await asyncio.wait_for(started.wait(), 5)
        receive = receives[0]
        alone, queued, behind, last = b"a" * 3, b"b" * 3, b"c" * 3, b"d" * 3
        protocol.on_body(alone)
        first = await asyncio.wait_for(receive(), 5)
        assert first["body"] is alone and first["more_body"]
        protocol.on_body(queued)
        protocol.on_body(behind)
        second = await asyncio.wait_for(receive(), 5)
        assert second["body"] == queued + behind and isinstance(second["body"], bytes)
        protocol.on_body(last)
        protocol.on_message_complete()
        third = await asyncio.wait_for(receive(), 5)
        assert third["body"] is last and third["more_body"] is False
    finally:
        release.set()
        protocol.connection_lost(None)
        await asyncio.sleep(0)
