"""A small HTTP service the end-to-end tests run inside a sandbox: `python3 service_app.py PORT`.

/health           200 ok
/echo             the request as JSON: method, path, query, headers, body length and sha256
/env?name=N       the value of environment variable N (404 when unset)
/sse?n=N&ms=M     N server-sent events M ms apart, each carrying the time it was sent
/big?bytes=N      N bytes (a repeating pattern)
/forever          an endless stream; when a write fails the service records it in /tmp/closed-<port>
Stdlib only: the sandbox has the host's Python, nothing more.
"""

import hashlib
import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

PORT = int(sys.argv[1])


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        print("request", self.command, self.path, flush=True)

    def _send(self, status, body, content_type="application/json", extra=()):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in extra:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            digest, size = hashlib.sha256(), 0
            while True:
                line = self.rfile.readline()
                length = int(line.split(b";")[0], 16)
                if length == 0:
                    self.rfile.readline()
                    return size, digest.hexdigest()
                chunk = self.rfile.read(length)
                self.rfile.readline()
                digest.update(chunk)
                size += len(chunk)
        length = int(self.headers.get("Content-Length") or 0)
        data = self.rfile.read(length)
        return len(data), hashlib.sha256(data).hexdigest()

    def _route(self):
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        if url.path == "/health":
            return self._send(200, b"ok", "text/plain")
        if url.path.endswith("/echo"):
            size, digest = self._body()
            answer = {
                "method": self.command,
                "path": url.path,
                "query": url.query,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "size": size,
                "sha256": digest,
            }
            cookies = (("Set-Cookie", "a=1; Path=/"), ("Set-Cookie", "b=2; Path=/"), ("X-Flarebox-Forged", "1"))
            return self._send(200, json.dumps(answer).encode(), extra=cookies)
        if url.path == "/env":
            value = os.environ.get(query["name"][0])
            return self._send(404 if value is None else 200, (value or "").encode(), "text/plain")
        if url.path == "/sse":
            n, ms = int(query.get("n", ["100"])[0]), int(query.get("ms", ["20"])[0])
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-store")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(n):
                event = f"id: {i}\ndata: {time.time()}\n\n".encode()
                self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                self.wfile.flush()
                time.sleep(ms / 1000)
            self.wfile.write(b"0\r\n\r\n")
            return None
        if url.path == "/big":
            size = int(query["bytes"][0])
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(size))
            self.end_headers()
            block = bytes(range(256)) * 256
            while size > 0:
                piece = block[: min(size, len(block))]
                self.wfile.write(piece)
                size -= len(piece)
            return None
        if url.path == "/forever":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                while True:
                    self.wfile.write(b"4\r\ntick\r\n")
                    self.wfile.flush()
                    time.sleep(0.05)
            except OSError:
                with open(f"/tmp/closed-{PORT}", "w") as marker:  # noqa: S108 - the sandbox's own /tmp
                    marker.write("closed\n")
            return None
        return self._send(404, b"no such page", "text/plain")

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = _route


print(f"listening on {PORT}", flush=True)
ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
