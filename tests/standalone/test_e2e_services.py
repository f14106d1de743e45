"""Services, the port proxy, the key-resolved proxy and secrets on a real standalone server (issue 12).

A stdlib HTTP service (service_app.py) runs inside the sandbox; every request reaches it through the server, the
workspace object and the supervisor's port relay. One server per module; each test uses its own workspace.
"""

import hashlib
import http.client
import json
import time
from pathlib import Path

import httpx
import pytest
from e2e import QUIET, TOKEN, exec_events, output_of, put_workspace, run_ok, serving, wait_until, ws_url

pytestmark = pytest.mark.timeout(240)

NS = "svc"
APP = (Path(__file__).with_name("service_app.py")).read_bytes()
SECRET_VALUE = "sk-live-" + "s3cr3t" * 6


@pytest.fixture(scope="module")
def server():
    with serving(QUIET) as proc:
        yield proc


@pytest.fixture
def client(server):
    with server.client() as c:
        yield c


def workspace_with_app(client, ws: str) -> None:
    assert put_workspace(client, NS, ws).status_code == 201
    response = client.put(ws_url(NS, ws, "files"), params={"path": "/workspace/app.py"}, content=APP)
    assert response.status_code == 200, response.text


def put_service(client, ws: str, name: str, **spec) -> httpx.Response:
    return client.put(ws_url(NS, ws, "services", name), json=spec)


def app_service(client, ws: str, name: str = "web", port: int = 8000, **extra) -> dict:
    body = {"command": f"python3 app.py {port}", "port": port, "health": {"path": "/health"}, **extra}
    response = put_service(client, ws, name, **body)
    assert response.status_code == 201, response.text
    return response.json()


def service_state(client, ws: str, name: str) -> dict:
    listed = client.get(ws_url(NS, ws, "services")).json()["services"]
    return next(s for s in listed if s["name"] == name)


def proxied(client, ws: str, port, path: str, method: str = "GET", **kwargs) -> httpx.Response:
    return client.request(method, ws_url(NS, ws, "ports", str(port)) + path, **kwargs)


def until_answers(client, ws: str, port: int = 8000) -> httpx.Response:
    def answer():
        response = proxied(client, ws, port, "/health")
        return response if response.status_code == 200 else None

    return wait_until(answer, 30, what="the service to answer through the proxy")


def test_a_service_answers_through_the_proxy_without_the_callers_credentials(client):
    workspace_with_app(client, "echo")
    service = app_service(client, "echo")
    assert service["state"] in ("starting", "running") and service["port"] == 8000
    until_answers(client, "echo")
    headers = {
        "Cf-Access-Jwt-Assertion": "eyJhbGciOi.jwt.sig",
        "Cookie": "CF_Authorization=eyJhbGciOi.jwt.sig; theme=dark",
        "X-Forwarded-For": "6.6.6.6",
        "X-Custom": "kept",
    }
    response = proxied(
        client, "echo", 8000, "/api/echo", "POST", params={"q": "a b"}, content=b"hello", headers=headers
    )
    assert response.status_code == 200, response.text
    echoed = response.json()
    assert (echoed["method"], echoed["path"], echoed["query"], echoed["size"]) == ("POST", "/api/echo", "q=a+b", 5)
    seen = echoed["headers"]
    assert "authorization" not in seen and not any(h.startswith("cf-access") for h in seen)
    assert TOKEN not in json.dumps(echoed) and "jwt.sig" not in json.dumps(echoed)
    assert seen["cookie"] == "theme=dark" and seen["x-custom"] == "kept"
    assert seen["x-forwarded-for"] == "127.0.0.1"  # replaced, never the caller's forgery
    assert seen["x-forwarded-prefix"] == f"/v1/workspaces/{NS}/echo/ports/8000"
    assert seen["x-forwarded-proto"] == "http" and seen["x-forwarded-host"].startswith("127.0.0.1:")
    # the answer: both cookies survive, the sandbox cannot forge the supervisor's own headers
    assert response.headers.get_list("set-cookie") == ["a=1; Path=/", "b=2; Path=/"]
    assert "x-flarebox-forged" not in response.headers


def test_a_streamed_upload_and_a_large_download_pass_whole(client):
    workspace_with_app(client, "bulk")
    app_service(client, "bulk")
    until_answers(client, "bulk")
    chunks = [bytes([i]) * 65536 for i in range(80)]  # 5 MiB without a Content-Length: chunked

    def body():
        yield from chunks

    response = proxied(client, "bulk", 8000, "/echo", "PUT", content=body())
    assert response.status_code == 200, response.text
    assert response.json()["size"] == 80 * 65536
    assert response.json()["sha256"] == hashlib.sha256(b"".join(chunks)).hexdigest()
    size = 20 * 1024 * 1024
    digest = hashlib.sha256()
    with client.stream("GET", ws_url(NS, "bulk", "ports", "8000") + "/big", params={"bytes": size}) as streamed:
        assert streamed.headers["content-length"] == str(size)
        for chunk in streamed.iter_raw():
            digest.update(chunk)
    block = bytes(range(256)) * 256
    assert digest.hexdigest() == hashlib.sha256(block * (size // len(block))).hexdigest()


def test_server_sent_events_arrive_as_they_are_produced(client):
    workspace_with_app(client, "sse")
    app_service(client, "sse")
    until_answers(client, "sse")
    arrivals: list[tuple[float, float]] = []  # (sent, arrived)
    url = ws_url(NS, "sse", "ports", "8000") + "/sse"
    with client.stream("GET", url, params={"n": 100, "ms": 20}) as streamed:
        assert streamed.headers["content-type"] == "text/event-stream"
        for line in streamed.iter_lines():
            if line.startswith("data: "):
                arrivals.append((float(line[6:]), time.time()))
    assert len(arrivals) == 100
    # produced over ~2 s: had anything buffered the stream, the first events would arrive with the last
    first_arrived, last_sent = arrivals[0][1], arrivals[-1][0]
    assert first_arrived < last_sent - 1.0, (first_arrived, last_sent)
    lags = sorted(arrived - sent for sent, arrived in arrivals)
    assert lags[50] < 0.5, lags[50]


def raw_get(server, path: str) -> tuple[int, dict]:
    """GET with the path sent byte for byte (httpx would normalize `..` and encodings away before sending)."""
    host, port = server.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.putrequest("GET", path, skip_accept_encoding=True)
        connection.putheader("Authorization", f"Bearer {TOKEN}")
        connection.endheaders()
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_a_plain_get_reaches_the_service_with_no_body_at_all(server, client):
    """Neither Content-Length nor Transfer-Encoding from the client: none reaches the service either (not an empty
    chunked body), request after request on the proxy's kept-alive upstream connection; a body still passes."""
    workspace_with_app(client, "plain")
    app_service(client, "plain")
    until_answers(client, "plain")
    base = ws_url(NS, "plain", "ports", "8000")
    for _ in range(3):  # a stray "0\r\n\r\n" left on the connection would garble the next request
        status, echoed = raw_get(server, base + "/echo")
        assert status == 200, echoed
        assert "transfer-encoding" not in echoed["headers"] and "content-length" not in echoed["headers"]
        assert echoed["size"] == 0 and echoed["method"] == "GET"
    sent = proxied(client, "plain", 8000, "/echo", "POST", content=iter([b"ab", b"cd"])).json()
    assert sent["headers"]["transfer-encoding"] == "chunked" and sent["size"] == 4
    sized = proxied(client, "plain", 8000, "/echo", "POST", content=b"").json()
    assert sized["headers"]["content-length"] == "0" and sized["size"] == 0
    response = proxied(client, "plain", 8000, "/echo")
    assert len(response.headers.get_list("date")) == 1  # the server's own, not the service's besides


def test_paths_are_normalized_before_the_allow_list(server, client):
    workspace_with_app(client, "locked")
    app_service(client, "locked", allow_paths=["/public"])
    wait_until(lambda: service_state(client, "locked", "web")["state"] == "running", 30, what="running")
    base = ws_url(NS, "locked", "ports", "8000")
    assert raw_get(server, base + "/public/echo")[0] == 200
    for attempt in (
        "/echo",
        "/public/../echo",
        "/public/%2e%2e/echo",
        "/public/%2E%2e/echo",
        "/public/.%2e/echo",
        "/public/..%2fecho",
        "/public/..%2Fecho",
        "/public/..%5cecho",
        "/public\\..\\echo",
        "//public/../echo",
        "/publicity/echo",
        "/public/%c0%ae%c0%ae/echo",
        "/public/%00/echo",
        "/../../echo",
    ):
        status, answer = raw_get(server, base + attempt)
        assert (status, answer.get("error", {}).get("code")) == (403, "path_not_allowed"), (attempt, answer)
    # double encoding stays literal: the service gets `%2e%2e` (encoded once more), never `..`
    status, answer = raw_get(server, base + "/public/%252e%252e/echo")
    assert status == 200 and answer["path"] == "/public/%252e%252e/echo"


def test_bad_definitions_are_refused_with_their_codes(client):
    assert put_workspace(client, NS, "bad").status_code == 201
    cases = [
        ({"command": "x", "port": 0}, "invalid_port"),
        ({"command": "x", "port": 65536}, "invalid_port"),
        ({"command": "x", "port": 8080}, "invalid_port"),
        ({"command": "x", "port": "80"}, "invalid_port"),
        ({"command": "x"}, "invalid_port"),
        ({"command": "", "port": 3000}, "invalid_field"),
        ({"command": "x", "port": 3000, "restart": "sometimes"}, "invalid_field"),
        ({"command": "x", "port": 3000, "allow_paths": ["relative"]}, "invalid_field"),
        ({"command": "x", "port": 3000, "allow_paths": ["/a/../b"]}, "invalid_field"),
        ({"command": "x", "port": 3000, "secrets": ["lower"]}, "invalid_name"),
        ({"command": "x", "port": 3000, "secrets": ["MISSING"]}, "secret_not_found"),
        ({"command": "x", "port": 3000, "colour": "red"}, "unknown_field"),
    ]
    for body, want in cases:
        response = put_service(client, "bad", "web", **body)
        assert response.json()["error"]["code"] == want, (body, response.text)
        assert response.status_code < 500
    assert put_service(client, "bad", "Bad_Name", command="x", port=3000).json()["error"]["code"] == "invalid_name"
    assert client.delete(ws_url(NS, "bad", "services", "ghost")).status_code == 404
    assert client.get(ws_url(NS, "bad", "services")).json() == {"services": []}
    for port in ("0", "65536", "8080", "x"):
        assert proxied(client, "bad", port, "/").json()["error"]["code"] in ("invalid_port", "not_found")


def test_nothing_listening_is_502_and_a_crash_loop_ends_failed(client):
    assert put_workspace(client, NS, "crashy").status_code == 201
    response = proxied(client, "crashy", 9999, "/")
    assert (response.status_code, response.json()["error"]["code"]) == (502, "upstream_unavailable")
    assert response.headers["x-flarebox-error"] == "upstream_unavailable"  # Flarebox's refusal, not the service's
    anonymous = httpx.get(str(client.base_url) + ws_url(NS, "crashy", "ports", "9999"), timeout=30)
    assert (anonymous.status_code, anonymous.headers["x-flarebox-error"]) == (401, "unauthorized")
    assert "x-flarebox-error" not in client.get(ws_url(NS, "crashy", "nope")).headers  # only proxied routes
    assert put_service(client, "crashy", "loop", command="echo doomed attempt; exit 3", port=9001).status_code == 201
    failed = wait_until(lambda: (s := service_state(client, "crashy", "loop"))["state"] == "failed" and s, 60)
    assert failed["restarts"] >= 4 and failed["last_exit"]["code"] == 3
    with client.stream("GET", ws_url(NS, "crashy", "services", "loop", "logs")) as logs:
        events = [json.loads(line) for line in logs.iter_lines() if line]
    text = "".join(e["data"] for e in events if e["type"] == "output")
    assert text.count("doomed attempt") >= 5 and events[-1]["type"] == "service"
    assert events[-1]["state"] == "failed"
    out, _ = run_ok(client, NS, "crashy", "echo the workspace still works")  # neither it nor the server fell over
    assert out == "the workspace still works\n"


def test_a_secret_reaches_the_service_environment_and_nowhere_else(server, client):
    workspace_with_app(client, "vault")
    response = client.put(ws_url(NS, "vault", "secrets", "API_KEY"), json={"value": SECRET_VALUE})
    assert response.status_code == 201 and SECRET_VALUE not in response.text
    app_service(client, "vault", secrets=["API_KEY"])
    until_answers(client, "vault")
    assert proxied(client, "vault", 8000, "/env", params={"name": "API_KEY"}).text == SECRET_VALUE
    events = exec_events(client, NS, "vault", 'printf %s "$API_KEY"', secrets=["API_KEY"])
    assert output_of(events) == SECRET_VALUE
    assert output_of(exec_events(client, NS, "vault", 'printf %s "${API_KEY:-unset}"')) == "unset"
    listed = client.get(ws_url(NS, "vault", "secrets")).json()
    assert [s["name"] for s in listed["secrets"]] == ["API_KEY"] and SECRET_VALUE not in json.dumps(listed)
    client.post(ws_url(NS, "vault", "snapshot"))
    seen = [
        client.get(ws_url(NS, "vault", "services")).text,
        client.get(ws_url(NS, "vault")).text,
        client.get(ws_url(NS, "vault", "snapshots")).text,
        client.get("/v1/audit", params={"namespace": NS}).text,
        server.output(),
    ]
    assert not any(SECRET_VALUE in text for text in seen)
    data = Path(server.data_dir)
    for path in data.rglob("*"):
        if path.is_file() and path.suffix in ("", ".json", ".sqlite3", ".log", ".key"):
            assert SECRET_VALUE.encode() not in path.read_bytes(), path
    assert client.delete(ws_url(NS, "vault", "secrets", "API_KEY")).status_code == 200
    assert client.delete(ws_url(NS, "vault", "secrets", "API_KEY")).json()["error"]["code"] == "secret_not_found"


def test_a_stopped_workspace_wakes_on_the_next_proxied_request(client):
    workspace_with_app(client, "sleepy")
    app_service(client, "sleepy")
    until_answers(client, "sleepy")
    stopped = client.post(ws_url(NS, "sleepy", "stop")).json()
    assert stopped["state"] == "stopped"
    assert service_state(client, "sleepy", "web")["state"] == "stopped"
    response = proxied(client, "sleepy", 8000, "/echo")  # wakes it: restore, services started, health awaited
    assert response.status_code == 200, response.text
    assert client.get(ws_url(NS, "sleepy")).json()["state"] == "running"
    assert service_state(client, "sleepy", "web")["state"] == "running"


def test_a_proxy_key_opens_its_one_service_and_nothing_else(server, client):
    workspace_with_app(client, "keyed")
    app_service(client, "keyed")
    until_answers(client, "keyed")
    body = {"namespace": NS, "workspace": "keyed", "service": "web", "scopes": ["proxy"], "label": "chat"}
    minted = client.post("/v1/keys", json=body)
    assert minted.status_code == 201, minted.text
    key = minted.json()["key"]
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as as_key:
        response = as_key.post("/v1/proxy/v1/echo", content=b"{}")
        assert response.status_code == 200, response.text
        assert response.json()["path"] == "/v1/echo" and key not in response.text
        assert response.json()["headers"]["x-forwarded-prefix"] == "/v1/proxy"
        refused = [
            as_key.get(ws_url(NS, "keyed", "ports", "8000") + "/echo"),
            as_key.get(ws_url(NS, "keyed")),
            as_key.get("/v1/workspaces"),
        ]
        assert all(r.status_code == 403 for r in refused), [r.text for r in refused]
    assert client.get("/v1/proxy/v1/echo").json()["error"]["code"] == "forbidden"  # the token names no service


def test_a_client_that_leaves_mid_stream_frees_the_upstream(client):
    workspace_with_app(client, "leaver")
    app_service(client, "leaver")
    until_answers(client, "leaver")
    with client.stream("GET", ws_url(NS, "leaver", "ports", "8000") + "/forever") as streamed:
        for chunk in streamed.iter_raw():
            if len(chunk) > 0:
                break
    wait_until(
        lambda: output_of(exec_events(client, NS, "leaver", "cat /tmp/closed-8000 2>/dev/null || true")) == "closed\n",
        30,
        what="the service to see its client gone",
    )
