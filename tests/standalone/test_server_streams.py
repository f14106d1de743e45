"""The ASGI adapter under a real uvicorn on loopback: streamed bodies with backpressure, a client that disconnects
mid-stream stops the producer, and request bodies are read under their limit. The edge is replaced by a few lines
that hand out a real QueueSink: the adapter and the streams are what is under test."""

import asyncio
import socket

import httpx
import pytest
import uvicorn

from durable.ports import Response
from protocol.errors import ProtocolError
from standalone.server import MAX_HEADER_BYTES, FlareboxApp
from standalone.streams import QueueSink, StreamClosed

pytestmark = pytest.mark.timeout(60)


class StreamingEdge:
    """GET /stream: an endless NDJSON-ish stream written by a producer task; POST /echo: the body read under 1 KiB."""

    def __init__(self):
        self.producer_error: BaseException | None = None
        self.producer_done = asyncio.Event()
        self.written = 0

    async def handle(self, req):
        if req.path == "/echo":
            try:
                return Response(200, await req.body.read(1024))
            except ProtocolError as err:
                return Response.error(err)
        sink = QueueSink(maxsize=4)

        async def produce():
            try:
                while True:
                    await sink.write(b"x" * 4096 + b"\n")
                    self.written += 1
            except BaseException as exc:  # noqa: BLE001 - recording what stopped it is the point
                self.producer_error = exc
            finally:
                self.producer_done.set()

        asyncio.ensure_future(produce())
        return Response(200, sink.readable, {"content-type": "application/x-ndjson"})


@pytest.fixture
async def served():
    edge = StreamingEdge()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(FlareboxApp(edge), host="127.0.0.1", port=port, log_level="warning", lifespan="off", http="h11")
    )
    task = asyncio.ensure_future(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn offers no event for this
        await asyncio.sleep(0.02)
    try:
        yield edge, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


async def test_a_client_that_goes_away_stops_the_producer(served):
    edge, url = served
    async with httpx.AsyncClient() as client:
        async with client.stream("GET", url + "/stream") as response:
            assert response.status_code == 200 and "content-length" not in response.headers
            async for _chunk in response.aiter_raw():
                break  # read a little, then hang up
    await asyncio.wait_for(edge.producer_done.wait(), 5)
    assert isinstance(edge.producer_error, StreamClosed)
    stopped_at = edge.written
    await asyncio.sleep(0.3)
    assert edge.written == stopped_at


async def test_a_slow_client_holds_the_producer_back(served):
    edge, url = served
    async with httpx.AsyncClient() as client:
        async with client.stream("GET", url + "/stream") as response:
            await asyncio.sleep(0.5)  # read nothing: only the bounded queue and the socket buffers can fill
            assert not edge.producer_done.is_set()
            held = edge.written
            await asyncio.sleep(0.5)
            assert edge.written == held  # blocked, not buffering without bound
            assert held < 2000  # ~8 MB at most in socket buffers + 4 queued chunks
            await response.aclose()
    await asyncio.wait_for(edge.producer_done.wait(), 5)


async def test_bodies_are_read_under_their_limit_and_headers_are_bounded(served):
    _, url = served
    async with httpx.AsyncClient() as client:
        ok = await client.post(url + "/echo", content=b"a" * 1024)
        assert ok.status_code == 200 and ok.content == b"a" * 1024

        async def chunks():
            for _ in range(8):
                yield b"b" * 512

        too_big = await client.post(url + "/echo", content=chunks())  # chunked: no Content-Length to trust
        assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "payload_too_large"
        big_headers = await client.get(url + "/echo", headers={"x-big": "h" * (MAX_HEADER_BYTES + 1)})
        assert big_headers.status_code == 431 and big_headers.json()["error"]["code"] == "headers_too_large"
