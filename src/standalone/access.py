"""Cloudflare Access on the standalone runtime: worker.access.AccessCheck with the JWKS fetched by httpx and RS256
checked by cryptography (through PyJWT's JWK loader). Built once per server, so its key cache lives as long."""

import functools
import json
import time

import httpx
import jwt
from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey
from jwt.algorithms import RSAAlgorithm

from durable.settings import Settings
from worker.access import FETCH_TIMEOUT, AccessCheck

MAX_JWKS_BYTES = 256 * 1024  # a JWKS is a few KiB; a bigger answer is not one and is not read to the end

_RS256 = RSAAlgorithm(RSAAlgorithm.SHA256)


def access_gate(settings: Settings) -> AccessCheck | None:
    if settings.access_team_domain is None or settings.access_aud is None:
        return None
    return AccessCheck(
        team_domain=settings.access_team_domain,
        aud=settings.access_aud,
        fetch_jwks=fetch_jwks,
        verify=verify,
        clock=time.time,  # exp/nbf are wall-clock times
    )


async def fetch_jwks(url: str) -> dict:
    # trust_env stays on: an operator behind an egress proxy reaches Cloudflare through HTTPS_PROXY
    async with httpx.AsyncClient(timeout=FETCH_TIMEOUT, follow_redirects=False) as client:
        async with client.stream("GET", url, headers={"accept": "application/json"}) as response:
            response.raise_for_status()
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_JWKS_BYTES:
                    raise ValueError(f"the JWKS is over {MAX_JWKS_BYTES} bytes")
    return json.loads(body)


@functools.lru_cache(maxsize=16)
def _public_key(n: str, e: str) -> RSAPublicKey:
    # loading a key per request is wasted work: the JWKS holds one or two keys for weeks
    return jwt.PyJWK({"kty": "RSA", "n": n, "e": e}, algorithm="RS256").key


async def verify(jwk: dict, signing_input: bytes, signature: bytes) -> bool:
    return bool(_RS256.verify(signing_input, _public_key(jwk["n"], jwk["e"]), signature))
