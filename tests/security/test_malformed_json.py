"""Malformed JSON through a real `flarebox serve`: what once answered 500 (an integer too large for a float, a body
nested past the parser's stack, a key named twice) is a 400 with a documented code, and nothing runs or is created."""

import pytest
from e2e import rid, run_ok, ws_url

pytestmark = pytest.mark.timeout(120)

JSON = {"content-type": "application/json"}


def _bodies(request_id: str) -> dict[str, tuple[bytes, str]]:
    deep = b"[" * 5000 + b"]" * 5000
    return {
        "huge timeout": (
            b'{"request_id":"%s","command":"touch /workspace/ran","timeout":%s}' % (request_id.encode(), b"9" * 400),
            "invalid_timeout",
        ),
        "deep": (
            b'{"request_id":"%s","command":"touch /workspace/ran","env":{"A":%s}}' % (request_id.encode(), deep),
            "invalid_json",
        ),
        "duplicate": (
            b'{"request_id":"%s","command":"true","command":"touch /workspace/ran"}' % request_id.encode(),
            "invalid_json",
        ),
    }


def test_malformed_exec_bodies_are_400_and_run_nothing(secure_server):
    with secure_server.client() as client:
        assert client.put(ws_url("json", "w"), json={}).status_code in (200, 201)
        for name, (body, code) in _bodies(rid()).items():
            response = client.post(ws_url("json", "w", "exec"), content=body, headers=JSON)
            assert response.status_code == 400, (name, response.status_code, response.text)
            assert response.json()["error"]["code"] == code, name
        assert run_ok(client, "json", "w", "test -e /workspace/ran && echo ran || echo nothing")[0] == "nothing\n"


def test_malformed_workspace_configs_are_400_and_create_nothing(secure_server):
    with secure_server.client() as client:
        for body in (b'{"cwd":' + b"[" * 5000 + b"]" * 5000 + b"}", b'{"persistent":true,"persistent":false}'):
            response = client.put(ws_url("json", "never"), content=body, headers=JSON)
            assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json", response.text
        assert client.get(ws_url("json", "never")).status_code == 404
