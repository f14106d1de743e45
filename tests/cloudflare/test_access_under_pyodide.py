"""Cloudflare Access on the Worker for real: src/entry.py under Pyodide (the harness) with ACCESS_TEAM_DOMAIN pointing
at a JWKS server on loopback. The JWKS is fetched with the runtime's `fetch` (Node's, in the harness) and signatures
are checked by WebCrypto (crypto.subtle), with real RS256 tokens signed by keys made here."""

import time

import pytest
from jwks_fixtures import AUD, CERTS, JwksServer, Key

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def keys():
    return {"a": Key("kid-a"), "b": Key("kid-b"), "forger": Key("kid-a")}  # the forger claims kid-a


@pytest.fixture(scope="module")
def jwks(keys):
    with JwksServer(keys["a"]) as server:
        yield server


@pytest.fixture(scope="module")
def harness_vars(jwks):
    """Overrides conftest's: this module's Worker sits behind Access (the harness is started after the JWKS server
    and stopped before it)."""
    return {"ACCESS_TEAM_DOMAIN": jwks.origin, "ACCESS_AUD": AUD}


def health(harness, jwt_token: str | None, token: str | None = None):
    with harness.client(token) as client:
        headers = {} if jwt_token is None else {"cf-access-jwt-assertion": jwt_token}
        return client.get("/v1/health", headers=headers)


def refused(response) -> str:
    assert response.status_code == 401, response.text
    assert response.json()["error"]["code"] == "access_denied"
    return response.json()["error"]["message"]


def test_webcrypto_accepts_a_valid_token_and_the_isolate_caches_the_keys(harness, jwks, keys):
    for _ in range(3):  # a new Edge per request: only a module-level cache spares the later fetches
        response = health(harness, jwks.token(keys["a"]))
        assert response.status_code == 200, response.text
    assert jwks.paths == [CERTS]


def test_webcrypto_refuses_a_wrong_signature(harness, jwks, keys):
    good = jwks.token(keys["a"])
    h, _, s = good.split(".")
    other_claims = jwks.token(keys["a"], aud=[AUD, "elsewhere"]).split(".")[1]
    for bad in (jwks.token(keys["forger"]), f"{h}.{other_claims}.{s}"):
        assert "signature does not verify" in refused(health(harness, bad))
    assert health(harness, good).status_code == 200


def test_access_runs_first_and_checks_the_claims(harness, jwks, keys):
    now = int(time.time())
    for bad in (
        None,
        jwks.token(keys["a"], exp=now - 120),
        jwks.token(keys["a"], aud="some-other-application"),
        jwks.token(keys["a"], iss="https://otherteam.cloudflareaccess.com"),
    ):
        for token in (None, "wrong-" + "x" * 40):  # the harness's valid token, then a wrong one
            refused(health(harness, bad, token))
    with harness.client("wrong-" + "x" * 40) as client:  # past Access, the bearer token is still required
        response = client.get("/v1/health", headers={"cf-access-jwt-assertion": jwks.token(keys["a"])})
        assert response.status_code == 401 and response.json()["error"]["code"] == "unauthorized"


def test_a_rotation_is_followed(harness, jwks, keys):
    assert health(harness, jwks.token(keys["a"])).status_code == 200
    fetches = jwks.paths.count(CERTS)
    jwks.keys = [keys["b"]]  # Access rotated: b signs, a is retired
    response = health(harness, jwks.token(keys["b"]))
    assert response.status_code == 200, response.text
    assert jwks.paths.count(CERTS) == fetches + 1
    assert "does not publish" in refused(health(harness, jwks.token(keys["a"])))
    assert health(harness, jwks.token(keys["b"])).status_code == 200
    assert jwks.paths.count(CERTS) == fetches + 1
