"""Auth runs first on every route: 503 without a usable secret, 401 for a wrong token, nothing read before."""

import base64
import hashlib
import json

import pytest
from edge_doubles import TOKEN, Body, Workspaces, auth, directory_object

from durable.settings import Settings
from protocol import limits
from worker import auth as auth_module
from worker.edge import Edge
from worker.request import EdgeRequest

ROUTES = [
    ("GET", "/v1/health", ""),
    ("PUT", "/v1/workspaces/a/b", ""),
    ("POST", "/v1/workspaces/a/b/exec", ""),
    ("PUT", "/v1/workspaces/a/b/files", "path=/x"),
    ("DELETE", "/v1/workspaces/a/b", "confirm=true"),
    ("GET", "/nowhere", ""),
]


def make_edge(token):
    workspaces = Workspaces()
    return Edge(
        token=token, settings=Settings(), workspaces=workspaces, directory=directory_object(), version="0.1.0"
    ), workspaces


def code(resp):
    return json.loads(resp.body)["error"]["code"]


@pytest.mark.parametrize("token", [None, "", "x" * (limits.MIN_TOKEN_CHARS - 1)])
@pytest.mark.parametrize("method,path,query", ROUTES)
async def test_missing_or_short_secret_is_503_everywhere(token, method, path, query):
    edge, workspaces = make_edge(token)
    body = Body(forbidden=True)
    headers = {**auth(token or "whatever"), "content-type": "application/json", "content-length": "10"}
    resp = await edge.handle(EdgeRequest(method, path, query, headers, body))
    assert (resp.status, code(resp)) == (503, "not_configured")
    assert not body.read_called and workspaces.calls == []


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        f"Basic {TOKEN}",
        f"Bearer {TOKEN[:-1]}",
        f"Bearer {TOKEN}x",
        f"Bearer {TOKEN.upper()}",
        TOKEN,
    ],
)
@pytest.mark.parametrize("method,path,query", ROUTES)
async def test_wrong_token_is_401_before_anything(header, method, path, query):
    edge, workspaces = make_edge(TOKEN)
    body = Body(forbidden=True)
    headers = {"content-type": "application/json", "content-length": "10"}
    if header is not None:
        headers["authorization"] = header
    resp = await edge.handle(EdgeRequest(method, path, query, headers, body))
    assert (resp.status, code(resp)) == (401, "unauthorized")
    assert not body.read_called and workspaces.calls == []
    assert TOKEN.encode() not in resp.body


async def test_minimum_length_secret_works_and_scheme_is_case_insensitive():
    token = "k" * limits.MIN_TOKEN_CHARS
    edge, _ = make_edge(token)
    for scheme in ("Bearer", "bearer", "BEARER"):
        resp = await edge.handle(EdgeRequest("GET", "/v1/health", "", {"authorization": f"{scheme} {token}"}))
        assert resp.status == 200
        assert json.loads(resp.body) == {"ok": True, "protocol": 1, "version": "0.1.0"}


async def test_comparison_is_between_fixed_length_digests(monkeypatch):
    seen = []
    real = auth_module.hmac.compare_digest

    def spy(a, b):
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth_module.hmac, "compare_digest", spy)
    edge, _ = make_edge(TOKEN)
    for headers in ({}, auth("short"), auth("y" * 500), auth(TOKEN)):
        await edge.handle(EdgeRequest("GET", "/v1/health", "", headers))
    # every request, even one without a header, went through one digest comparison of equal-length values
    assert len(seen) == 4
    expected = hashlib.sha256(TOKEN.encode()).digest()
    assert all(len(a) == len(b) == 32 and b == expected for a, b in seen)
    assert all(a != TOKEN.encode() for a, _ in seen)  # raw tokens are never compared


async def test_health_starts_nothing():
    edge, workspaces = make_edge(TOKEN)
    resp = await edge.handle(EdgeRequest("GET", "/v1/health", "", auth()))
    assert resp.status == 200 and workspaces.calls == []


def _subprotocols(*offered: str) -> dict[str, str]:
    return {"sec-websocket-protocol": ", ".join(offered)}


def test_a_websocket_may_carry_its_credential_as_a_subprotocol_and_nothing_else_may():
    encoded = base64.urlsafe_b64encode(TOKEN.encode()).decode().rstrip("=")
    offered = _subprotocols("flarebox", f"flarebox.bearer.{encoded}")
    assert auth_module.credential(offered, websocket=True) == TOKEN
    # an ordinary request never reads it: the header is the only credential there
    assert auth_module.credential(offered, websocket=False) == ""
    # the Authorization header wins when both are sent
    both = {**offered, "authorization": "Bearer other-credential"}
    assert auth_module.credential(both, websocket=True) == "other-credential"
    # not base64url of UTF-8, or no bearer subprotocol at all: no credential (then 401, never a 500)
    assert auth_module.credential(_subprotocols("flarebox.bearer.%%%"), websocket=True) == ""
    assert auth_module.credential(_subprotocols("flarebox.bearer._w"), websocket=True) == ""  # 0xff: not UTF-8
    assert auth_module.credential(_subprotocols("flarebox"), websocket=True) == ""
