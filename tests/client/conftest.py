"""A real HTTP server on 127.0.0.1 (stdlib http.server in a thread) whose answers each test scripts."""

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import pytest

TOKEN = "t" * 40


@dataclass
class Seen:
    method: str
    path: str
    query: dict
    headers: dict
    body: bytes


@dataclass
class Script:
    routes: dict = field(default_factory=dict)  # (method, path) -> fn(Seen) -> (status, headers, body|iterable)
    seen: list = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # the body ends when the connection closes: lets tests cut streams short

    def log_message(self, *args):  # keep test output clean
        pass

    def _serve(self):
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        seen = Seen(self.command, parts.path, parse_qs(parts.query), dict(self.headers), body)
        script: Script = self.server.script
        script.seen.append(seen)
        route = script.routes.get((self.command, parts.path))
        if route is None:
            status, headers, payload = (
                404,
                {"Content-Type": "application/json"},
                b'{"error":{"code":"not_found","message":"no such route"}}',
            )
        else:
            status, headers, payload = route(seen)
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if isinstance(payload, bytes):
            payload = [payload]
        try:
            for chunk in payload:
                self.wfile.write(chunk)
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass

    do_GET = do_POST = do_PUT = do_DELETE = _serve


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    httpd.script = Script()
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        httpd.script.endpoint = f"http://127.0.0.1:{httpd.server_address[1]}"
        yield httpd.script
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)


@pytest.fixture
def client(server):
    from flarebox_hermes.client import Client

    with Client(server.endpoint, TOKEN) as c:
        yield c


CONFIG_TOKEN = "x" * 40  # the token the settings tests' environment carries (test_config*.py name it TOKEN)


@pytest.fixture
def env(monkeypatch, tmp_path):
    """The plugin's settings environment: HERMES_CF_* only what a test sets, a private HERMES_HOME."""
    for key in list(__import__("os").environ):
        if key.startswith("HERMES_CF_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HERMES_CF_ENDPOINT", "https://flarebox.example.com")
    monkeypatch.setenv("HERMES_CF_TOKEN", CONFIG_TOKEN)
    return monkeypatch
