"""Hostile names, paths, headers and bodies against a real `flarebox serve`: each is refused with its documented
code, and a refused request leaves nothing behind (no workspace directory, no sandbox, no snapshot).

Requests go out as raw bytes (tests/security/secrets_probe.raw_request): HTTP clients normalise `..` and encoding.
"""

import os
import socket
import time

import pytest
from e2e import rid, run_ok, sandbox_pids, ws_url
from secrets_probe import raw_request, request_head

from protocol import limits

pytestmark = pytest.mark.timeout(120)

# percent-encoded as a client would put them in a URL
HOSTILE_NAMES = [
    "..",
    ".",
    "%2e%2e",
    "%2E%2E",
    "..%2f..%2fetc",
    "a%2fb",
    "a%2Fb",
    "%2f",
    "a%00b",
    "%00",
    "a%5cb",  # backslash
    "%E2%80%AEabc",  # RIGHT-TO-LEFT OVERRIDE
    "abc%E2%80%8F",  # RIGHT-TO-LEFT MARK
    "a%EF%BC%8Fb",  # FULLWIDTH SOLIDUS
    "e%CC%81",  # e + COMBINING ACUTE ACCENT
    "%EF%BD%81",  # FULLWIDTH a
    "a%20b",
    "A",
    "-lead",
    "_lead",
    ".hidden",
    "x" * 64,
    "%ff",  # not UTF-8
    "a%0ab",  # newline
]


def _tree(path) -> set[str]:
    """Namespace and workspace (or snapshot) directories and the files right below them."""
    return {str(p.relative_to(path)) for p in path.glob("*/*/*")} | {str(p.relative_to(path)) for p in path.glob("*/*")}


def _error_code(body: bytes) -> str | None:
    import json

    try:
        return json.loads(body)["error"]["code"]
    except (ValueError, KeyError, TypeError):
        return None


@pytest.fixture(scope="module")
def victim(secure_server):
    """A booted workspace `hostile/victim` with a file, plus the data dir listing before the attacks."""
    with secure_server.client() as client:
        assert client.put(ws_url("hostile", "victim"), json={}).status_code in (200, 201)
        run_ok(client, "hostile", "victim", "echo precious > /workspace/keep")
    return secure_server


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_names_are_invalid_name_and_create_nothing(victim, name):
    data = victim.data_dir
    before = _tree(data / "workspaces") | _tree(data / "snapshots")
    targets = [
        ("PUT", f"/v1/workspaces/{name}/w"),
        ("PUT", f"/v1/workspaces/hostile/{name}"),
        ("GET", f"/v1/workspaces/hostile/{name}"),
        ("POST", f"/v1/workspaces/hostile/{name}/exec"),
        ("GET", f"/v1/workspaces/hostile/{name}/files?path=/workspace/keep"),
        ("POST", f"/v1/workspaces/{name}/victim/snapshot"),
        ("DELETE", f"/v1/workspaces/hostile/{name}?confirm=true"),
    ]
    for method, target in targets:
        body = b'{"request_id":"%s","command":"echo pwned > /workspace/keep"}' % rid().encode()
        head = request_head(
            method, target, victim.token, {"Content-Type": "application/json", "Content-Length": str(len(body))}
        )
        status, answer = raw_request(victim.port, head, body)
        # a name the router can still split is invalid_name; a `/` the URL decoder already split is no route
        assert (status, _error_code(answer)) in ((400, "invalid_name"), (404, "not_found")), (method, target, answer)
    assert _tree(data / "workspaces") | _tree(data / "snapshots") == before
    with victim.client() as client:
        assert run_ok(client, "hostile", "victim", "cat /workspace/keep")[0] == "precious\n"


@pytest.mark.parametrize(
    "request_id",
    ["%2e%2e", "..", "A" * 32, "%EF%BC%90" * 32, "0" * 31, "0" * 33, "0" * 31 + "%00", "0" * 31 + "%CC%81"],
)
def test_hostile_request_ids_are_invalid_request_id(victim, request_id):
    for method, suffix in (("GET", ""), ("POST", "/cancel")):
        target = f"/v1/workspaces/hostile/victim/exec/{request_id}{suffix}"
        status, answer = raw_request(victim.port, request_head(method, target, victim.token))
        assert (status, _error_code(answer)) in ((400, "invalid_request_id"), (404, "not_found")), (target, answer)


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("", "invalid_path"),
        ("workspace/keep", "invalid_path"),
        ("../workspace/keep", "invalid_path"),
        ("%2e%2e%2fetc%2fpasswd", "invalid_path"),
        ("/workspace/a%00b", "invalid_path"),
        ("/" + "a" * limits.MAX_PATH_BYTES, "invalid_path"),
        ("/workspace/%ff", "invalid_path"),  # not UTF-8
    ],
)
def test_malformed_file_paths_are_invalid_path(victim, path, code):
    for method in ("GET", "PUT"):
        head = request_head(
            method,
            f"/v1/workspaces/hostile/victim/files?path={path}",
            victim.token,
            {"Content-Length": "1"} if method == "PUT" else None,
        )
        status, answer = raw_request(victim.port, head, b"x" if method == "PUT" else b"")
        assert (status, _error_code(answer)) in ((400, code), (400, "invalid_query")), (method, path, answer)


def test_dot_dot_and_odd_unicode_in_file_paths_stay_inside_the_sandbox(victim):
    """A file path is a path inside the container: `..` cannot climb out of it, and odd Unicode is just a name
    that round-trips exactly (never normalised into another file)."""
    outside = victim.data_dir.parent / "outside.txt"
    with victim.client() as client:
        url = ws_url("hostile", "victim", "files")
        # climbing: /workspace/../../.. is still the sandbox root
        climb = "/workspace/" + "../" * 12 + str(outside).lstrip("/")
        # (the host path is under /tmp, and /tmp in the sandbox is its own root/tmp: the write lands there)
        assert client.put(url, params={"path": climb}, content=b"escaped").status_code == 200
        assert not outside.exists()
        assert client.get(url, params={"path": str(outside)}).content == b"escaped"
        assert (victim.data_dir / "workspaces/hostile/victim/root/tmp" / str(outside).split("/", 2)[2]).exists()
        response = client.get(url, params={"path": "/workspace/../../" + str(victim.data_dir / "token").lstrip("/")})
        assert response.status_code == 404 and response.json()["error"]["code"] == "file_not_found"
        # the sandbox's own view: ../ resolves within it
        assert client.put(url, params={"path": "/workspace/sub/../dots.txt"}, content=b"dots").status_code == 200
        assert client.get(url, params={"path": "/workspace/dots.txt"}).content == b"dots"
        names = ["rtl\u202etxt.exe", "full\uff0fwidth", "e\u0301", "\u00e9", "zero\u200bwidth"]
        for i, name in enumerate(names):
            body = f"file {i}".encode()
            assert client.put(url, params={"path": f"/workspace/u/{name}"}, content=body).status_code == 200
        for i, name in enumerate(names):  # e + combining acute and precomposed é stay two files
            assert client.get(url, params={"path": f"/workspace/u/{name}"}).content == f"file {i}".encode()
        out, _ = run_ok(client, "hostile", "victim", "ls /workspace/u | wc -l")
        assert out.strip() == str(len(names))


def _assert_untouched(server, namespace: str, workspace: str, before: set[str]) -> None:
    assert _tree(server.data_dir / "workspaces") == before
    assert not sandbox_pids(server, workspace)


def test_oversized_headers_are_431_and_touch_nothing(victim):
    before = _tree(victim.data_dir / "workspaces")
    for size in (40_000, 100_000, 1_000_000):
        head = request_head(
            "PUT", ws_url("hostile", "bigheader"), victim.token, {"X-Filler": "y" * size, "Content-Length": "0"}
        )
        status, answer = raw_request(victim.port, head)
        assert status == 431, (size, status, answer[:200])
        assert _error_code(answer) == "headers_too_large", answer[:200]
    # many small headers add up the same way
    many = {f"X-H{i}": "z" * 60 for i in range(2000)}
    status, answer = raw_request(victim.port, request_head("GET", "/v1/health", victim.token, many))
    assert (status, _error_code(answer)) == (431, "headers_too_large")
    _assert_untouched(victim, "hostile", "bigheader", before)
    assert raw_request(victim.port, request_head("GET", "/v1/health", victim.token))[0] == 200  # still serving


@pytest.mark.parametrize(
    "head",
    [
        b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length:\r\n\r\n",  # an empty length
        b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nno colon here\r\n\r\n",
        b"GET /v1/health HTTP/1.1 extra\r\nHost: 127.0.0.1\r\n\r\n",  # a bad request line
    ],
)
def test_malformed_http_is_a_json_400_like_every_other_error(victim, head):
    status, answer = raw_request(victim.port, head)
    assert (status, _error_code(answer)) == (400, "malformed_request"), answer[:200]
    assert raw_request(victim.port, request_head("GET", "/v1/health", victim.token))[0] == 200  # still serving


def _announce(port: int, head: bytes) -> tuple[int, bytes]:
    """Send only the head of a request whose body is announced but never sent: the answer must come anyway,
    which proves the server refused it before reading (or waiting for) any of the body."""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall(head)
        data = b""
        while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return int(data[9:12]), data.split(b"\r\n\r\n", 1)[1]


def test_oversized_bodies_are_refused_before_any_work(victim):
    with victim.client() as client:
        assert client.put(ws_url("hostile", "cold"), json={}).status_code in (200, 201)  # configured, never booted
    before = _tree(victim.data_dir / "workspaces")
    json_type = {"Content-Type": "application/json"}
    over_json = str(limits.MAX_BODY_BYTES + 1)
    over_file = str(limits.MAX_FILE_WRITE_BYTES + 1)
    cases = [
        ("PUT", ws_url("hostile", "newbig"), {**json_type, "Content-Length": over_json}, "payload_too_large"),
        ("POST", ws_url("hostile", "cold", "exec"), {**json_type, "Content-Length": over_json}, "payload_too_large"),
        (
            "PUT",
            ws_url("hostile", "cold", "files") + "?path=/workspace/big",
            {"Content-Length": over_file},
            "file_too_large",
        ),
        (
            "PUT",
            ws_url("hostile", "cold", "files") + "?path=/workspace/big",
            {"Transfer-Encoding": "chunked"},
            "length_required",
        ),
    ]
    for method, target, headers, code in cases:
        status, answer = _announce(victim.port, request_head(method, target, victim.token, headers))
        assert _error_code(answer) == code, (target, status, answer)
    # a chunked JSON body that grows past the limit is cut off at the limit, not buffered whole
    for target in (ws_url("hostile", "newbig2"), ws_url("hostile", "cold", "exec")):
        chunk = b"x" * 65536
        body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(limits.MAX_BODY_BYTES // 65536 + 2))
        head = request_head(
            "PUT" if target.count("/") == 4 else "POST",
            target,
            victim.token,
            {**json_type, "Transfer-Encoding": "chunked"},
        )
        status, answer = raw_request(victim.port, head, body + b"0\r\n\r\n")
        assert (status, _error_code(answer)) == (413, "payload_too_large"), (target, answer)
    time.sleep(0.5)  # anything started by mistake would have spawned by now
    _assert_untouched(victim, "hostile", "cold", before)
    with victim.client() as client:
        status = client.get(ws_url("hostile", "cold")).json()
        assert status["booted"] is False and status["running"] is False
        assert client.get(ws_url("hostile", "newbig")).status_code == 404
        assert not os.path.exists(victim.data_dir / "workspaces" / "hostile" / "cold" / "root")
