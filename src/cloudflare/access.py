"""Cloudflare Access on the Worker: worker.access.AccessCheck with the JWKS fetched by `fetch` and RS256 checked by
WebCrypto (crypto.subtle). The Worker builds an Edge per request, so the check (and its key cache) lives at module
level: one per isolate."""

import json
import time
from typing import Any

import js
from pyodide.ffi import to_js

from cloudflare.jsutil import jsobj, uint8
from durable.settings import Settings
from worker.access import FETCH_TIMEOUT, AccessCheck

_ALGORITHM = {"name": "RSASSA-PKCS1-v1_5", "hash": "SHA-256"}
_checks: dict[tuple[str, str], AccessCheck] = {}  # (team domain, aud) → the isolate's check
_crypto_keys: dict[tuple[str, str], Any] = {}  # (n, e) → imported CryptoKey: importKey once per key, not per request
MAX_CRYPTO_KEYS = 16


def access_gate(settings: Settings) -> AccessCheck | None:
    if settings.access_team_domain is None or settings.access_aud is None:
        return None
    which = (settings.access_team_domain, settings.access_aud)
    check = _checks.get(which)
    if check is None:
        check = _checks[which] = AccessCheck(
            team_domain=settings.access_team_domain,
            aud=settings.access_aud,
            fetch_jwks=fetch_jwks,
            verify=verify,
            clock=time.time,  # Date.now under Pyodide
        )
    return check


async def fetch_jwks(url: str) -> Any:
    init = {
        "headers": {"accept": "application/json"},
        "redirect": "error",  # the JWKS is served where it is asked for
        "signal": js.AbortSignal.timeout(int(FETCH_TIMEOUT * 1000)),
    }
    response = await js.fetch(url, jsobj(init))
    if not response.ok:
        raise RuntimeError(f"the JWKS answered HTTP {response.status}")
    return json.loads(str(await response.text()))


async def _crypto_key(n: str, e: str) -> Any:
    key = _crypto_keys.get((n, e))
    if key is None:
        # only kty/n/e: WebCrypto checks a JWK's alg/use/key_ops/ext against its arguments, and a public key needs none
        key = await js.crypto.subtle.importKey(
            "jwk", jsobj({"kty": "RSA", "n": n, "e": e}), jsobj(_ALGORITHM), False, to_js(["verify"])
        )
        if len(_crypto_keys) >= MAX_CRYPTO_KEYS:
            _crypto_keys.clear()
        _crypto_keys[(n, e)] = key
    return key


async def verify(jwk: dict, signing_input: bytes, signature: bytes) -> bool:
    key = await _crypto_key(jwk["n"], jwk["e"])
    return bool(await js.crypto.subtle.verify(jsobj(_ALGORITHM), key, uint8(signature), uint8(signing_input)))
