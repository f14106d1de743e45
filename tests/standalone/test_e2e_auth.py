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


def test_generated_token_is_stored_0600_and_never_written_to_a_redirected_log(start_server):
    import os
    import stat

    from e2e import ServerProcess

    srv = start_server(token=None)  # no SANDBOX_API_TOKEN: the server makes one
    token_file = srv.data_dir / "token"
    token = token_file.read_text().strip()
    assert len(token) >= 32 and stat.S_IMODE(os.stat(token_file).st_mode) == 0o600
    # the output goes to a log file, not a terminal: where the token is stored, never the token itself (shown once
    # on a terminal: tests/standalone/test_cli_terminal.py)
    assert token not in srv.output() and f"stored it in {token_file}" in srv.output()
    assert httpx.get(srv.url + "/v1/health", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    srv.stop()

    again = ServerProcess(srv.data_dir, {}, token=None)
    again.log_path = srv.log_path.with_name("restarted.log")
    try:
        again.start()
        assert str(token_file) in again.output() and token not in again.output()
        assert httpx.get(again.url + "/v1/health", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    finally:
        again.stop()
