"""The stream patterns the Python glue relies on, checked on the real workerd binary (node_modules/.bin/workerd),
offline: a small JS Worker + Durable Object (tests/workerd/worker/main.js, config tests/workerd/patterns.capnp)
behind a listening socket the test hands to workerd, and a Python HTTP server on 127.0.0.1 standing in for the
container (it records every request it gets: headers, framing, body).

What workerd did (workerd 2026-11-17, npm workerd 1.20261117.1), each pinned by a test below:

1. Shared boot, inside one Durable Object: request B's response stream is written by the boot that request A
   started, and B, after awaiting A's boot, reads a response body the boot fetched. All requests to one object
   share one I/O context. The same code in a stateless Worker (the control) still writes B's stream (a JS-backed
   TransformStream is not bound to a request) and B still awaits A's promise, but B's read of the boot's fetched
   body is refused: "Cannot perform I/O on behalf of a different request" — so the object test would fail if the
   object's requests did not share one I/O context.
2. Alarm: the alarm handler writes and closes the TransformStream whose readable an earlier request returned.
3. pipeTo: status lines written first, then an upstream's chunked body piped into the TransformStream's writable
   with preventClose, then a last line and close — the client gets all of it, in order.
4. FixedLengthStream: a request body of unknown length (the client sent it chunked; the object sees no
   content-length) piped through FixedLengthStream(n) reaches the upstream with `content-length: n` and no
   transfer-encoding. A body longer than n errors the pipe ("Attempt to write too many bytes through a
   FixedLengthStream"); a shorter one never arrives complete (workerd cuts the upstream connection and the fetch
   fails with "Network connection lost").
5. Content-Length pass-through (defect 1 of issue 16): a body of unknown length sent with an explicit
   `content-length` header goes out chunked — workerd drops the header (it is not an error, not even a warning),
   whether or not the declared length is right. A body whose length is known (the client sent content-length)
   keeps it across every hop, Worker → object → upstream, with no header set by the code: that is the only reason
   uploads carry a length today.
"""

import asyncio
import hashlib
import json
import os
import socket
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

pytestmark = pytest.mark.timeout(60)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
WORKERD = REPO / "node_modules" / ".bin" / "workerd"
CONFIG = HERE / "patterns.capnp"
READY_SECONDS = 20
TIMEOUT = httpx.Timeout(10)


class Upstream(BaseHTTPRequestHandler):
    """The container's stand-in. PUT /record answers (and keeps) what it received; GET /stream?chunks=N streams N
    lines, chunked, 20 ms apart."""

    protocol_version = "HTTP/1.1"
    records: list[dict]  # set on the subclass the fixture makes

    def log_message(self, *args) -> None:
        pass

    def _read_body(self) -> tuple[bytes, bool]:
        """The body and whether it was complete (a cut connection leaves it short)."""
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            data = b""
            while True:
                line = self.rfile.readline()
                if not line:
                    return data, False
                size = int(line.split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return data, True
                data += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("content-length") or 0)
        data = self.rfile.read(length)
        return data, len(data) == length

    def do_PUT(self) -> None:
        body, complete = self._read_body()
        record = {
            "headers": [[k.lower(), v] for k, v in self.headers.items()],
            "body_len": len(body),
            "sha256": hashlib.sha256(body).hexdigest(),
            "complete": complete,
        }
        self.records.append(record)
        out = json.dumps(record).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def do_GET(self) -> None:
        chunks = int(parse_qs(urlsplit(self.path).query).get("chunks", ["3"])[0])
        self.send_response(200)
        self.send_header("content-type", "text/plain")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for i in range(chunks):
            data = f"chunk {i}\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
            time.sleep(0.02)
        self.wfile.write(b"0\r\n\r\n")


class Runtime:
    def __init__(self, base: str, records: list[dict]):
        self.base = base
        self.records = records

    def url(self, route: str) -> str:
        return f"{self.base}{route}"

    def object_url(self, op: str) -> str:
        """A route of a fresh Durable Object (a new name per call)."""
        return self.url(f"/do/{uuid.uuid4().hex}/{op}")


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    if not WORKERD.exists():
        pytest.skip("node_modules/.bin/workerd is missing (run `scripts/setup.sh dev`: npm ci)")
    tmp = tmp_path_factory.mktemp("workerd")
    records: list[dict] = []
    handler = type("RecordingUpstream", (Upstream,), {"records": records})
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    upstream.daemon_threads = True
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    # workerd listens on a socket the test opened: a free loopback port, no race for it
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    fd = listener.fileno()
    env = {**os.environ, "FLAREBOX_UPSTREAM": f"http://127.0.0.1:{upstream.server_address[1]}"}
    log_path = tmp / "workerd.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(WORKERD), "serve", str(CONFIG), "--socket-fd", f"http={fd}"],
            cwd=tmp,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            pass_fds=(fd,),
        )
    listener.close()  # workerd holds its own copy
    try:
        _wait_ready(proc, f"http://127.0.0.1:{port}/health", log_path)
        yield Runtime(f"http://127.0.0.1:{port}", records)
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        upstream.shutdown()
        upstream.server_close()


def _wait_ready(proc: subprocess.Popen, health: str, log_path: Path) -> None:
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"workerd exited with {proc.returncode}:\n{log_path.read_text(errors='replace')}")
        try:
            if httpx.get(health, timeout=1).text == "ok":
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"workerd did not answer within {READY_SECONDS} s:\n{log_path.read_text(errors='replace')}")


async def _two_requests_sharing_a_boot(first_url: str, second_url: str) -> tuple[list[str], list[str]]:
    """A starts the boot; B arrives while it waits and joins it. Both streams are read to their end."""
    async with httpx.AsyncClient(timeout=TIMEOUT) as client:
        async with client.stream("GET", first_url) as a:
            assert a.status_code == 200  # A's handler returned its stream before the boot finished
            async with client.stream("GET", second_url) as b:
                assert b.status_code == 200
                body_a, body_b = await asyncio.gather(a.aread(), b.aread())
    return body_a.decode().splitlines(), body_b.decode().splitlines()


def _chunked(data: bytes, parts: int):
    """A request body of unknown length: httpx sends an iterator chunked, with no content-length."""
    step = -(-len(data) // parts)
    for i in range(0, len(data), step):
        yield data[i : i + step]
        time.sleep(0.01)


def _headers(record: dict) -> dict[str, str]:
    return dict(record["headers"])


async def test_a_boot_started_by_one_request_writes_another_requests_stream(runtime):
    name = uuid.uuid4().hex
    lines_a, lines_b = await _two_requests_sharing_a_boot(
        runtime.url(f"/do/{name}/boot?id=A"), runtime.url(f"/do/{name}/boot?id=B")
    )
    assert lines_a == [
        "A: booting (boot started by A)",
        "A: ready (boot started by A)",
        "A: continued after the boot by A; boots=1",
    ]
    # B's stream: written by A's boot, then by B's own continuation, which uses the response the boot fetched
    assert lines_b == [
        "B: booting (boot started by A)",
        "B: ready (boot started by A)",
        "B: continued after the boot by A; boots=1",
        "B: read the boot's upstream body: " + json.dumps("chunk 0\nchunk 1\n"),
    ]


async def test_control_a_stateless_worker_refuses_the_shared_boots_io(runtime):
    """The same code outside a Durable Object: each request has its own I/O context; B's stream is still written by
    A's boot (a JS-backed TransformStream is no I/O object), but B may not read the body A's boot fetched. This is
    what the object test above would see if an object's requests did not share one."""
    round_ = uuid.uuid4().hex
    lines_a, lines_b = await _two_requests_sharing_a_boot(
        runtime.url(f"/stateless/boot?round={round_}&id=A"), runtime.url(f"/stateless/boot?round={round_}&id=B")
    )
    assert lines_a[-1] == "A: continued after the boot by A; boots=1"
    # B's stream is still written by A's boot and B still awaits it (a plain JS TransformStream and promise)...
    assert lines_b[:3] == [
        "B: booting (boot started by A)",
        "B: ready (boot started by A)",
        "B: continued after the boot by A; boots=1",
    ]
    # ...but the I/O object A's boot made (a fetched body) is refused to B
    assert len(lines_b) == 4 and lines_b[3].startswith("B: failed after the boot:"), lines_b
    assert "Cannot perform I/O on behalf of a different request" in lines_b[3]


def test_an_alarm_writes_and_closes_the_stream_a_request_returned(runtime):
    started = time.monotonic()
    with httpx.stream("GET", runtime.object_url("alarm"), timeout=TIMEOUT) as resp:
        assert resp.status_code == 200
        headers_at = time.monotonic() - started
        body = resp.read().decode()
    ended_at = time.monotonic() - started
    assert body == "request: alarm set\nalarm 1: written by the alarm handler\n"
    # the request returned first; the alarm (set 200 ms ahead) wrote the rest and ended the stream later
    assert ended_at >= 0.15 and ended_at > headers_at


def test_pipe_to_into_a_transform_stream_returned_as_the_response(runtime):
    with httpx.stream("GET", runtime.object_url("pipe"), timeout=TIMEOUT) as resp:
        assert resp.status_code == 200
        assert "content-length" not in resp.headers  # a stream, not a buffered body
        body = resp.read().decode()
    assert body == "status: starting\n" + "".join(f"chunk {i}\n" for i in range(5)) + "status: piped\n"


def test_a_fixed_length_stream_gives_a_body_of_unknown_length_its_length(runtime):
    data = os.urandom(300_000)
    resp = httpx.put(runtime.object_url(f"fixed?n={len(data)}"), content=_chunked(data, 5), timeout=TIMEOUT)
    answer = resp.json()
    assert answer["objectSawContentLength"] is None  # the length really was unknown on the object's side
    assert answer["pipe"] == "ok"
    upstream = answer["upstream"]
    headers = _headers(upstream)
    assert headers.get("content-length") == str(len(data))
    assert "transfer-encoding" not in headers  # not chunked
    assert upstream["body_len"] == len(data) and upstream["sha256"] == hashlib.sha256(data).hexdigest()


def test_a_fixed_length_stream_refuses_a_body_of_another_length(runtime):
    data = b"x" * 1000
    longer = httpx.put(runtime.object_url("fixed?n=999"), content=_chunked(data, 2), timeout=TIMEOUT).json()
    assert "too many bytes" in longer["pipe"]
    assert "error" in longer["upstream"]
    shorter = httpx.put(runtime.object_url("fixed?n=1001"), content=_chunked(data, 2), timeout=TIMEOUT).json()
    assert "error" in shorter["upstream"]
    # neither reached the upstream as a complete request
    assert not [r for r in runtime.records if _headers(r).get("content-length") in ("999", "1001") and r["complete"]]


@pytest.mark.parametrize("declared", ["exact", "wrong"])
def test_an_explicit_content_length_on_a_body_of_unknown_length_is_dropped(runtime, declared):
    """Defect 1 of issue 16: setting `content-length` does not give a stream a length. workerd sends the body
    chunked and drops the header — with the right length as with a wrong one, and without an error."""
    data = os.urandom(50_000)
    length = len(data) if declared == "exact" else len(data) - 1
    resp = httpx.put(
        runtime.object_url("passthrough"),
        content=_chunked(data, 4),
        headers={"x-declared-length": str(length)},
        timeout=TIMEOUT,
    )
    answer = resp.json()
    assert answer["objectSawContentLength"] is None
    upstream = answer["upstream"]
    headers = _headers(upstream)
    assert "content-length" not in headers
    assert headers.get("transfer-encoding") == "chunked"
    assert upstream["body_len"] == len(data) and upstream["sha256"] == hashlib.sha256(data).hexdigest()


def test_a_known_length_carries_through_every_hop(runtime):
    """What uploads rely on today: the client's own content-length makes the body's length known, and workerd keeps
    it from the Worker to the object and on to the upstream, with no header set by the code."""
    data = os.urandom(50_000)
    answer = httpx.put(runtime.object_url("passthrough"), content=data, timeout=TIMEOUT).json()
    assert answer["objectSawContentLength"] == str(len(data))
    headers = _headers(answer["upstream"])
    assert headers.get("content-length") == str(len(data))
    assert "transfer-encoding" not in headers
    assert answer["upstream"]["sha256"] == hashlib.sha256(data).hexdigest()
