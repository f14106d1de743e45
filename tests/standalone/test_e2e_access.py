"""Cloudflare Access in front of a real `flarebox serve`: ACCESS_TEAM_DOMAIN points at a JWKS server on loopback
(a real HTTP server run by this module), tokens are real RS256 JWTs signed with keys made here, and the server
fetches, caches and verifies with its real adapters (httpx, cryptography)."""

import os
import subprocess
import time

import httpx
import jwt
import pytest
from e2e import QUIET, TOKEN, flarebox_command, free_port, serving, ws_url
from jwks_fixtures import AUD, CERTS, JwksServer, Key

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def keys():
    return {"a": Key("kid-a"), "b": Key("kid-b"), "forger": Key("kid-a")}  # the forger claims kid-a


@pytest.fixture(scope="module")
def jwks(keys):
    with JwksServer(keys["a"]) as server:
        yield server


@pytest.fixture(scope="module")
def server(jwks):
    # NO_PROXY: a developer's proxy settings must not send the loopback JWKS fetch elsewhere
    env = {**QUIET, "ACCESS_TEAM_DOMAIN": jwks.origin, "ACCESS_AUD": AUD, "NO_PROXY": "127.0.0.1,localhost"}
    with serving(env) as proc:
        yield proc


def get(server, jwt_token: str | None, token: str | None = TOKEN, path: str = "/v1/health", method: str = "GET"):
    headers = {"authorization": f"Bearer {token}"} if token else {}
    if jwt_token is not None:
        headers["cf-access-jwt-assertion"] = jwt_token
    return httpx.request(method, server.url + path, headers=headers, timeout=30)


def refused(response: httpx.Response, jwt_token: str | None = None) -> str:
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert error["code"] == "access_denied"
    assert jwt_token is None or jwt_token not in response.text
    return error["message"]


def test_a_valid_access_token_and_bearer_token_pass(server, jwks, keys):
    fetched_before = len(jwks.paths)
    for _ in range(3):
        response = get(server, jwks.token(keys["a"]))
        assert response.status_code == 200, response.text
        assert response.json()["ok"] is True
    assert jwks.paths[fetched_before:] in ([CERTS], [])  # at most one fetch: the rest came from the cache
    assert CERTS in jwks.paths


def test_access_runs_before_the_bearer_token(server, jwks, keys):
    now = int(time.time())
    good = jwks.token(keys["a"])
    h, p, _ = good.split(".")
    cases = {
        "missing": None,
        "expired": jwks.token(keys["a"], exp=now - 120, nbf=now - 600),
        "not yet valid": jwks.token(keys["a"], nbf=now + 600),
        "wrong aud": jwks.token(keys["a"], aud=["some-other-application"]),
        "wrong iss": jwks.token(keys["a"], iss="https://otherteam.cloudflareaccess.com"),
        "wrong signature": jwks.token(keys["forger"]),
        "alg none": f"{h}.{p}.",
        "garbage": "not-a-jwt",
    }
    for name, bad in cases.items():
        for token in (TOKEN, None, "wrong-" + "x" * 40):  # a valid bearer token does not get past Access either
            message = refused(get(server, bad, token), bad)
            assert "Cloudflare Access" in message, name
    assert good not in server.output()  # no token reached the log


def test_a_valid_access_token_still_needs_the_bearer_token(server, jwks, keys):
    for token in (None, "wrong-" + "x" * 40):
        response = get(server, jwks.token(keys["a"]), token)
        assert response.status_code == 401 and response.json()["error"]["code"] == "unauthorized"


def test_a_refused_request_never_reaches_a_workspace(server, jwks, keys):
    refused(get(server, None, path=ws_url("access", "probe"), method="PUT"))
    response = get(server, jwks.token(keys["a"]), path=ws_url("access", "probe"))
    assert response.status_code == 404 and response.json()["error"]["code"] == "workspace_not_found"


def test_a_rotated_jwks_is_followed(server, jwks, keys):
    assert get(server, jwks.token(keys["a"])).status_code == 200  # key a is cached
    jwks.keys = [keys["b"]]  # Access rotated: b signs, a is retired
    fetched_before = jwks.paths.count(CERTS)
    response = get(server, jwks.token(keys["b"]))
    assert response.status_code == 200, response.text
    assert jwks.paths.count(CERTS) == fetched_before + 1  # the unknown kid fetched the keys again, once
    assert "does not publish" in refused(get(server, jwks.token(keys["a"])))
    assert get(server, jwks.token(keys["b"])).status_code == 200
    assert jwks.paths.count(CERTS) == fetched_before + 1


def test_an_unreachable_jwks_refuses_everything(keys):
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    env = {**QUIET, "ACCESS_TEAM_DOMAIN": dead, "ACCESS_AUD": AUD, "NO_PROXY": "127.0.0.1,localhost"}
    now = int(time.time())
    token = jwt.encode(
        {"aud": AUD, "iss": dead, "exp": now + 300}, keys["a"].private, algorithm="RS256", headers={"kid": "kid-a"}
    )
    with serving(env) as srv:
        message = refused(get(srv, token), token)
        assert "could not be checked" in message


def test_a_bad_team_domain_stops_the_server_at_start(tmp_path):
    env = {"ACCESS_TEAM_DOMAIN": "http://myteam.cloudflareaccess.com", "ACCESS_AUD": AUD, "SANDBOX_API_TOKEN": TOKEN}
    result = subprocess.run(
        [*flarebox_command(), "serve", "--port", str(free_port()), "--data-dir", str(tmp_path)],
        env={**_base_env(), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "ACCESS_TEAM_DOMAIN" in result.stderr


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("HERMES_CF_", "SANDBOX_API_TOKEN", "ACCESS_"))}
