"""Auth at the edge of a real server: checked before any workspace is touched or any body read."""

import httpx
import pytest
from e2e import rid, ws_url

pytestmark = pytest.mark.timeout(90)


def test_missing_or_wrong_token_is_401_and_touches_nothing(server):
    ok = httpx.get(server.url + "/v1/health", headers=server.headers())
    assert ok.status_code == 200
    assert ok.json() == {"ok": True, "protocol": 1, "version": ok.json()["version"]}
    for headers in ({}, server.headers("y" * 64), {"Authorization": "Basic " + server.token}):
        for method, path in (("GET", "/v1/health"), ("PUT", ws_url("auth", "nobody")), ("GET", ws_url("auth", "x"))):
            response = httpx.request(method, server.url + path, headers=headers)
            assert response.status_code == 401, (method, path, headers)
            assert response.json()["error"]["code"] == "unauthorized"
    # the PUTs above were refused before reaching a workspace: it does not exist
    with server.client() as client:
        assert client.get(ws_url("auth", "nobody")).status_code == 404
    assert not (server.data_dir / "workspaces" / "auth").exists() or not any(
        (server.data_dir / "workspaces" / "auth").glob("nobody/*")
    )


def test_token_never_reaches_the_log(server):
    httpx.get(server.url + "/v1/health", headers=server.headers())
    httpx.get(server.url + "/v1/health?token=leak", headers=server.headers())
    log = server.output()
    assert "/v1/health" in log  # the access log is on...
    assert server.token not in log  # ...and never holds the token


def test_server_without_usable_token_answers_503_everywhere(start_server):
    srv = start_server(token="too-short")
    for token in ("too-short", "z" * 48, None):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        for method, path in (
            ("GET", "/v1/health"),
            ("PUT", ws_url("ns", "ws")),
            ("POST", ws_url("ns", "ws", "exec")),
            ("GET", ws_url("ns", "ws", "exec", rid())),
        ):
            response = httpx.request(method, srv.url + path, headers=headers, content=b"{}")
            assert response.status_code == 503, (method, path)
            assert response.json()["error"]["code"] == "not_configured"
    assert "too-short" not in srv.output()
    assert "503 not_configured" in srv.output()  # the start notice says why
