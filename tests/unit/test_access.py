"""Cloudflare Access (worker/access.py), exhaustively, with real RS256 tokens: PyJWT signs them with RSA keys made
here, and the standalone verifier (cryptography) checks them. Only the JWKS fetch is a double, so the tests can take
the endpoint down, rotate its keys and count how often it is asked."""

import asyncio
import base64
import json
import secrets

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from edge_doubles import TOKEN, Body, Workspaces, auth, directory_object
from jwt.algorithms import RSAAlgorithm

from durable.settings import Settings
from protocol.errors import ProtocolError
from standalone import access as standalone_access
from worker import access
from worker.access import UNCHECKED, AccessCheck, check_claims, parse_jwks, parse_jwt, team_origin
from worker.edge import Edge
from worker.request import EdgeRequest

TEAM = "myteam.cloudflareaccess.com"
ISS = "https://myteam.cloudflareaccess.com"
AUD = "4714c1358e65fe4b408ad6d432a5f878f08194bdb4752441fd56faefa9b2b6f2"
NOW = 1_800_000_000.0


class Key:
    def __init__(self, kid: str):
        self.kid = kid
        self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.jwk = {**RSAAlgorithm.to_jwk(self.private.public_key(), as_dict=True), "kid": kid, "alg": "RS256"}
        self.jwk["use"] = "sig"

    def sign(self, claims: dict | None = None, *, kid: str | None = None, **headers) -> str:
        body = {"aud": [AUD], "iss": ISS, "exp": NOW + 300, "nbf": NOW - 10, "iat": NOW - 10, **(claims or {})}
        body = {k: v for k, v in body.items() if v is not DROP}
        return jwt.encode(body, self.private, algorithm="RS256", headers={"kid": kid or self.kid, **headers})


DROP = object()  # a claim to leave out


@pytest.fixture(scope="module")
def key_a():
    return Key("kid-a")


@pytest.fixture(scope="module")
def key_b():
    return Key("kid-b")


@pytest.fixture(scope="module")
def stranger():
    return Key("kid-a")  # the same kid as key_a, another key: a forgery naming a real kid


class Clock:
    def __init__(self):
        self.now = NOW

    def __call__(self) -> float:
        return self.now


class Jwks:
    """The team's certs endpoint: serves `keys`, counts fetches, can be taken down."""

    def __init__(self, *keys: Key):
        self.keys = list(keys)
        self.fetches: list[str] = []
        self.down = False
        self.document = None  # when set, served instead of the keys (malformed answers)

    async def __call__(self, url: str) -> dict:
        self.fetches.append(url)
        await asyncio.sleep(0)  # a real fetch yields: concurrent checks really overlap
        if self.down:
            raise OSError("connection refused")
        if self.document is not None:
            return self.document
        return {"keys": [k.jwk for k in self.keys], "public_cert": {"kid": "x", "cert": "-----BEGIN..."}}


def make_check(jwks: Jwks, clock: Clock, verify=standalone_access.verify, **kw) -> AccessCheck:
    return AccessCheck(team_domain=TEAM, aud=AUD, fetch_jwks=jwks, verify=verify, clock=clock, **kw)


def header(token: str) -> dict[str, str]:
    return {"cf-access-jwt-assertion": token}


async def denied(check: AccessCheck, headers: dict[str, str]) -> str:
    with pytest.raises(ProtocolError) as info:
        await check.check(headers)
    err = info.value
    assert err.code == "access_denied" and err.status == 401
    token = headers.get("cf-access-jwt-assertion", "")
    for part in [token, *token.split(".")]:
        if len(part) >= 8:
            assert part not in err.message  # never quotes the token, nor a piece of it
    return err.message


def b64(data: bytes | str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


# --- the happy path -------------------------------------------------------------------------------------------


async def test_a_valid_token_passes_and_the_jwks_is_fetched_once(key_a):
    jwks, clock = Jwks(key_a), Clock()
    check = make_check(jwks, clock)
    for _ in range(5):
        await check.check(header(key_a.sign()))
    await check.check(header(key_a.sign({"aud": AUD})))  # aud as a single string
    await check.check(header(key_a.sign({"nbf": DROP, "iat": DROP})))  # nbf is optional
    assert jwks.fetches == [ISS + "/cdn-cgi/access/certs"]


async def test_concurrent_first_requests_share_one_fetch(key_a):
    jwks = Jwks(key_a)
    check = make_check(jwks, Clock())
    await asyncio.gather(*(check.check(header(key_a.sign())) for _ in range(20)))
    assert len(jwks.fetches) == 1


# --- refused before any key is looked at ------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [{}, header(""), header("   "), {"authorization": f"Bearer {TOKEN}"}])
async def test_a_request_without_the_header_is_denied(key_a, headers):
    jwks = Jwks(key_a)
    message = await denied(make_check(jwks, Clock()), headers)
    assert "no Cf-Access-Jwt-Assertion header" in message
    assert jwks.fetches == []


def _garbage(key: Key) -> list[str]:
    good = key.sign()
    h, p, s = good.split(".")
    hdr = b64(json.dumps({"alg": "RS256", "kid": key.kid}))
    nan = b64('{"exp": NaN}')
    duplicate = b64('{"alg": "RS256", "kid": "kid-a", "kid": "other"}')  # two readers could see two kids
    return [
        "garbage",
        "a.b",
        f"{good}.{s}",  # four segments
        f"{h}.{p}.",  # empty signature
        f"{h}.{p}.{s}=",  # padding is not base64url
        f"{h}.{p}.{s[:-2]}+/",  # the other alphabet
        f"{h}.{p}.{s[:-1]}*",
        f"{h}=.{p}.{s}",
        f"{h}.{p}.AAAAA",  # a length no base64 has
        f"{b64('not json')}.{p}.{s}",
        f"{b64('[1, 2]')}.{p}.{s}",  # JSON, not an object
        f"{hdr}.{b64('[]')}.{s}",
        f"{hdr}.{b64(bytes([0xFF, 0xFE]))}.{s}",  # not UTF-8
        f"{duplicate}.{p}.{s}",
        f"{hdr}.{nan}.{s}",  # not JSON either
        f"{hdr}.{p}.{s}\u00e9",  # not ASCII
        f"{hdr}.{b64(json.dumps({'pad': 'x' * 20000}))}.{s}",  # over the size bound
        f"{hdr}.{b64('[' * 3000 + ']' * 3000)}.{s}",  # nested past the parser's recursion limit
    ]


async def test_malformed_tokens_are_denied_without_fetching(key_a):
    jwks = Jwks(key_a)
    check = make_check(jwks, Clock())
    for token in _garbage(key_a):
        message = await denied(check, header(token))
        assert "not an Access token" in message, token[:80]
    assert jwks.fetches == []


def _unsigned(header_fields: dict, claims: dict | None = None, signature: bytes = b"") -> str:
    body = {"aud": AUD, "iss": ISS, "exp": NOW + 300, **(claims or {})}
    return f"{b64(json.dumps(header_fields))}.{b64(json.dumps(body))}.{b64(signature)}"


async def test_only_rs256_is_accepted(key_a):
    jwks = Jwks(key_a)
    check = make_check(jwks, Clock())
    public_pem = key_a.private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    body = {"aud": AUD, "iss": ISS, "exp": NOW + 300}
    # "none" in its usual form, with no signature at all, is not even a JWS this check reads
    assert "not an Access token" in await denied(check, header(_unsigned({"alg": "none", "kid": key_a.kid})))
    forgeries = [
        _unsigned({"alg": "none", "kid": key_a.kid}, signature=b"x"),
        _unsigned({"alg": "NONE", "kid": key_a.kid}, signature=b"x"),
        _unsigned({"kid": key_a.kid}, signature=b"x"),
        # the classic confusion: the public key (which anyone can fetch) used as an HMAC secret
        jwt.encode(body, "k" * 32, algorithm="HS256", headers={"kid": key_a.kid}),
        _hs256(body, public_pem, key_a.kid),
        jwt.encode(body, key_a.private, algorithm="RS384", headers={"kid": key_a.kid}),
        jwt.encode(body, key_a.private, algorithm="PS256", headers={"kid": key_a.kid}),
        _unsigned({"alg": ["RS256"], "kid": key_a.kid}, signature=b"x"),
    ]
    for token in forgeries:
        assert "not signed with RS256" in await denied(check, header(token))
    assert jwks.fetches == []


def _hs256(body: dict, secret: bytes, kid: str) -> str:
    import hashlib
    import hmac

    signing_input = f"{b64(json.dumps({'alg': 'HS256', 'kid': kid}))}.{b64(json.dumps(body))}"
    mac = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(mac)}"


@pytest.mark.parametrize("kid", [DROP, "", 7, None, "k" * 257])
async def test_a_token_must_name_its_key(key_a, kid):
    fields = {"alg": "RS256"} if kid is DROP else {"alg": "RS256", "kid": kid}
    message = await denied(make_check(Jwks(key_a), Clock()), header(_unsigned(fields, signature=b"sig")))
    assert "names no signing key" in message


async def test_critical_header_extensions_are_refused(key_a):
    token = key_a.sign(crit=["exp"])
    assert "critical" in await denied(make_check(Jwks(key_a), Clock()), header(token))


# --- signatures ---------------------------------------------------------------------------------------------


async def test_a_wrong_signature_is_denied(key_a, stranger):
    check = make_check(Jwks(key_a), Clock())
    good = key_a.sign()
    h, p, s = good.split(".")
    other = key_a.sign({"aud": [AUD, "another-app"], "exp": NOW + 86400})
    flipped = bytearray(base64.urlsafe_b64decode(s + "=="))
    flipped[-1] ^= 1
    for token in (
        stranger.sign(),  # another key claiming key_a's kid
        f"{h}.{other.split('.')[1]}.{s}",  # claims swapped under a genuine signature
        f"{h}.{p}.{b64(bytes(flipped))}",
        f"{h}.{p}.{b64(b'short')}",
    ):
        assert "signature does not verify" in await denied(check, header(token))
    await check.check(header(good))  # the check itself still works


async def test_a_verifier_that_fails_or_answers_vaguely_denies():
    key = Key("kid-v")

    async def raises(jwk, signing_input, signature):
        raise RuntimeError("importKey failed")

    async def truthy(jwk, signing_input, signature):
        return 1  # not True: a verifier bug must not open the door

    for verify in (raises, truthy):
        message = await denied(make_check(Jwks(key), Clock(), verify=verify), header(key.sign()))
        assert "signature does not verify" in message


async def test_the_verifier_gets_the_public_key_and_exactly_what_was_signed(key_a):
    seen = []

    async def spy(jwk, signing_input, signature):
        seen.append((jwk, signing_input, signature))
        return await standalone_access.verify(jwk, signing_input, signature)

    token = key_a.sign()
    await make_check(Jwks(key_a), Clock(), verify=spy).check(header(token))
    h, p, s = token.split(".")
    assert seen == [
        (
            {"kty": "RSA", "n": key_a.jwk["n"], "e": key_a.jwk["e"]},
            f"{h}.{p}".encode(),
            base64.urlsafe_b64decode(s + "=="),
        )
    ]


# --- claims -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "claims,reason",
    [
        ({"exp": NOW - 61}, "expired"),
        ({"exp": NOW - 60}, "expired"),  # exactly at the edge of the skew: exp is exclusive
        ({"exp": DROP}, "no expiry"),
        ({"exp": str(int(NOW + 300))}, "no expiry"),
        ({"exp": True}, "no expiry"),
        ({"exp": None}, "no expiry"),
        ({"nbf": NOW + 61}, "not valid yet"),
        ({"nbf": "soon"}, "malformed nbf"),
        ({"aud": "another-app"}, "another application"),
        ({"aud": ["another-app", AUD.upper()]}, "another application"),
        ({"aud": []}, "another application"),
        ({"aud": DROP}, "no audience"),
        ({"aud": [AUD, 3]}, "no audience"),
        ({"aud": {"aud": AUD}}, "no audience"),
        ({"iss": "https://otherteam.cloudflareaccess.com"}, "another team"),
        ({"iss": ISS + "/"}, "another team"),
        ({"iss": "http://myteam.cloudflareaccess.com"}, "another team"),
        ({"iss": DROP}, "another team"),
    ],
)
async def test_claims_that_do_not_fit_are_denied(key_a, claims, reason):
    assert reason in await denied(make_check(Jwks(key_a), Clock()), header(key_a.sign(claims)))


@pytest.mark.parametrize("claims", [{"exp": NOW - 59}, {"nbf": NOW + 59}, {"aud": ["other", AUD]}, {"iat": DROP}])
async def test_claims_within_the_skew_pass(key_a, claims):
    await make_check(Jwks(key_a), Clock()).check(header(key_a.sign(claims)))


async def test_time_moves_a_token_from_valid_to_expired(key_a):
    clock = Clock()
    check = make_check(Jwks(key_a), clock)
    token = key_a.sign({"exp": NOW + 120, "nbf": NOW + 100})
    assert "not valid yet" in await denied(check, header(token))
    clock.now = NOW + 41
    await check.check(header(token))
    clock.now = NOW + 179
    await check.check(header(token))
    clock.now = NOW + 180
    assert "expired" in await denied(check, header(token))


def test_check_claims_alone():
    base = {"aud": AUD, "iss": ISS, "exp": 1000}
    check_claims(base, aud=AUD, issuer=ISS, now=1000, skew=1)
    with pytest.raises(ProtocolError):
        check_claims(base, aud=AUD, issuer=ISS, now=1000, skew=0)


# --- the key cache: rotation, TTL, rate bound, outages ----------------------------------------------------------


async def test_an_unknown_kid_refetches_once_and_follows_a_rotation(key_a, key_b):
    jwks = Jwks(key_a)
    check = make_check(jwks, Clock())
    await check.check(header(key_a.sign()))
    jwks.keys = [key_b]  # Access rotated right after that fetch: key_b signs now, key_a is retired
    await check.check(header(key_b.sign()))
    assert len(jwks.fetches) == 2
    await check.check(header(key_b.sign()))
    assert len(jwks.fetches) == 2  # cached now
    # the cache holds what the JWKS holds: the retired key no longer verifies anything
    assert "does not publish" in await denied(check, header(key_a.sign()))


async def test_a_flood_of_unknown_kids_fetches_at_most_once_per_interval(key_a):
    jwks, clock = Jwks(key_a), Clock()
    check = make_check(jwks, clock)
    await check.check(header(key_a.sign()))
    flood = [key_a.sign(kid=secrets.token_hex(8)) for _ in range(30)]
    for token in flood:
        assert "does not publish" in await denied(check, header(token))
    clock.now += 29
    await asyncio.gather(*(denied(check, header(t)) for t in flood))
    assert len(jwks.fetches) == 2  # the first request's, then one for the whole flood
    clock.now += 1
    await denied(check, header(flood[0]))
    assert len(jwks.fetches) == 3
    await check.check(header(key_a.sign({"exp": clock.now + 300})))  # known keys keep working throughout
    assert len(jwks.fetches) == 3


async def test_a_second_rotation_within_the_interval_waits_for_it(key_a, key_b):
    jwks, clock = Jwks(key_a), Clock()
    check = make_check(jwks, clock)
    await check.check(header(key_a.sign()))
    jwks.keys = [key_a, key_b]
    await check.check(header(key_a.sign()))  # known: no fetch
    await check.check(header(key_b.sign()))
    key_c = Key("kid-c")
    jwks.keys = [key_b, key_c]
    clock.now += 10
    assert "does not publish" in await denied(check, header(key_c.sign()))  # within the bound: no fetch
    assert len(jwks.fetches) == 2
    clock.now += 20
    await check.check(header(key_c.sign()))
    assert len(jwks.fetches) == 3


async def test_keys_are_fetched_again_after_the_ttl(key_a, key_b):
    jwks, clock = Jwks(key_a), Clock()
    check = make_check(jwks, clock)
    await check.check(header(key_a.sign()))
    clock.now += access.KEYS_TTL - 1
    await check.check(header(key_a.sign({"exp": clock.now + 300})))
    assert len(jwks.fetches) == 1
    jwks.keys = [key_b]
    clock.now += 1
    # the TTL refresh finds that key_a was retired, without any unknown kid prompting it
    assert "does not publish" in await denied(check, header(key_a.sign({"exp": clock.now + 300})))
    assert len(jwks.fetches) == 2
    # and a refresh does not use up the unknown-kid fetch: a rotation right after it is still followed
    jwks.keys = [key_a]
    await check.check(header(key_a.sign({"exp": clock.now + 300})))
    assert len(jwks.fetches) == 3


async def test_jwks_down_with_nothing_cached_denies_as_unchecked(key_a):
    jwks, clock = Jwks(key_a), Clock()
    jwks.down = True
    check = make_check(jwks, clock)
    token = key_a.sign()
    assert await denied(check, header(token)) == UNCHECKED
    assert "could not be checked" in UNCHECKED
    clock.now += 29
    assert await denied(check, header(token)) == UNCHECKED
    assert len(jwks.fetches) == 1  # failures count against the rate bound too
    jwks.down = False
    clock.now += 1
    await check.check(header(token))
    assert len(jwks.fetches) == 2


@pytest.mark.parametrize(
    "document",
    [
        "<html>502 Bad Gateway</html>",
        [],
        {"keys": "none"},
        {"keys": []},
        {"public_cert": {"kid": "kid-a", "cert": "..."}},
        {"keys": [{"kty": "EC", "kid": "kid-a", "crv": "P-256", "x": "AA", "y": "AA"}]},
    ],
)
async def test_a_jwks_without_usable_keys_counts_as_down(key_a, document):
    jwks = Jwks(key_a)
    jwks.document = document
    assert await denied(make_check(jwks, Clock()), header(key_a.sign())) == UNCHECKED


async def test_an_unknown_kid_during_an_outage_is_unchecked_not_unpublished(key_a, key_b):
    jwks = Jwks(key_a)
    check = make_check(jwks, Clock())
    await check.check(header(key_a.sign()))
    jwks.down = True
    assert await denied(check, header(key_b.sign())) == UNCHECKED
    await check.check(header(key_a.sign()))  # the fresh cache still serves the known key
    assert len(jwks.fetches) == 2


async def test_cached_keys_outlive_an_outage_for_a_bounded_time(key_a):
    jwks, clock = Jwks(key_a), Clock()
    check = make_check(jwks, clock)
    await check.check(header(key_a.sign()))
    jwks.down = True
    clock.now += access.KEYS_TTL + 1
    await check.check(header(key_a.sign({"exp": clock.now + 300})))  # the refresh failed; the cached key serves
    assert len(jwks.fetches) == 2
    clock.now = NOW + access.STALE_LIMIT - 1
    await check.check(header(key_a.sign({"exp": clock.now + 300})))
    clock.now = NOW + access.STALE_LIMIT + 1
    assert await denied(check, header(key_a.sign({"exp": clock.now + 300}))) == UNCHECKED
    jwks.down = False
    clock.now += access.REFETCH_INTERVAL
    await check.check(header(key_a.sign({"exp": clock.now + 300})))


async def test_a_clock_that_jumps_back_does_not_freeze_the_cache(key_a):
    jwks, clock = Jwks(key_a), Clock()
    check = make_check(jwks, clock)
    await check.check(header(key_a.sign()))
    clock.now -= 3600  # otherwise the cache would look fresh for an hour and ten minutes
    await check.check(header(key_a.sign({"exp": clock.now + 300, "nbf": DROP})))
    assert len(jwks.fetches) == 2


def test_parse_jwks_keeps_rs256_signing_keys_only(key_a, key_b):
    enc = {**key_b.jwk, "kid": "enc", "use": "enc"}
    rs384 = {**key_b.jwk, "kid": "rs384", "alg": "RS384"}
    bare = {k: v for k, v in key_b.jwk.items() if k not in ("use", "alg")}
    broken = {**key_b.jwk, "kid": "broken", "n": "not base64!"}
    keys = parse_jwks({"keys": [key_a.jwk, enc, rs384, bare, broken, "junk", {"kty": "oct", "kid": "h", "k": "AA"}]})
    assert sorted(keys) == ["kid-a", "kid-b"]
    assert keys["kid-a"] == {"kty": "RSA", "n": key_a.jwk["n"], "e": key_a.jwk["e"]}


def test_parse_jwt_exposes_what_the_check_needs(key_a):
    token = key_a.sign()
    parsed = parse_jwt(token)
    assert parsed.kid == "kid-a" and parsed.claims["aud"] == [AUD]
    assert parsed.signing_input == token.rsplit(".", 1)[0].encode()


# --- the team's origin and the settings -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value,origin",
    [
        ("myteam.cloudflareaccess.com", ISS),
        ("  MyTeam.CloudflareAccess.com ", ISS),
        ("https://myteam.cloudflareaccess.com", ISS),
        ("https://myteam.cloudflareaccess.com/", ISS),
        ("HTTPS://myteam.cloudflareaccess.com:443", ISS),
        ("https://access.example.org:8443", "https://access.example.org:8443"),
        ("http://127.0.0.1:8123", "http://127.0.0.1:8123"),
        ("http://localhost:8123", "http://localhost:8123"),
        ("http://[::1]:8123", "http://[::1]:8123"),
    ],
)
def test_team_origin(value, origin):
    assert team_origin(value) == origin


@pytest.mark.parametrize(
    "value",
    [
        "",
        "myteam",  # a team name, not its domain
        "http://myteam.cloudflareaccess.com",  # plain http off loopback
        "http://10.0.0.1:8080",
        "ftp://myteam.cloudflareaccess.com",
        "https://myteam.cloudflareaccess.com/cdn-cgi/access/certs",
        "https://myteam.cloudflareaccess.com?x=1",
        "https://user@myteam.cloudflareaccess.com",
        "myteam.cloudflareaccess.com:443",
        "https://myteam.cloudflareaccess.com:0",
        "https://myteam.cloudflareaccess.com:99999",
        "https://myteam.cloudflareaccess.com:",
        "https://-bad-.example.com",
        "https://a..example.com",
        "https://exa mple.com",
        "http://[::1",
        "https://",
    ],
)
def test_team_origin_refuses_and_names_the_variable(value):
    with pytest.raises(ValueError, match="ACCESS_TEAM_DOMAIN"):
        team_origin(value)


def test_settings_validate_the_team_domain():
    settings = Settings.from_vars({"ACCESS_TEAM_DOMAIN": TEAM, "ACCESS_AUD": AUD})
    assert (settings.access_team_domain, settings.access_aud) == (TEAM, AUD)
    with pytest.raises(ValueError, match="ACCESS_TEAM_DOMAIN"):
        Settings.from_vars({"ACCESS_TEAM_DOMAIN": "http://myteam.cloudflareaccess.com", "ACCESS_AUD": AUD})
    with pytest.raises(ValueError, match="ACCESS_TEAM_DOMAIN"):
        Settings.from_vars({"ACCESS_TEAM_DOMAIN": TEAM})


def test_the_standalone_gate_follows_the_settings():
    assert standalone_access.access_gate(Settings()) is None
    gate = standalone_access.access_gate(Settings.from_vars({"ACCESS_TEAM_DOMAIN": TEAM, "ACCESS_AUD": AUD}))
    assert isinstance(gate, AccessCheck)
    assert gate.jwks_url == "https://myteam.cloudflareaccess.com/cdn-cgi/access/certs" and gate.aud == AUD


# --- in the edge: Access runs before anything else ----------------------------------------------------------------


async def test_the_edge_checks_access_before_the_credential(key_a):
    jwks = Jwks(key_a)
    workspaces = Workspaces()
    edge = Edge(
        token=TOKEN,
        settings=Settings(),
        workspaces=workspaces,
        directory=directory_object(),
        version="0.1.0",
        access=make_check(jwks, Clock()),
    )
    for headers in ({}, header(key_a.sign({"aud": "other"}))):
        for method, path in (("GET", "/v1/health"), ("PUT", "/v1/workspaces/a/b"), ("GET", "/nowhere")):
            resp = await edge.handle(EdgeRequest(method, path, "", {**auth(), **headers}, Body(forbidden=True)))
            assert resp.status == 401 and json.loads(resp.body)["error"]["code"] == "access_denied"
    # a valid JWT still needs the bearer credential after it
    resp = await edge.handle(EdgeRequest("GET", "/v1/health", "", header(key_a.sign())))
    assert json.loads(resp.body)["error"]["code"] == "unauthorized"
    resp = await edge.handle(EdgeRequest("GET", "/v1/health", "", {**auth(), **header(key_a.sign())}))
    assert resp.status == 200
    assert workspaces.calls == []
