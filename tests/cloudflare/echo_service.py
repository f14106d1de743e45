"""A service for the proxy tests, run inside the harness's sandbox by the supervisor: `python echo_service.py PORT`.

Stdlib only (it runs on the sandbox's interpreter). Answers on 127.0.0.1:PORT:
  /env/NAME              {"name", "value"}: the service's environment variable (secrets reach it there)
  /sse?n=N&gap_ms=G      text/event-stream: N events G ms apart, each {"i", "t"} (t: time.time() when written)
  /status/NNN            that status, no body
  /hang                  reads the request and never answers
  /break                 a chunked answer that breaks off after its first chunk (the connection is dropped)
  anything else          JSON echo: {"method", "target", "headers": [[name, value], ...], "body_bytes",
                         "body_sha256"}, with two Set-Cookie headers and a forged x-flarebox-* header.
Request bodies may be chunked (the proxy streams them without a length).
"""

import hashlib
import json
import os
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # into the service's log
        sys.stderr.write("echo: " + (fmt % args) + "\n")

    def _body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("content-length") or 0))

    def _send(self, status: int, body: bytes, content_type: str, extra: list[tuple[str, str]] = ()) -> None:
        self.send_response(status)
        for name, value in extra:
            self.send_header(name, value)
        if status not in (204, 304):
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and status not in (204, 304):
            self.wfile.write(body)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _sse(self, query: dict) -> None:
        n = int(query.get("n", ["10"])[0])
        gap = int(query.get("gap_ms", ["20"])[0]) / 1000
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        for i in range(n):
            self._chunk(f"data: {json.dumps({'i': i, 't': time.time()})}\n\n".encode())
            time.sleep(gap)
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _any(self) -> None:
        body = self._body()
        url = urlsplit(self.path)
        if url.path.startswith("/env/"):
            name = url.path[len("/env/") :]
            answer = json.dumps({"name": name, "value": os.environ.get(name)}).encode()
            return self._send(200, answer, "application/json")
        if url.path == "/sse":
            return self._sse(parse_qs(url.query))
        if url.path == "/hang":
            time.sleep(3600)
        if url.path == "/break":
            self.send_response(200)
            self.send_header("content-type", "text/plain")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            self._chunk(b"the first part, and then nothing")
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)  # no last chunk: the body is incomplete
            return None
        if url.path.startswith("/status/"):
            return self._send(int(url.path[len("/status/") :]), b"", "text/plain")
        echo = {
            "method": self.command,
            "target": self.path,
            "headers": [[k.lower(), v] for k, v in self.headers.items()],
            "body_bytes": len(body),
            "body_sha256": hashlib.sha256(body).hexdigest(),
        }
        cookies = [("set-cookie", "a=1; Path=/"), ("set-cookie", "b=2; Expires=Wed, 21 Oct 2037 07:28:00 GMT")]
        extra = [*cookies, ("x-flarebox-proxy-error", "forged"), ("x-echo", "yes")]
        self._send(200, json.dumps(echo).encode(), "application/json", extra)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = do_HEAD = _any


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.daemon_threads = True
    print(f"echo service on 127.0.0.1:{sys.argv[1]}", flush=True)
    server.serve_forever()
