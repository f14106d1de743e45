"""The service bench_proxy runs both inside a sandbox and on the host: `python3 proxy_service.py PORT`. Stdlib only
(the sandbox has the host's Python, nothing more), HTTP/1.1 with keep-alive.

/health        200 ok
/big?bytes=N   N bytes (a repeating pattern), with Content-Length; `&close=1` adds Connection: close (and closes)
/echo          reads the request body (Content-Length) and answers its size as text

Unlike tests/standalone/service_app.py it sets TCP_NODELAY, as real HTTP servers do: http.server writes the head
and the body in two sends, and on a kept-alive connection Nagle holds the second until the client's delayed ACK
(40 ms on Linux), which would make the direct baseline, not the proxy, what is measured.
"""

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

PORT = int(sys.argv[1])
BLOCK = memoryview(bytes(range(256)) * 4096)  # 1 MiB


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):
        pass

    def _head(self, status: int, length: int, content_type: str = "text/plain", close: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(length))
        if close:
            self.send_header("Connection", "close")  # (http.server then closes the connection after the answer)
        self.end_headers()

    def _small(self, status: int, body: bytes) -> None:
        self._head(status, len(body))
        self.wfile.write(body)

    def _route(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/health":
            return self._small(200, b"ok")
        if url.path == "/big":
            query = parse_qs(url.query)
            size = int(query["bytes"][0])
            self._head(200, size, "application/octet-stream", close="close" in query)
            while size > 0:
                piece = BLOCK[: min(size, len(BLOCK))]
                self.wfile.write(piece)
                size -= len(piece)
            return None
        if url.path == "/echo":
            remaining, buffer = int(self.headers.get("Content-Length") or 0), bytearray(len(BLOCK))
            total = 0
            while remaining > 0:
                n = self.rfile.readinto(memoryview(buffer)[: min(remaining, len(buffer))])
                if not n:
                    break
                remaining -= n
                total += n
            return self._small(200, str(total).encode())
        return self._small(404, b"no such page")

    do_GET = do_PUT = do_POST = _route


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
