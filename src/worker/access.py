"""Cloudflare Access in front of every route: the one decision, runtime-neutral (CPython and Pyodide).

Access signs a JWT (RS256) for every request it lets through and sends it as `Cf-Access-Jwt-Assertion`. This module
parses that token, checks its claims against ACCESS_TEAM_DOMAIN / ACCESS_AUD and checks its signature with a key of the
team's JWKS (`<team origin>/cdn-cgi/access/certs`). Each runtime injects only the I/O: how to fetch the JWKS and how to
verify an RSA signature (standalone/access.py: httpx + cryptography; cloudflare/access.py: fetch + WebCrypto).

Fails closed: a token that cannot be checked (the JWKS unreachable and no usable cached key) is refused, never passed.
No message or log line quotes the token.
"""

import asyncio
import base64
import json
import logging
import math
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from protocol.errors import ProtocolError

log = logging.getLogger("flarebox.access")

HEADER = "cf-access-jwt-assertion"  # as the edge's headers carry it (lower-case names)
CERTS_PATH = "/cdn-cgi/access/certs"
CLOCK_SKEW = 60  # seconds either side of exp/nbf: clocks of Access and of this runtime may disagree a little
KEYS_TTL = 600  # the JWKS is fetched again after this long, so a rotation is picked up without an unknown kid
REFETCH_INTERVAL = 30  # at most one JWKS fetch per this many seconds for unknown kids (and for retries)
STALE_LIMIT = 3600  # while the JWKS cannot be fetched, cached keys keep working this long after their last fetch
FETCH_TIMEOUT = 5  # seconds, for the adapters' JWKS fetch
MAX_TOKEN_CHARS = 16 * 1024  # Access tokens are a few KiB at most; anything bigger is not one
MAX_KID_CHARS = 256
MAX_KEYS = 32  # a JWKS holds the current and the previous key; more than this is not Cloudflare's

FetchJwks = Callable[[str], Awaitable[Any]]
Verify = Callable[[dict, bytes, bytes], Awaitable[bool]]

_B64URL = re.compile(r"[A-Za-z0-9_-]*")
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
_HOW = "sign in through Access, or send a service token's CF-Access-Client-Id and CF-Access-Client-Secret headers"
UNCHECKED = (
    "Cloudflare Access could not be checked: the team's signing keys (JWKS) could not be fetched, so nothing ran"
    " — retry shortly"
)


def denied(reason: str) -> ProtocolError:
    """access_denied saying why. `reason` never quotes the token."""
    return ProtocolError("access_denied", f"Cloudflare Access did not let this request through: {reason}; {_HOW}")


# --- the team's origin ------------------------------------------------------------------------------------------


def team_origin(value: str) -> str:
    """ACCESS_TEAM_DOMAIN as the origin Access issues tokens from (the `iss` claim, and where the JWKS lives).

    `myteam.cloudflareaccess.com` or `https://myteam.cloudflareaccess.com[:port]`; plain http only on loopback
    (`http://127.0.0.1:PORT`, `http://localhost:PORT`, `http://[::1]:PORT`), for a local JWKS. Raises ValueError
    naming the variable."""
    text = str(value).strip()
    if "://" not in text:
        scheme, authority = "https", text
    else:
        scheme, _, authority = text.partition("://")
        scheme = scheme.lower()
        if scheme not in ("https", "http"):
            raise ValueError(f"ACCESS_TEAM_DOMAIN must be a domain or an https:// origin, not {scheme}://")
        if authority.endswith("/"):
            authority = authority[:-1]
    if not authority or any(c in authority for c in "/?#@\\ \t"):
        raise ValueError("ACCESS_TEAM_DOMAIN must be a bare domain or an origin (no path, query or user)")
    host, port = authority.lower(), ""
    if host.startswith("["):  # an IPv6 literal: only loopback is meaningful here
        bracket = host.find("]")
        host, rest = host[: bracket + 1], host[bracket + 1 :]
        if bracket < 0 or (rest and not rest.startswith(":")):
            raise ValueError("ACCESS_TEAM_DOMAIN has a malformed IPv6 address")
        port = rest[1:] if rest else ""
        if rest and not port:
            raise ValueError("ACCESS_TEAM_DOMAIN has an empty port")
    elif ":" in host:
        host, _, port = host.partition(":")
        if not port:
            raise ValueError("ACCESS_TEAM_DOMAIN has an empty port")
    if port and not (port.isdigit() and port.isascii() and 1 <= int(port) <= 65535):
        raise ValueError("ACCESS_TEAM_DOMAIN has a bad port")
    if port and "://" not in text:
        raise ValueError("ACCESS_TEAM_DOMAIN: a port needs the full origin (https://host:port)")
    if scheme == "http" and host not in _LOOPBACK:
        raise ValueError("ACCESS_TEAM_DOMAIN: plain http:// is only for a loopback address; use https://")
    if host not in _LOOPBACK:
        labels = host.split(".")
        if len(labels) < 2 or not all(_LABEL.fullmatch(label) for label in labels):
            raise ValueError(
                "ACCESS_TEAM_DOMAIN must be the team's domain, such as myteam.cloudflareaccess.com"
                f" (got {text[:100]!r})"
            )
    if port and int(port) == (443 if scheme == "https" else 80):
        port = ""  # the default port: `iss` never spells it
    return f"{scheme}://{host}" + (f":{port}" if port else "")


# --- the token --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AccessJwt:
    kid: str
    claims: dict[str, Any]
    signing_input: bytes  # what the signature covers: the first two segments as sent
    signature: bytes


class _Malformed(Exception):
    pass


def _b64url(segment: str) -> bytes:
    # strict: the decoder alone would skip characters outside the alphabet
    if not _B64URL.fullmatch(segment) or len(segment) % 4 == 1:
        raise _Malformed
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # duplicate names would let two readers of the same token see different claims
    out: dict[str, Any] = {}
    for name, value in pairs:
        if name in out:
            raise _Malformed
        out[name] = value
    return out


def _no_constant(_name: str) -> Any:
    raise _Malformed  # NaN / Infinity are not JSON


def _json_object(segment: str) -> dict[str, Any]:
    try:
        text = _b64url(segment).decode("utf-8")
        value = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise _Malformed from None
    if not isinstance(value, dict):
        raise _Malformed
    return value


def parse_jwt(token: str) -> AccessJwt:
    """The compact JWS as Access sends it: RS256 with a `kid`. Anything else is access_denied (the signature is
    not checked here)."""
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_CHARS or not token.isascii():
        raise denied("the Cf-Access-Jwt-Assertion header is not an Access token")
    parts = token.split(".")
    try:
        if len(parts) != 3:
            raise _Malformed
        header = _json_object(parts[0])
        claims = _json_object(parts[1])
        signature = _b64url(parts[2])
        if not signature:
            raise _Malformed
    except _Malformed:
        raise denied("the Cf-Access-Jwt-Assertion header is not an Access token") from None
    # only RS256: "none", HS256 (a public key used as an HMAC secret) and the rest are what forgeries try
    if header.get("alg") != "RS256":
        raise denied("the Access token is not signed with RS256")
    if "crit" in header:  # extensions this check does not understand must not be ignored (RFC 7515 4.1.11)
        raise denied("the Access token has critical header extensions")
    kid = header.get("kid")
    if not isinstance(kid, str) or not kid or len(kid) > MAX_KID_CHARS:
        raise denied("the Access token names no signing key (kid)")
    return AccessJwt(kid, claims, f"{parts[0]}.{parts[1]}".encode("ascii"), signature)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_claims(claims: dict[str, Any], *, aud: str, issuer: str, now: float, skew: float = CLOCK_SKEW) -> None:
    """aud (a string or a list) holds ACCESS_AUD, iss is the team's origin, exp (required) has not passed and nbf
    (when present) has, each with `skew` seconds of tolerance."""
    audience = claims.get("aud")
    if isinstance(audience, str):
        audience = [audience]
    if not isinstance(audience, list) or not all(isinstance(a, str) for a in audience):
        raise denied("the Access token has no audience")
    if aud not in audience:
        raise denied("the Access token is for another application (aud)")
    if claims.get("iss") != issuer:
        raise denied("the Access token was issued by another team (iss)")
    exp = claims.get("exp")
    if not _number(exp):
        raise denied("the Access token has no expiry (exp)")
    if exp <= now - skew:
        raise denied("the Access token has expired")
    nbf = claims.get("nbf")
    if nbf is not None:
        if not _number(nbf):
            raise denied("the Access token has a malformed nbf")
        if nbf > now + skew:
            raise denied("the Access token is not valid yet (nbf)")


# --- the team's keys --------------------------------------------------------------------------------------------


def parse_jwks(document: Any) -> dict[str, dict[str, str]]:
    """kid → public RSA key ({"kty", "n", "e"}: all either verifier needs) of the RS256 signing keys in a JWKS.
    Raises ValueError for a document with none (treated like a failed fetch: the cache keeps its keys)."""
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise ValueError("the JWKS is not a {keys: [...]} object")
    keys: dict[str, dict[str, str]] = {}
    for jwk in document["keys"][:MAX_KEYS]:
        if not isinstance(jwk, dict) or jwk.get("kty") != "RSA":
            continue
        if jwk.get("use", "sig") != "sig" or jwk.get("alg", "RS256") != "RS256":
            continue
        kid, n, e = jwk.get("kid"), jwk.get("n"), jwk.get("e")
        if not all(isinstance(v, str) and v and _B64URL.fullmatch(v) for v in (n, e)):
            continue
        if isinstance(kid, str) and kid and len(kid) <= MAX_KID_CHARS:
            keys[kid] = {"kty": "RSA", "n": n, "e": e}
    if not keys:
        raise ValueError("the JWKS holds no RS256 signing key")
    return keys


class AccessCheck:
    """worker.edge.AccessGate: one per team and application, shared by every request of the process (isolate), so
    its JWKS cache outlives a request.

    Keys are cached by kid and fetched again once KEYS_TTL old. A token naming a kid the fresh cache lacks (a
    rotation) fetches them again too, but such fetches happen at most once per REFETCH_INTERVAL, so tokens with
    made-up kids cannot hammer the JWKS endpoint; retries after a failed fetch keep to the same interval. While
    fetches fail, keys fetched less than STALE_LIMIT ago keep working; past that, every request is refused as
    unchecked. At most two fetches per interval, then: a due refresh and one for an unknown kid."""

    def __init__(
        self,
        *,
        team_domain: str,
        aud: str,
        fetch_jwks: FetchJwks,
        verify: Verify,
        clock: Callable[[], float],
        skew: float = CLOCK_SKEW,
        ttl: float = KEYS_TTL,
        refetch_interval: float = REFETCH_INTERVAL,
        stale_limit: float = STALE_LIMIT,
    ):
        if not aud or not str(aud).strip():
            raise ValueError("ACCESS_AUD is empty")
        self.origin = team_origin(team_domain)
        self.aud = str(aud).strip()
        self.jwks_url = self.origin + CERTS_PATH
        self._fetch_jwks = fetch_jwks
        self._verify = verify
        self._clock = clock
        self._skew = skew
        self._ttl = ttl
        self._refetch_interval = refetch_interval
        self._stale_limit = stale_limit
        self._keys: dict[str, dict[str, str]] = {}
        self._fetched_at: float | None = None  # last successful fetch
        self._attempted_at: float | None = None  # last fetch of any kind, successful or not
        self._unknown_at: float | None = None  # last fetch an unknown kid asked for
        self._failing = False  # the last fetch failed
        self._lock = asyncio.Lock()  # requests needing a fetch wait for the one in flight instead of starting more

    async def check(self, headers: dict[str, str]) -> None:
        token = (headers.get(HEADER) or "").strip()
        if not token:
            raise denied("the request has no Cf-Access-Jwt-Assertion header")
        jwt = parse_jwt(token)
        key = await self._key(jwt.kid)
        try:
            ok = await self._verify(key, jwt.signing_input, jwt.signature)
        except Exception as exc:  # a key the verifier cannot use counts as a signature that does not verify
            log.warning("Cloudflare Access: verifying with key %r failed: %s", jwt.kid, type(exc).__name__)
            ok = False
        if ok is not True:  # exactly True: a verifier returning something truthy by mistake must not open the door
            raise denied("the Access token's signature does not verify")
        check_claims(jwt.claims, aud=self.aud, issuer=self.origin, now=self._clock(), skew=self._skew)

    async def _key(self, kid: str) -> dict[str, str]:
        if kid in self._keys and self._age_below(self._ttl):
            return self._keys[kid]
        async with self._lock:  # re-decided under the lock: the request before may just have fetched
            if not self._age_below(self._ttl):  # nothing cached yet, or due for a refresh
                if self._elapsed(self._attempted_at):
                    await self._refresh()
            elif kid not in self._keys and self._elapsed(self._unknown_at):
                self._unknown_at = self._clock()
                await self._refresh()
            usable = self._age_below(self._stale_limit)
            if usable and kid in self._keys:
                return self._keys[kid]
        if not usable or self._failing:  # the kid may well be published: the keys could not be fetched to tell
            raise ProtocolError("access_denied", UNCHECKED)
        raise denied("the Access token is signed by a key the team does not publish")

    def _age_below(self, limit: float) -> bool:
        if self._fetched_at is None:
            return False
        age = self._clock() - self._fetched_at
        return 0 <= age < limit  # a clock that went backwards makes the cache stale, not eternal

    def _elapsed(self, since: float | None) -> bool:
        """REFETCH_INTERVAL has passed since `since` (or the clock went backwards past it)."""
        if since is None:
            return True
        elapsed = self._clock() - since
        return elapsed < 0 or elapsed >= self._refetch_interval

    async def _refresh(self) -> None:
        self._attempted_at = self._clock()
        try:
            keys = parse_jwks(await self._fetch_jwks(self.jwks_url))
        except Exception as exc:
            self._failing = True
            log.warning("Cloudflare Access: fetching %s failed: %s: %s", self.jwks_url, type(exc).__name__, exc)
            return
        self._keys = keys
        self._fetched_at = self._clock()
        self._failing = False
        log.info("Cloudflare Access: %d signing key(s) from %s", len(keys), self.jwks_url)
