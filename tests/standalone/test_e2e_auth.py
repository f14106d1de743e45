"""Auth at the edge of a real server: before any workspace is touched or any body read."""

import pytest

pytestmark = pytest.mark.timeout(60)


def test_health_needs_the_token(server):
    import httpx

    ok = httpx.get(server.url + "/v1/health", headers=server.headers())
    assert ok.status_code == 200
    assert ok.json()["ok"] is True and ok.json()["protocol"] == 1
    missing = httpx.get(server.url + "/v1/health")
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "unauthorized"
    wrong = httpx.get(server.url + "/v1/health", headers=server.headers("y" * 64))
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "unauthorized"
    assert server.token not in server.output()
