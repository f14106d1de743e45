"""Services, the port proxy and secrets through the real Worker entry under Pyodide: the proxied request crosses
the Durable Object stub, the workspace reaches the service with `ctx.container.getTcpPort(port).fetch` (the
harness's, which answers only ports a process of that container listens on), and secrets are sealed with WebCrypto
(cloudflare/cipher.py) under this module's SECRETS_KEY.

The services are tests/cloudflare/echo_service.py, started by the real supervisor in the harness's sandbox. That
sandbox shares the host's network, so each service gets a port that is free on the host.
"""

import asyncio
import base64
import hashlib
import json
import os
import secrets
import socket
import sqlite3
import sys
import threading
import time
from contextlib import closing
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import httpx
import pytest

from durable.services import decode_secrets_key as decode_key
from standalone.cipher import AesGcmCipher

pytestmark = pytest.mark.timeout(180)

ECHO = Path(__file__).with_name("echo_service.py")
SECRETS_KEY = base64.b64encode(os.urandom(32)).decode()
READY_SECONDS = 30


@pytest.fixture(scope="module")
def harness_vars() -> dict[str, str]:
    return {"SECRETS_KEY": SECRETS_KEY}


@pytest.fixture
def admin(harness):
    with harness.client() as c:
        yield c


def ws_path(namespace: str, workspace: str) -> str:
    return f"/v1/workspaces/{namespace}/{workspace}"


def free_port() -> int:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def create(client, namespace: str, workspace: str, **config) -> None:
    resp = client.put(ws_path(namespace, workspace), json=config)
    assert resp.status_code == 201, resp.text


def put_service(client, namespace: str, workspace: str, name: str, port: int, **spec) -> dict:
    body = {"command": f"exec {sys.executable} {ECHO} {port}", "port": port, "health": {"path": "/status/204"}}
    resp = client.put(ws_path(namespace, workspace) + f"/services/{name}", json={**body, **spec})
    assert resp.status_code in (200, 201), resp.text
    return resp.json()


def mint_proxy_key(client, namespace: str, workspace: str, service: str) -> str:
    body = {"namespace": namespace, "workspace": workspace, "service": service, "scopes": ["proxy"]}
    resp = client.post("/v1/keys", json=body)
    assert resp.status_code == 201, resp.text
    return resp.json()["key"]


def services(client, namespace: str, workspace: str) -> dict[str, dict]:
    resp = client.get(ws_path(namespace, workspace) + "/services")
    assert resp.status_code == 200, resp.text
    return {s["name"]: s for s in resp.json()["services"]}


def wait_running(client, namespace: str, workspace: str, name: str) -> dict:
    deadline = time.monotonic() + READY_SECONDS
    while True:
        service = services(client, namespace, workspace)[name]
        if service["state"] == "running" or time.monotonic() > deadline:
            assert service["state"] == "running", service
            return service
        time.sleep(0.2)


def assert_error(resp, status: int, code: str) -> None:
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.json()["error"]["code"] == code, resp.text


def headers_of(echo: dict) -> dict[str, str]:
    return {k: v for k, v in echo["headers"]}


def test_a_service_answers_through_the_port_proxy_and_through_a_proxy_key(harness, admin):
    ns, ws, port = "svc", "echo", free_port()
    create(admin, ns, ws)
    defined = put_service(admin, ns, ws, "echo", port)
    assert defined["state"] == "stopped"  # the workspace sleeps: the service starts with its first request
    prefix = ws_path(ns, ws) + f"/ports/{port}"

    sent = {
        "cf-access-jwt-assertion": "eyJ.access.jwt",
        "cf-access-client-id": "id.access",
        "cf-access-client-secret": "access-client-secret",
        "x-forwarded-for": "6.6.6.6",  # forged: replaced by what the edge saw
        "cookie": "CF_Authorization=access-session; keep=1",
        "x-custom": "kept",
    }
    resp = admin.get(prefix + "/hello/world", params={"q": "1"}, headers=sent)  # wakes the workspace
    assert resp.status_code == 200, resp.text
    echo = resp.json()
    assert (echo["method"], echo["target"]) == ("GET", "/hello/world?q=1")
    seen = headers_of(echo)
    assert "authorization" not in seen and not any(name.startswith("cf-") for name in seen), seen
    assert harness.token not in resp.text and "access-session" not in resp.text
    assert seen["x-custom"] == "kept" and seen["cookie"] == "keep=1"
    assert seen["x-forwarded-for"] == "127.0.0.1"  # the harness's CF-Connecting-IP: the test's own address
    assert seen["x-forwarded-proto"] == "http"
    assert seen["x-forwarded-host"] == harness.base.split("://", 1)[1]
    assert seen["x-forwarded-prefix"] == prefix
    # the service's answer: both cookies kept apart, its forged proxy signal dropped
    assert resp.headers.get_list("set-cookie") == ["a=1; Path=/", "b=2; Expires=Wed, 21 Oct 2037 07:28:00 GMT"]
    assert "x-flarebox-proxy-error" not in resp.headers and resp.headers["x-echo"] == "yes"
    assert wait_running(admin, ns, ws, "echo")["port"] == port
    ports = {c["port"] for c in harness.calls(f"{ns}/{ws}", "container.getTcpPort.fetch")}
    assert ports == {8080, port}

    # request bodies both ways the proxy streams them: with a length, and chunked without one
    data = os.urandom(3 * 1024 * 1024 + 17)
    sized = admin.put(prefix + "/upload", content=data).json()
    chunks = [data[i : i + 65536] for i in range(0, len(data), 65536)]
    chunked = admin.post(prefix + "/upload", content=iter(chunks)).json()
    for echo in (sized, chunked):
        assert echo["body_bytes"] == len(data)
        assert echo["body_sha256"] == hashlib.sha256(data).hexdigest()
    assert "transfer-encoding" not in headers_of(sized) and headers_of(sized)["content-length"] == str(len(data))
    assert "content-length" not in headers_of(chunked)

    nothing = admin.get(prefix + "/status/204")  # a null-body status relayed as one
    assert (nothing.status_code, nothing.content) == (204, b"")
    head = admin.head(prefix + "/anything")
    assert head.status_code == 200 and head.content == b""

    key = mint_proxy_key(admin, ns, ws, "echo")
    with harness.client(token=key) as client:
        resp = client.post("/v1/proxy/v1/chat/completions", params={"stream": "false"}, json={"model": "m"})
        assert resp.status_code == 200, resp.text
        echo = resp.json()
        assert (echo["method"], echo["target"]) == ("POST", "/v1/chat/completions?stream=false")
        seen = headers_of(echo)
        assert "authorization" not in seen and key not in resp.text
        assert seen["x-forwarded-prefix"] == "/v1/proxy"
        # the key opens its service's proxy and nothing else of the workspace
        assert_error(client.get(prefix + "/hello"), 403, "forbidden")
        assert_error(client.get(ws_path(ns, ws)), 403, "forbidden")


def test_a_port_nothing_of_the_container_listens_on_is_502(harness, admin):
    ns, ws = "svc", "empty"
    create(admin, ns, ws)
    # a port a host process listens on is not the container's: the harness refuses it like workerd does
    host_server = HTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    threading.Thread(target=host_server.serve_forever, daemon=True).start()
    try:
        for port in (free_port(), host_server.server_address[1]):
            resp = admin.get(ws_path(ns, ws) + f"/ports/{port}/")
            assert_error(resp, 502, "upstream_unavailable")
            assert "10.0.0.1" not in resp.text  # the platform's error text stays in the log
            assert any(c["port"] == port for c in harness.calls(f"{ns}/{ws}", "container.getTcpPort.fetch"))
    finally:
        host_server.shutdown()
    assert harness.container(f"{ns}/{ws}")["running"]  # it woke for the request, and stays up


def test_a_secret_reaches_the_services_environment_and_nowhere_else(harness, admin):
    ns, ws, port = "svc", "secret", free_port()
    value = "sk-" + secrets.token_hex(24)
    create(admin, ns, ws)
    resp = admin.put(ws_path(ns, ws) + "/secrets/PROVIDER_KEY", json={"value": value})
    assert resp.status_code == 201, resp.text
    assert value not in resp.text and resp.json()["name"] == "PROVIDER_KEY"
    listed = admin.get(ws_path(ns, ws) + "/secrets")
    assert listed.status_code == 200 and value not in listed.text
    assert [sorted(s) for s in listed.json()["secrets"]] == [["name", "updated_at"]]
    assert listed.json()["secrets"][0]["name"] == "PROVIDER_KEY"

    put_service(admin, ns, ws, "env", port, secrets=["PROVIDER_KEY"], env={"PLAIN": "visible"})
    got = admin.get(ws_path(ns, ws) + f"/ports/{port}/env/PROVIDER_KEY")
    assert got.status_code == 200, got.text
    assert got.json() == {"name": "PROVIDER_KEY", "value": value}
    assert admin.get(ws_path(ns, ws) + f"/ports/{port}/env/PLAIN").json()["value"] == "visible"

    # sealed at rest in the object's SQLite, in the standalone cipher's format: it opens there under the same key
    with closing(sqlite3.connect(harness.object_db(f"{ns}/{ws}"))) as db:
        ((sealed,),) = db.execute("SELECT sealed FROM secrets WHERE name = 'PROVIDER_KEY'").fetchall()
        dump = "\n".join(db.iterdump())
    assert value not in dump
    standalone = AesGcmCipher(decode_key(SECRETS_KEY))
    assert _run(standalone.open(base64.b64decode(sealed), f"{ns}/{ws}/PROVIDER_KEY".encode())) == value.encode()

    # nowhere else: not in a status object, the service listing, the audit log, or any container call
    for text in (
        admin.get(ws_path(ns, ws)).text,
        admin.get(ws_path(ns, ws) + "/services").text,
        admin.get("/v1/audit", params={"namespace": ns, "limit": 1000}).text,
        json.dumps(harness.calls()),
    ):
        assert value not in text
    audit = admin.get("/v1/audit", params={"namespace": ns, "limit": 1000}).json()["records"]
    assert any(r["operation"] == "put_secret" and r["workspace"] == ws for r in audit)

    deleted = admin.delete(ws_path(ns, ws) + "/secrets/PROVIDER_KEY")
    assert deleted.status_code == 200 and deleted.json() == {"name": "PROVIDER_KEY", "deleted": True}
    assert admin.get(ws_path(ns, ws) + "/secrets").json()["secrets"] == []


def _run(coro):
    return asyncio.run(coro)


def test_the_webcrypto_cipher_and_the_standalone_cipher_open_each_others_values(harness):
    key, aad, plain = SECRETS_KEY, b"ns/ws/NAME", "héllo sécret ✓".encode()
    standalone = AesGcmCipher(decode_key(key))

    sealed = harness.cipher("seal", key, plain, aad)
    assert sealed["available"] and len(sealed["data"]) == 12 + len(plain) + 16  # nonce || ciphertext || tag
    assert _run(standalone.open(sealed["data"], aad)) == plain
    again = harness.cipher("seal", key, plain, aad)["data"]
    assert again[:12] != sealed["data"][:12]  # a fresh nonce each time

    theirs = _run(standalone.seal(plain, aad))
    assert harness.cipher("open", key, theirs, aad) == {"available": True, "data": plain}
    empty = harness.cipher("seal", key, b"", b"")["data"]  # an empty value and an empty aad work too
    assert _run(standalone.open(empty, b"")) == b"" and harness.cipher("open", key, empty, b"")["data"] == b""

    other_key = base64.b64encode(os.urandom(32)).decode()
    tampered = theirs[:-1] + bytes([theirs[-1] ^ 1])
    for args in ((key, theirs, b"ns/ws/OTHER"), (other_key, theirs, aad), (key, tampered, aad), (key, b"short", aad)):
        answer = harness.cipher("open", *args)
        assert answer["available"] and "error" in answer and "data" not in answer, args[1:]
    for bad in ("", "not base64!", base64.b64encode(os.urandom(16)).decode()):
        assert harness.cipher("seal", bad, plain, aad) == {"available": False}


def test_after_stop_the_next_proxied_request_wakes_the_workspace(harness, admin):
    ns, ws, port = "svc", "wake", free_port()
    create(admin, ns, ws)
    put_service(admin, ns, ws, "echo", port)
    key = mint_proxy_key(admin, ns, ws, "echo")
    with harness.client(token=key) as client:
        assert client.get("/v1/proxy/first").json()["target"] == "/first"
        wait_running(admin, ns, ws, "echo")
        stopped = admin.post(ws_path(ns, ws) + "/stop")
        assert stopped.status_code == 200, stopped.text
        assert not harness.container(f"{ns}/{ws}")["running"]
        assert services(admin, ns, ws)["echo"]["state"] == "stopped"

        resp = client.get("/v1/proxy/again")  # restores the snapshot, starts the service, waits for its health
        assert resp.status_code == 200, resp.text
        assert resp.json()["target"] == "/again"
    starts = harness.calls(f"{ns}/{ws}", "container.start")
    assert len(starts) == 2 and starts[1]["containerSnapshot"] is not None
    assert wait_running(admin, ns, ws, "echo")["restarts"] == 0


def test_a_server_sent_event_stream_arrives_as_it_is_produced(harness, admin):
    ns, ws, port = "svc", "sse", free_port()
    create(admin, ns, ws)
    put_service(admin, ns, ws, "sse", port)
    assert admin.get(ws_path(ns, ws) + f"/ports/{port}/warm").status_code == 200
    events, arrived = [], []
    with admin.stream("GET", ws_path(ns, ws) + f"/ports/{port}/sse", params={"n": 100, "gap_ms": 20}) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"] == "text/event-stream"
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[len("data: ") :]))
                arrived.append(time.time())
    assert [e["i"] for e in events] == list(range(100))
    # relayed as produced: the first events were here long before the last was written (100 × 20 ms ≈ 2 s)
    assert arrived[0] < events[-1]["t"] - 1.0
    lags = [a - e["t"] for a, e in zip(arrived, events, strict=True)]
    assert sorted(lags)[50] < 0.5, lags


def test_a_broken_upstream_breaks_the_clients_body_and_a_client_that_leaves_frees_the_upstream(harness, admin):
    ns, ws, port = "svc", "broken", free_port()
    create(admin, ns, ws)
    put_service(admin, ns, ws, "echo", port)
    prefix = ws_path(ns, ws) + f"/ports/{port}"
    assert admin.get(prefix + "/warm").status_code == 200

    received = b""
    with pytest.raises(httpx.RemoteProtocolError):  # never a body that looks complete
        with admin.stream("GET", prefix + "/break") as resp:
            assert resp.status_code == 200
            for chunk in resp.iter_bytes():
                received += chunk
    assert received in (b"", b"the first part, and then nothing")

    with admin.stream("GET", prefix + "/sse", params={"n": 2000, "gap_ms": 10}) as resp:  # 20 s if read to the end
        lines = resp.iter_lines()
        assert [next(lines) for _ in range(4)][0].startswith("data: ")
        assert harness.container(f"{ns}/{ws}")["inflight"] == 1
    deadline = time.monotonic() + 10
    while harness.container(f"{ns}/{ws}")["inflight"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert harness.container(f"{ns}/{ws}")["inflight"] == 0  # the upstream connection closed with the client's
    assert admin.get(prefix + "/after").json()["target"] == "/after"


def test_an_upstream_without_a_head_in_time_is_504_and_its_connection_is_let_go(harness, admin):
    ns, ws, port = "svc", "hang", free_port()
    create(admin, ns, ws)
    put_service(admin, ns, ws, "echo", port)
    prefix = ws_path(ns, ws) + f"/ports/{port}"
    assert admin.get(prefix + "/warm").status_code == 200
    harness.knobs(proxyHeadSeconds=1.5)
    try:
        started = time.monotonic()
        assert_error(admin.get(prefix + "/hang"), 504, "upstream_timeout")
        assert 1.4 < time.monotonic() - started < 10
    finally:
        harness.knobs(proxyHeadSeconds=60)
    deadline = time.monotonic() + 10
    while harness.container(f"{ns}/{ws}")["inflight"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert harness.container(f"{ns}/{ws}")["inflight"] == 0  # the waiting fetch was aborted, not left hanging
    assert admin.get(prefix + "/after").json()["target"] == "/after"
