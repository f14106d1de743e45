"""A bare HTTP/1.1 client for benchmarks: one kept-alive socket, the answer parsed by httptools. It costs a few
microseconds per request, so a figure measured with it is the server's, not a Python HTTP client's (httpx adds about
0.6 ms to every round trip on this machine); the server's own client to a supervisor (standalone/supervisor_http.py)
is as lean."""

import json
import socket
import uuid

import httptools


class _Answer:
    def __init__(self) -> None:
        self.body = bytearray()
        self.done = False
        self.status = 0

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.done = True


class RawClient:
    """One kept-alive HTTP/1.1 connection; `request` returns (status, body) once the whole answer is in."""

    def __init__(self, sock: socket.socket, host: str, headers: dict[str, str]):
        self.sock = sock
        self.host = host
        self.headers = "".join(f"{k}: {v}\r\n" for k, v in headers.items())

    def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\n{self.headers}"
        if body:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.sock.sendall(head.encode() + b"\r\n" + body)
        answer = _Answer()
        parser = httptools.HttpResponseParser(answer)
        while not answer.done:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the connection closed mid-answer")
            parser.feed_data(data)
        return parser.get_status_code(), bytes(answer.body)

    def close(self) -> None:
        self.sock.close()


def exec_body(command: str = "true") -> bytes:
    return json.dumps({"request_id": uuid.uuid4().hex, "command": command}).encode()


def check_exit(status: int, body: bytes) -> None:
    """An exec answer ended with exit code 0, or RuntimeError."""
    events = [json.loads(line) for line in body.splitlines() if line]
    if status != 200 or events[-1].get("type") != "exit" or events[-1].get("exit_code") != 0:
        raise RuntimeError(f"exec failed: {status} {body[-300:]!r}")


def unix_client(path: str) -> RawClient:
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(path)
    return RawClient(sock, "sandbox", {})
