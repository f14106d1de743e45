"""The supervisor's own HTTP/1.1 server (httpserver.py) and WebSocket (websocket.py), on a real unix socket, spoken to
byte by byte: what a client of it can rely on — answers in order on a kept connection, bodies streamed in either
framing, every caller's mistake a protocol error, a broken answer never taken for a whole one."""

import asyncio
import json
import os
import socket

import pytest

from flarebox_supervisor.httpserver import (
    MAX_HEAD_BYTES,
    Application,
    Request,
    Response,
    Server,
    StreamResponse,
    json_response,
)
from protocol.errors import ProtocolError

pytestmark = pytest.mark.timeout(30)


async def _echo(request: Request):
    body = await request.read(1024)
    return json_response({"path": request.match_info, "query": request.query, "body": body.decode()})


async def _stream(request: Request):
    response = StreamResponse(headers={"Content-Type": "text/plain"})
    await response.prepare(request)
    await response.write(b"one,")
    if "break" in request.query:
        raise RuntimeError("a failure after the head")
    await response.write_eof(b"two")
    return response


async def _slow(request: Request):
    await asyncio.sleep(0.2)
    return json_response({"slow": True})


async def _refuse(request: Request):
    raise ProtocolError("invalid_field", "no")


async def _count(request: Request):
    total = 0
    while chunk := await request.readany():
        total += len(chunk)
    return json_response({"received": total})


_SOCKETS: list = []  # the WebSockets _pty opened, for tests that look inside
_HOLD: list[asyncio.Event] = []  # ?hold=1: the handler waits on the newest before it reads anything


async def _big(request: Request):
    return Response(b"x" * (4 * 1024 * 1024))


async def _pty(request: Request):
    from flarebox_supervisor.websocket import WebSocket

    ws = WebSocket(request, 2.0)
    if not ws.ok():
        raise ProtocolError("websocket_required")
    await ws.prepare()
    _SOCKETS.append(ws)
    if "hold" in request.query:
        await _HOLD[-1].wait()
    while (message := await ws.receive()) is not None:
        if message.binary:
            await ws.send_bytes(message.data[::-1])
        elif message.data == "bye":
            await ws.close(1000)
        else:
            await ws.send_json({"text": message.data})
    return ws


@pytest.fixture
def served(tmp_path):
    """(loop, path): a Server on a unix socket, run on a loop of its own in this thread's place."""
    app = Application()
    app.add_route("POST", "/echo/{name}", _echo)
    app.add_route("GET", "/stream", _stream)
    app.add_route("GET", "/slow", _slow)
    app.add_route("GET", "/fast", _echo)
    app.add_route("GET", "/fast/deep", _echo)
    app.add_route("POST", "/refuse", _refuse)
    app.add_route("PUT", "/count", _count)
    app.add_route("GET", "/pty", _pty)
    app.add_route("GET", "/big", _big)
    path = str(tmp_path / "s.sock")
    loop = asyncio.new_event_loop()
    server = Server(app)
    loop.run_until_complete(server.start(path=path))
    try:
        yield loop, path
    finally:
        loop.run_until_complete(server.stop())
        loop.close()


def _exchange(served, data: bytes, until_closed: bool = True, wait: float = 0.5) -> bytes:
    """Send `data`, and collect what comes back until the server closes (or, else, `wait` seconds of quiet)."""
    loop, path = served

    async def talk() -> bytes:
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(data)
        got = b""
        try:
            while True:
                chunk = await asyncio.wait_for(reader.read(65536), None if until_closed else wait)
                if not chunk:
                    break
                got += chunk
        except TimeoutError:
            pass
        writer.close()
        return got

    return loop.run_until_complete(asyncio.wait_for(talk(), 20))


def _answers(raw: bytes) -> list[tuple[int, bytes]]:
    """(status, body) of each answer in `raw` (Content-Length or chunked)."""
    out = []
    while raw:
        head, _, raw = raw.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        headers = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
        if b"Content-Length" in headers:
            size = int(headers[b"Content-Length"])
            out.append((status, raw[:size]))
            raw = raw[size:]
        else:
            body = b""
            while True:
                size_line, _, raw = raw.partition(b"\r\n")
                size = int(size_line, 16)
                body, raw = body + raw[:size], raw[size + 2 :]
                if size == 0:
                    break
            out.append((status, body))
    return out


def test_kept_alive_answers_come_in_the_order_asked_even_when_the_first_is_slower(served):
    raw = _exchange(served, b"GET /slow HTTP/1.1\r\n\r\nGET /fast?x=1 HTTP/1.1\r\nConnection: close\r\n\r\n")
    (first, slow), (second, fast) = _answers(raw)
    assert (first, json.loads(slow)) == (200, {"slow": True})
    assert second == 200 and json.loads(fast)["query"] == {"x": "1"}


def test_a_chunked_body_and_a_sized_one_arrive_whole_with_the_path_decoded(served):
    chunked = b"POST /echo/a%20b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    sized = b"POST /echo/c?k=v&k=w HTTP/1.1\r\nContent-Length: 2\r\nConnection: close\r\n\r\nxy"
    (s1, b1), (s2, b2) = _answers(_exchange(served, chunked + sized))
    assert (s1, json.loads(b1)) == (200, {"path": {"name": "a b"}, "query": {}, "body": "abcde"})
    assert (s2, json.loads(b2)) == (200, {"path": {"name": "c"}, "query": {"k": "v"}, "body": "xy"})


def test_a_body_over_the_limit_is_413_and_an_unread_body_does_not_end_the_connection(served):
    big = b"POST /echo/x HTTP/1.1\r\nContent-Length: 2000\r\n\r\n" + b"z" * 2000
    refused = b"POST /refuse HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
    last = b"GET /fast HTTP/1.1\r\nConnection: close\r\n\r\n"
    answers = _answers(_exchange(served, big + refused + last))
    assert [status for status, _ in answers] == [413, 400, 200]
    assert json.loads(answers[0][1])["error"]["code"] == "payload_too_large"
    assert json.loads(answers[1][1])["error"] == {"code": "invalid_field", "message": "no"}


def test_mistakes_are_protocol_errors(served):
    cases = {
        b"GET /nope HTTP/1.1\r\n\r\n": (404, "not_found"),
        b"GET /fast%2Fdeep HTTP/1.1\r\n\r\n": (404, "not_found"),  # an encoded slash separates nothing
        b"DELETE /fast HTTP/1.1\r\n\r\n": (405, "method_not_allowed"),
        b"HEAD /fast HTTP/1.1\r\n\r\n": (405, "method_not_allowed"),  # no HEAD: a GET may be a whole export
        b"GET /pty HTTP/1.1\r\n\r\n": (426, "websocket_required"),
        # an upgrade whose head websockets will not read (a header line over its 8 KiB): no handshake, no failure
        b"GET /pty HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nX-Long: " + b"y" * 9000 + b"\r\n\r\n": (
            426,
            "websocket_required",
        ),
        b"GET /fast?bad=%ff HTTP/1.1\r\n\r\n": (400, "invalid_query"),
        b"NOT HTTP\r\n\r\n": (400, "malformed_request"),
        b"GET /fast HTTP/1.1\r\nX-Big: " + b"y" * MAX_HEAD_BYTES + b"\r\n\r\n": (431, "headers_too_large"),
    }
    for request, (status, code) in cases.items():
        (got, body), *_ = _answers(_exchange(served, request, until_closed=False))
        assert (got, json.loads(body)["error"]["code"]) == (status, code), request[:40]


def test_a_streamed_answer_is_chunked_and_one_that_breaks_off_has_no_end(served):
    whole = _exchange(served, b"GET /stream HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert _answers(whole) == [(200, b"one,two")]
    assert whole.endswith(b"3\r\ntwo\r\n0\r\n\r\n")  # the last piece and the end in one write
    broken = _exchange(served, b"GET /stream?break=1 HTTP/1.1\r\n\r\n")  # kept alive, yet closed
    assert broken.endswith(b"4\r\none,\r\n") and b"0\r\n\r\n" not in broken


def test_expect_continue_is_answered_when_the_body_is_read(served):
    loop, path = served

    async def talk():
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(b"PUT /count HTTP/1.1\r\nContent-Length: 4\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n")
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"abcd")
        rest = await reader.read()
        writer.close()
        return rest

    assert _answers(loop.run_until_complete(talk())) == [(200, b'{"received": 4}')]


def test_reading_pauses_while_the_handler_is_behind_and_every_byte_arrives(served):
    loop, path = served
    size = 8 * 1024 * 1024

    async def talk():
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(path)
        sock.setblocking(False)
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        writer.write(b"PUT /count HTTP/1.1\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % size)
        for _ in range(size // 65536):
            writer.write(os.urandom(1024) * 64)
            await writer.drain()
        rest = await reader.read()
        writer.close()
        return rest

    assert _answers(loop.run_until_complete(talk())) == [(200, b'{"received": %d}' % size)]


def _ws_handshake() -> bytes:
    return (
        b"GET /pty HTTP/1.1\r\nHost: sv\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )


def _frame(opcode: int, payload: bytes, fin: bool = True) -> bytes:
    """A masked client frame (payloads under 126 bytes)."""
    mask = b"\x01\x02\x03\x04"
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return bytes([(0x80 if fin else 0) | opcode, 0x80 | len(payload)]) + mask + masked


def _server_frames(raw: bytes) -> list[tuple[int, bytes]]:
    frames = []
    while raw:
        opcode, size = raw[0] & 0x0F, raw[1] & 0x7F
        frames.append((opcode, raw[2 : 2 + size]))
        raw = raw[2 + size :]
    return frames


def test_a_websocket_answers_pings_joins_fragments_and_closes_with_a_handshake(served):
    loop, path = served

    async def talk() -> tuple[bytes, list[tuple[int, bytes]], list[tuple[int, bytes]]]:
        reader, writer = await asyncio.open_unix_connection(path)
        # sent with the handshake: the frames after its head must reach the WebSocket, not the HTTP parser
        first = _frame(0x9, b"are you there") + _frame(0x2, b"ab", fin=False) + _frame(0x0, b"cd") + _frame(0x1, b"hi")
        writer.write(_ws_handshake() + first)
        head = await reader.readuntil(b"\r\n\r\n")
        replies = [await _read_frame(reader) for _ in range(3)]
        writer.write(_frame(0x1, b"bye"))  # the handler closes: its close comes, then the end once ours answers it
        closing = [await _read_frame(reader)]
        writer.write(_frame(0x8, b"\x03\xe8"))
        assert await reader.read() == b""
        writer.close()
        return head, replies, closing

    head, replies, closing = loop.run_until_complete(asyncio.wait_for(talk(), 20))
    assert head.startswith(b"HTTP/1.1 101 ")
    assert b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" in head
    assert replies == [(0xA, b"are you there"), (0x2, b"dcba"), (0x1, b'{"text": "hi"}')]
    assert closing == [(0x8, b"\x03\xe8")]


async def _read_frame(reader) -> tuple[int, bytes]:
    first, size = await reader.readexactly(2)
    return first & 0x0F, await reader.readexactly(size & 0x7F)


def test_a_text_message_that_is_not_utf8_closes_the_websocket_with_1007(served):
    raw = _exchange(served, _ws_handshake() + _frame(0x1, b"\xff\xfe"))
    frames = _server_frames(raw.partition(b"\r\n\r\n")[2])
    assert frames and frames[-1][0] == 0x8 and frames[-1][1][:2] == (1007).to_bytes(2, "big")


def test_a_content_length_of_other_digits_is_no_length():
    from types import SimpleNamespace

    def length(value: str):
        return Request(SimpleNamespace(app=None), "PUT", b"/x", {"content-length": value}).content_length

    assert length("12") == 12
    assert length("\u00b2") is None  # latin-1's superscript two is a digit to str.isdigit, not to int()


def test_an_answer_left_unread_by_a_client_that_goes_away_leaves_no_stray_error(served):
    """A whole answer larger than the write buffer pauses writing with nobody waiting on it; the client leaving
    then must not leave an exception behind that nobody retrieves."""
    import gc

    loop, path = served
    errors = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))

    async def leave() -> None:
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(b"GET /big HTTP/1.1\r\n\r\n")
        await reader.readexactly(1000)  # the answer is under way; the rest is never read
        writer.transport.abort()
        await asyncio.sleep(0.2)

    loop.run_until_complete(leave())
    gc.collect()
    loop.run_until_complete(asyncio.sleep(0))
    assert errors == []


def test_a_websocket_stops_reading_while_its_handler_is_behind(served):
    loop, path = served
    _SOCKETS.clear()
    hold = asyncio.Event()
    _HOLD.append(hold)

    async def flood() -> bool:
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(_ws_handshake().replace(b"/pty", b"/pty?hold=1"))
        await reader.readuntil(b"\r\n\r\n")
        payload = b"k" * 60_000
        mask = b"\x00\x00\x00\x00"  # a zero mask: the payload goes as it is
        frame = bytes([0x82, 0xFE]) + len(payload).to_bytes(2, "big") + mask + payload
        for _ in range(40):  # 2.4 MB, over the 1 MiB the WebSocket queues
            writer.write(frame)
        await asyncio.sleep(0.5)
        paused = _SOCKETS[0]._paused
        writer.transport.abort()
        hold.set()
        return paused

    assert loop.run_until_complete(asyncio.wait_for(flood(), 20)) is True


def test_a_kept_connection_closes_only_after_keep_alive_seconds_of_idleness(tmp_path, monkeypatch):
    """Idleness counts from the last answer: a request that takes longer than the keep-alive is not cut, a pause
    shorter than it keeps the connection, and a longer one closes it."""
    from flarebox_supervisor import httpserver

    keep = 0.4
    monkeypatch.setattr(httpserver, "KEEP_ALIVE_SECONDS", keep)

    async def wait(request: Request):
        await asyncio.sleep(float(request.query["s"]))
        return json_response({"waited": True})

    app = Application()
    app.add_route("GET", "/wait", wait)
    path = str(tmp_path / "s.sock")

    async def scenario() -> float:
        server = Server(app)
        await server.start(path=path)
        try:
            reader, writer = await asyncio.open_unix_connection(path)
            for seconds, pause in ((2.5 * keep, 0.5 * keep), (0, 0)):
                writer.write(b"GET /wait?s=%g HTTP/1.1\r\n\r\n" % seconds)
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                assert head.startswith(b"HTTP/1.1 200")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await asyncio.wait_for(reader.readexactly(length), 10)
                answered = asyncio.get_running_loop().time()
                await asyncio.sleep(pause)
            assert await asyncio.wait_for(reader.read(1), 10) == b""  # the server closed it
            idle = asyncio.get_running_loop().time() - answered
            writer.close()
            return idle
        finally:
            await server.stop()

    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(scenario()) >= keep * 0.95
    finally:
        loop.close()
