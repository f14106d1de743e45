"""A real `flarebox serve` against clients that trickle (issue 17): a request head must be whole within
FLAREBOX_HEAD_TIMEOUT_SECONDS and a body may pause at most FLAREBOX_BODY_TIMEOUT_SECONDS, else 408 request_timeout
and the connection is closed — while every other client is served as usual. Short timeouts keep this fast."""

import contextlib
import json
import socket
import threading
import time

import httpx
import pytest
from e2e import TOKEN, serving, ws_url

pytestmark = pytest.mark.timeout(90)

HEAD, BODY = 2.0, 2.0


@pytest.fixture(scope="module")
def server():
    with serving({"FLAREBOX_HEAD_TIMEOUT_SECONDS": str(HEAD), "FLAREBOX_BODY_TIMEOUT_SECONDS": str(BODY)}) as proc:
        yield proc


def _connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=HEAD + BODY + 10)


def _answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _timeout_code(answer: bytes) -> tuple[int, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower(), head
    return int(head[9:12]), json.loads(body)["error"]["code"]


def _trickle(sock: socket.socket, data: bytes, every: float) -> None:
    for i in range(len(data)):
        try:
            sock.send(data[i : i + 1])
        except OSError:
            return  # the server gave up on us, as it should
        time.sleep(every)


def _health_ok(server) -> bool:
    return httpx.get(server.url + "/v1/health", headers=server.headers(), timeout=5).status_code == 200


def test_a_trickled_head_is_408_and_others_are_served(server):
    head = f"GET /v1/health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n" + "X-Pad: " + "a" * 200
    with _connect(server) as slow:
        started = time.monotonic()
        slow.sendall(b"GET /v1/health HTTP/1.1\r\n")  # the rest one byte every 0.2 s: never done within HEAD
        sender = threading.Thread(target=_trickle, args=(slow, head.encode()[26:], 0.2), daemon=True)
        sender.start()
        assert _health_ok(server)  # meanwhile the server answers others at once
        answer = _answer(slow)
        waited = time.monotonic() - started
        with contextlib.suppress(OSError):  # the trickle's next byte may have met the closed connection (a reset)
            slow.shutdown(socket.SHUT_RDWR)
        sender.join()
    assert _timeout_code(answer) == (408, "request_timeout")
    assert HEAD - 0.5 <= waited <= HEAD + 3, waited


def test_a_silent_connection_is_closed(server):
    with _connect(server) as idle:
        started = time.monotonic()
        assert _answer(idle) == b""  # nothing asked, nothing answered: just closed
        assert HEAD - 0.5 <= time.monotonic() - started <= HEAD + 3


def test_a_stalled_body_is_408(server):
    body = b'{"persistent": true}'
    head = (
        f"PUT {ws_url('slow', 'body')} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with _connect(server) as slow:
        slow.sendall(head + body[:5])  # then nothing
        started = time.monotonic()
        assert _health_ok(server)
        answer = _answer(slow)
        waited = time.monotonic() - started
    assert _timeout_code(answer) == (408, "request_timeout")
    assert BODY - 0.5 <= waited <= BODY + 3, waited
    # the workspace was never created from half a body
    assert httpx.get(server.url + ws_url("slow", "body"), headers=server.headers()).status_code == 404


def test_a_slow_but_steady_body_is_fine(server):
    """The body limit is on silence, not on the total: a byte every half second for longer than BODY is served."""
    body = b'{"persistent": true' + b" " * 8 + b"}"
    head = (
        f"PUT {ws_url('slow', 'steady')} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with _connect(server) as steady:
        steady.sendall(head + body[:-8])
        _trickle(steady, body[-8:], BODY / 4)  # 8 × 0.5 s = 4 s > BODY
        answer = _answer(steady)
    assert answer.startswith(b"HTTP/1.1 201"), answer[:200]
