"""The port proxy's policy (protocol/proxy.py): one decoded, resolved path is both checked and forwarded, no
encoding smuggles a ".." past the allow-list, and the deployment's credentials never cross to the sandbox."""

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from protocol import limits
from protocol.errors import ProtocolError
from protocol.proxy import (
    HOP_BY_HOP,
    encode_path,
    normalize_path,
    path_allowed,
    request_headers,
    response_headers,
    validate_allow_paths,
)

PUBLIC = ("/public",)


def refused(raw: str) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        normalize_path(raw)
    assert info.value.code == "path_not_allowed"
    assert info.value.status == 403
    return info.value


# --- traversal: every encoding of ".." resolves (or is refused) before the allow-list sees the path ---


@pytest.mark.parametrize(
    "raw,path",
    [
        ("/public/../secret", "/secret"),
        ("/public/%2e%2e/secret", "/secret"),
        ("/public/%2E%2E/secret", "/secret"),
        ("/public/%2E%2e/secret", "/secret"),
        ("/public/%2e%2E/secret", "/secret"),
        ("/public/.%2e/secret", "/secret"),
        ("/public/.%2E/secret", "/secret"),
        ("/public/%2e./secret", "/secret"),
        ("/public/%2E./secret", "/secret"),
        ("/public/..%2fsecret", "/secret"),
        ("/public/..%2Fsecret", "/secret"),
        ("/public/..%5csecret", "/secret"),
        ("/public/..%5Csecret", "/secret"),
        ("/public%2f..%2fsecret", "/secret"),
        ("/public%2F%2e%2e%2Fsecret", "/secret"),
        ("/public%5c%2e%2e%5csecret", "/secret"),
        ("/public/%2e%2e%2fsecret", "/secret"),
        ("/public/%2e%2e%5csecret", "/secret"),
        ("/public\\..\\secret", "/secret"),
        ("/public/..\\secret", "/secret"),
        ("\\public\\..\\secret", "/secret"),
        ("/public//../secret", "/secret"),
        ("/public/.//..//secret", "/secret"),
        ("/public/./../secret", "/secret"),
        ("/public/%2e/../secret", "/secret"),
        ("/public/sub/../../secret", "/secret"),
        ("/public/sub/%2e%2e/%2e%2e/secret", "/secret"),
        ("/public/..", "/"),
        ("/public/%2e%2e", "/"),
        ("/public/%2e%2e/", "/"),
        ("/public/..%2f", "/"),
        ("/public/../public2/x", "/public2/x"),
        ("/public/../publicx", "/publicx"),
        ("/public/../Public/x", "/Public/x"),
        ("public/../secret", "/secret"),
        ("/public%2e%2e/secret", "/public../secret"),  # one segment "public..", not under /public
    ],
)
def test_traversal_out_of_the_prefix_resolves_before_the_check(raw, path):
    assert normalize_path(raw) == path
    assert not path_allowed(normalize_path(raw), PUBLIC)


@pytest.mark.parametrize(
    "raw,path",
    [
        ("/public/a/../b", "/public/b"),
        ("/public/a/%2e%2e/b", "/public/b"),
        ("/public/a/..%2fb", "/public/b"),
        ("/public/a\\..\\b", "/public/b"),
        ("/public/./a", "/public/a"),
        ("/public//a", "/public/a"),
        ("//public///a", "/public/a"),
        ("/public/%2e/a", "/public/a"),
        ("/x/../public/a", "/public/a"),
        ("/public", "/public"),
        ("/public/", "/public/"),
        ("/public/a/..", "/public/"),
        # decoded exactly once: a double-encoded ".." is the literal segment "%2e%2e", never resolved
        ("/public/%252e%252e/secret", "/public/%2e%2e/secret"),
        ("/public/%252E%252E/secret", "/public/%2E%2E/secret"),
        ("/public/%252e%252e%252fsecret", "/public/%2e%2e%2fsecret"),
        ("/public/..%252fsecret", "/public/..%2fsecret"),
        ("/public/%25%32%65%25%32%65/secret", "/public/%2e%2e/secret"),
        # dots that are not a dot segment are names
        ("/public/.../secret", "/public/.../secret"),
        ("/public/..a/secret", "/public/..a/secret"),
        ("/public/a../secret", "/public/a../secret"),
        ("/public/.a", "/public/.a"),
        ("/public/.%2e.", "/public/..."),
        ("/public/ ../x", "/public/ ../x"),
        ("/public/.. /x", "/public/.. /x"),
        # look-alikes of "." stay literal
        ("/public/\uff0e\uff0e/secret", "/public/\uff0e\uff0e/secret"),  # fullwidth full stops
        ("/public/%ef%bc%8e%ef%bc%8e/secret", "/public/\uff0e\uff0e/secret"),
        ("/public/%e2%80%a5/secret", "/public/\u2025/secret"),  # two dot leader
        # ";" is an ordinary character when the segment is not a dot segment
        ("/public/a;b/c", "/public/a;b/c"),
        ("/public;x/../public/a", "/public/a"),
    ],
)
def test_paths_that_stay_inside_the_prefix(raw, path):
    assert normalize_path(raw) == path
    assert path_allowed(normalize_path(raw), PUBLIC)


@pytest.mark.parametrize(
    "raw",
    [
        "..",
        "/..",
        "/../",
        "/../public/a",
        "/%2e%2e",
        "/%2e%2e/public",
        "%2e%2e",
        ".%2E",
        "/public/../..",
        "/public/../../etc/passwd",
        "/public/%2e%2e/%2e%2e/etc/passwd",
        "/public/..%2f..%2fetc%2fpasswd",
        "/public/..%5c..%5cetc",
        "/public\\..\\..\\etc",
        "\\..",
        "//..",
        "/./..",
        "/a/b/../../../c",
        "/public%2f%2e%2e%2f%2e%2e",
    ],
)
def test_climbing_above_the_root_is_refused(raw):
    assert "root" in refused(raw).message


@pytest.mark.parametrize(
    "raw",
    [
        "/public/..;/secret",
        "/public/..;jsessionid=1/secret",
        "/public/.;/secret",
        "/public/.;x",
        "/public/%2e%2e;/secret",
        "/public/%2e%2e%3b/secret",
        "/public/..;",
    ],
)
def test_dot_segments_with_parameters_are_refused(raw):
    # Tomcat and friends read "..;x" as "..": forwarded as a plain name it would pass /public and reach /secret
    assert ";" in refused(raw).message


@pytest.mark.parametrize("raw", ["%", "/a%", "/a%2", "/a%zz", "/a%g0", "/a%0g", "/%+1", "/% 1", "/%-1", "/a%%41", "%%"])
def test_malformed_escapes_are_refused(raw):
    assert "percent escape" in refused(raw).message


@pytest.mark.parametrize(
    "raw",
    [
        "%c0%ae%c0%ae",  # overlong "." twice
        "/public/%c0%ae%c0%ae/secret",
        "/public/%c0%ae./secret",
        "/public%c0%afsecret",  # overlong "/"
        "/public/%e0%80%ae%e0%80%ae/secret",  # three-byte overlong "."
        "/public/%c1%9c",  # overlong "\"
        "/%ed%a0%80",  # an encoded surrogate
        "/%f4%90%80%80",  # above U+10FFFF
        "/%ff",
        "/%80",  # a lone continuation byte
        "/%c3",  # a truncated sequence
        "/%c3/",
    ],
)
def test_invalid_utf8_is_refused(raw):
    assert "UTF-8" in refused(raw).message


def test_a_lone_surrogate_in_the_raw_text_is_refused():
    assert "UTF-8" in refused("/a\ud800").message


@pytest.mark.parametrize(
    "raw",
    ["%00", "/a%00b", "/a\x00b", "/public/..%00/x", "/a%0a", "/a%0d%0aSet-Cookie:x", "/a%09", "/a%1f", "/a%7f", "/a\n"],
)
def test_nul_and_control_characters_are_refused(raw):
    assert "control" in refused(raw).message


@pytest.mark.parametrize(
    "raw,path",
    [
        ("/caf%C3%A9", "/caf\u00e9"),
        ("/caf%c3%a9", "/caf\u00e9"),
        ("/caf\u00e9", "/caf\u00e9"),
        ("/%F0%9F%98%80/x", "/\U0001f600/x"),
        ("/\U0001f600", "/\U0001f600"),
        ("/%c2%85", "/\x85"),  # a C1 control is not ASCII: allowed
        ("/a%20b", "/a b"),
        ("/a%3Fb%23c", "/a?b#c"),
        ("/100%25", "/100%"),
        ("/a+b", "/a+b"),
        ("/%41%42%43", "/ABC"),
    ],
)
def test_decoding(raw, path):
    assert normalize_path(raw) == path


@pytest.mark.parametrize(
    "raw,path",
    [
        ("", "/"),
        ("/", "/"),
        ("//", "/"),
        ("\\", "/"),
        (".", "/"),
        ("./", "/"),
        ("a", "/a"),
        ("a/", "/a/"),
        ("/a", "/a"),
        ("/a/", "/a/"),
        ("/a//", "/a/"),
        ("/a\\", "/a/"),
        ("/a%2f", "/a/"),
        ("/a%2F", "/a/"),
        ("/a%5c", "/a/"),
        ("/a/.", "/a/"),
        ("/a/%2e", "/a/"),
        ("/a/./", "/a/"),
        ("/a/b/..", "/a/"),
        ("/a/b/%2E%2E", "/a/"),
        ("/a/b/../", "/a/"),
        ("/a/..", "/"),
        ("///a///b///", "/a/b/"),
        ("/a/b", "/a/b"),
        ("/a/./b/./c", "/a/b/c"),
    ],
)
def test_slashes_and_dot_segments(raw, path):
    assert normalize_path(raw) == path


def test_decoded_exactly_once():
    assert normalize_path("/%2541") == "/%41"
    assert normalize_path("/%41") == "/A"
    assert normalize_path(encode_path("/%41")) == "/%41"


def test_the_cap_is_on_the_decoded_path():
    longest = "/" + "a" * (limits.MAX_PATH_BYTES - 1)
    assert normalize_path(longest) == longest
    assert "bytes" in refused(longest + "a").message
    # escapes count as the bytes they decode to, so the encoded form of the longest path passes
    assert normalize_path("/" + "%61" * (limits.MAX_PATH_BYTES - 1)) == longest
    assert "bytes" in refused("/" + "%61" * limits.MAX_PATH_BYTES).message
    # multi-byte characters count in UTF-8 bytes
    two_bytes = "/" + "\u00e9" * ((limits.MAX_PATH_BYTES - 1) // 2)
    assert normalize_path(two_bytes) == two_bytes
    refused(two_bytes + "\u00e9")


def test_the_cap_holds_before_resolution():
    # what the client sent counts, even if it resolves to something short
    assert "bytes" in refused("/a" + "/x/.." * (limits.MAX_PATH_BYTES // 5)).message


def test_the_cap_holds_after_the_leading_slash_is_added():
    assert normalize_path("a" * (limits.MAX_PATH_BYTES - 1)) == "/" + "a" * (limits.MAX_PATH_BYTES - 1)
    assert "bytes" in refused("a" * limits.MAX_PATH_BYTES).message


def test_a_huge_raw_path_is_refused():
    assert "bytes" in refused("/" + "a" * (10 * limits.MAX_PATH_BYTES)).message
    assert "bytes" in refused("%2f" * (2 * limits.MAX_PATH_BYTES)).message


# --- encode_path ---


@pytest.mark.parametrize(
    "path,encoded",
    [
        ("/", "/"),
        ("/a/b/", "/a/b/"),
        ("/a b", "/a%20b"),
        ("/100%", "/100%25"),
        ("/%2e%2e", "/%252e%252e"),
        ("/a?b", "/a%3Fb"),
        ("/a#b", "/a%23b"),
        ("/caf\u00e9", "/caf%C3%A9"),
        ("/\U0001f600", "/%F0%9F%98%80"),
        ('/a"<>`{}|^[]', "/a%22%3C%3E%60%7B%7D%7C%5E%5B%5D"),
        ("/-._~!$&'()*+,;=:@", "/-._~!$&'()*+,;=:@"),
        ("/AZaz09", "/AZaz09"),
        ("/\x85", "/%C2%85"),
    ],
)
def test_encode_path(path, encoded):
    assert encode_path(path) == encoded
    assert normalize_path(encoded) == path


_PCHAR = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@/")
_HEXDIGITS = set("0123456789ABCDEF")


def _is_normalized(path: str) -> bool:
    segments = path.split("/")
    return (
        path.startswith("/")
        and "//" not in path
        and "\\" not in path
        and not any(segment in (".", "..") for segment in segments)
        and not any(segment.partition(";")[0] in (".", "..") for segment in segments)
        and not any(ord(c) < 0x20 or c == "\x7f" for c in path)
        and len(path.encode("utf-8")) <= limits.MAX_PATH_BYTES
    )


def _is_encoded(text: str) -> bool:
    i = 0
    while i < len(text):
        if text[i] == "%":
            if not (set(text[i + 1 : i + 3]) <= _HEXDIGITS and len(text[i + 1 : i + 3]) == 2):
                return False
            i += 3
        elif text[i] in _PCHAR:
            i += 1
        else:
            return False
    return True


# characters that matter to the normalizer, often; anything else sometimes
_tricky = st.sampled_from(list("/\\.%;2eEfF5cC0aA") + ["%2e", "%2E", "%2f", "%2F", "%5c", "%5C", "%25", "..", "%c0%ae"])
raw_paths = st.lists(_tricky | st.characters(), max_size=40).map("".join)


@settings(max_examples=1500, deadline=None)
@given(raw_paths)
@example("/%2541")
@example("/a/..;/b")
@example("%c0%ae")
def test_any_input_is_refused_or_normalized(raw):
    try:
        path = normalize_path(raw)
    except ProtocolError as err:
        assert err.code == "path_not_allowed"
        return
    assert _is_normalized(path), path
    encoded = encode_path(path)
    assert _is_encoded(encoded), encoded
    assert normalize_path(encoded) == path  # what the upstream decodes is what was checked
    if "%" not in path:  # decoded once: a "%" in the result would be decoded again
        assert normalize_path(path) == path
    assert normalize_path(raw + "/").endswith("/")


_segment = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="/\\\x7f"), min_size=1, max_size=12
).filter(lambda s: s.partition(";")[0] not in (".", "..") and not any(ord(c) < 0x20 for c in s))


@settings(max_examples=800, deadline=None)
@given(st.lists(_segment, max_size=8), st.booleans())
def test_encoding_round_trips_every_normalized_path(segments, trailing):
    path = "/" + "/".join(segments) + ("/" if trailing and segments else "")
    assert normalize_path(encode_path(path)) == path
    assert _is_encoded(encode_path(path))
    assert encode_path(path).isascii()


@settings(max_examples=800, deadline=None)
@given(st.lists(_segment, max_size=6), st.lists(st.sampled_from(["..", "%2e%2e", ".%2E", "..%2f", "..%5c", "\\.."])))
def test_escapes_never_reach_past_the_prefix(segments, climbs):
    # "/public/<names>/<climbs...>": allowed only if it still resolves inside /public, never by accident
    raw = "/public/" + "/".join(encode_path(s) for s in segments) + "/" + "/".join(climbs) + "/secret"
    try:
        path = normalize_path(raw)
    except ProtocolError:
        assert len(climbs) > len(segments) + 1
        return
    inside = len(climbs) <= len(segments)
    assert path_allowed(path, PUBLIC) == inside
    assert path_allowed(path, ("/secret",)) == (len(climbs) == len(segments) + 1)


# --- path_allowed ---


@pytest.mark.parametrize(
    "path,allow,allowed",
    [
        ("/anything", (), True),
        ("/", (), True),
        ("/v1", ("/v1",), True),
        ("/v1/", ("/v1",), True),
        ("/v1/chat", ("/v1",), True),
        ("/v1/chat/x/", ("/v1",), True),
        ("/v1x", ("/v1",), False),
        ("/v10", ("/v1",), False),
        ("/v", ("/v1",), False),
        ("/", ("/v1",), False),
        ("/V1", ("/v1",), False),
        ("/x/v1", ("/v1",), False),
        ("/api/", ("/api/",), True),
        ("/api/x", ("/api/",), True),
        ("/api", ("/api/",), False),
        ("/apix", ("/api/",), False),
        ("/", ("/",), True),
        ("/x/y", ("/",), True),
        ("/a/b/c", ("/a/b",), True),
        ("/a/bc", ("/a/b",), False),
        ("/a", ("/a/b",), False),
        ("/health", ("/v1", "/health"), True),
        ("/v1/x", ("/health", "/v1"), True),
        ("/other", ("/v1", "/health"), False),
    ],
)
def test_path_allowed(path, allow, allowed):
    assert path_allowed(path, allow) is allowed


# --- validate_allow_paths ---


def test_allow_paths_are_kept_in_order_without_duplicates():
    assert validate_allow_paths([]) == ()
    assert validate_allow_paths(["/v1", "/api/", "/"]) == ("/v1", "/api/", "/")
    assert validate_allow_paths(["/b", "/a", "/b", "/a", "/c"]) == ("/b", "/a", "/c")
    assert validate_allow_paths(("/x",)) == ("/x",)
    assert validate_allow_paths(["/caf\u00e9", "/a b", "/a;b"]) == ("/caf\u00e9", "/a b", "/a;b")
    assert isinstance(validate_allow_paths(["/x"]), tuple)


def invalid(value) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        validate_allow_paths(value)
    assert info.value.code == "invalid_field"
    return info.value


@pytest.mark.parametrize("value", [None, "/v1", {"/v1": True}, 1, True, {"/v1"}])
def test_allow_paths_must_be_a_list(value):
    assert "list" in invalid(value).message


@pytest.mark.parametrize("entry", ["v1", "", "\\v1", None, 1, ["/v1"], b"/v1"])
def test_allow_path_entries_are_absolute_strings(entry):
    assert "allow_paths[1] must be a string starting with /" in invalid(["/ok", entry]).message


@pytest.mark.parametrize(
    "entry",
    [
        "/v1/../x",
        "/v1/..",
        "/..",
        "/v1//x",
        "//v1",
        "/v1/.",
        "/./v1",
        "/a\\b",
        "/a%41",
        "/a%20b",
        "/a%2fb",
        "/a%zz",
        "/100%",
        "/a\x00",
        "/a\n",
        "/a/..;/b",
        "/%c0%ae",
    ],
)
def test_allow_path_entries_are_normalized(entry):
    err = invalid(["/ok", entry])
    assert "allow_paths[1]" in err.message and "normalized" in err.message


def test_allow_path_entries_are_valid_utf8():
    assert "UTF-8" in invalid(["/a\ud800"]).message


def test_allow_paths_limits():
    many = [f"/p{i}" for i in range(limits.MAX_ALLOW_PATHS)]
    assert validate_allow_paths(many) == tuple(many)
    assert str(limits.MAX_ALLOW_PATHS) in invalid(many + ["/one-more"]).message
    assert str(limits.MAX_ALLOW_PATHS) in invalid(["/same"] * (limits.MAX_ALLOW_PATHS + 1)).message
    longest = "/" + "a" * (limits.MAX_ALLOW_PATH_BYTES - 1)
    assert validate_allow_paths([longest]) == (longest,)
    assert "bytes" in invalid([longest + "a"]).message
    two_bytes = "/" + "\u00e9" * (limits.MAX_ALLOW_PATH_BYTES // 2)  # 257 bytes in 129 characters
    assert "bytes" in invalid([two_bytes]).message


def test_allow_path_limits_values():
    assert limits.MAX_ALLOW_PATHS == 32
    assert limits.MAX_ALLOW_PATH_BYTES == 256


# --- request headers ---

FORWARDED = {"client_ip": "203.0.113.7", "scheme": "https", "host": "box.example.com", "prefix": "/v1/proxy"}
SET_BY_PROXY = {
    "x-forwarded-for": "203.0.113.7",
    "x-forwarded-proto": "https",
    "x-forwarded-host": "box.example.com",
    "x-forwarded-prefix": "/v1/proxy",
}


def forward(headers: dict[str, str]) -> dict[str, str]:
    return request_headers(headers, **FORWARDED)


def test_hop_by_hop_set():
    assert HOP_BY_HOP == {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }


def test_a_plain_request_keeps_its_end_to_end_headers():
    headers = {
        "accept": "text/html",
        "content-type": "application/json",
        "content-length": "12",
        "user-agent": "curl/8",
        "cookie": "session=abc; theme=dark",
        "x-custom": " 1 ",
        "if-none-match": '"etag"',
    }
    assert forward(headers) == {**headers, **SET_BY_PROXY}


def test_the_input_is_not_modified():
    headers = {"authorization": "Bearer t", "cookie": "CF_Authorization=x; a=1"}
    forward(headers)
    assert headers == {"authorization": "Bearer t", "cookie": "CF_Authorization=x; a=1"}


@pytest.mark.parametrize(
    "name",
    [
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "authorization",
        "cf-access-jwt-assertion",
        "cf-access-client-id",
        "cf-access-client-secret",
        "cf-access-authenticated-user-email",
        "cf-connecting-ip",
        "cf-connecting-ipv6",
        "cf-ray",
        "cf-ipcountry",
        "cf-visitor",
        "cf-worker",
        "cdn-loop",
        "true-client-ip",
        "x-real-ip",
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-proto",
        "x-forwarded-host",
        "x-forwarded-prefix",
        "x-forwarded-port",
        "x-forwarded-server",
        "x-flarebox-token",
        "x-flarebox-proxy-error",
        "x-flarebox-anything",
    ],
)
def test_request_header_dropped(name):
    out = forward({name: "evil", "accept": "*/*"})
    assert "evil" not in out.values()
    assert set(out) == {"accept", *SET_BY_PROXY}
    # names should arrive lower-case; a capitalised one is dropped all the same
    out = forward({name.title(): "evil", "accept": "*/*"})
    assert "evil" not in out.values()
    assert set(out) == {"accept", *SET_BY_PROXY}


@pytest.mark.parametrize("name", ["cfx", "cf", "x-cf-thing", "x-forwarded", "x-flarebox", "x-flareboxes", "hostname"])
def test_request_headers_that_only_look_alike_are_kept(name):
    assert forward({name: "v"})[name] == "v"


def test_x_forwarded_headers_are_replaced_never_appended():
    out = forward(
        {
            "x-forwarded-for": "1.2.3.4",
            "X-Forwarded-For": "5.6.7.8",
            "x-forwarded-proto": "http",
            "x-forwarded-host": "evil.example",
            "x-forwarded-prefix": "/admin",
        }
    )
    assert out == SET_BY_PROXY


def test_connection_named_request_headers_are_dropped():
    out = forward({"connection": "keep-alive, X-Secret ,close,,x-other2", "x-secret": "1", "x-other2": "2", "x-k": "3"})
    assert out == {"x-k": "3", **SET_BY_PROXY}


def test_a_capitalised_connection_header_names_headers_too():
    assert forward({"Connection": "X-Secret", "x-secret": "1", "x-k": "3"}) == {"x-k": "3", **SET_BY_PROXY}


def test_connection_cannot_drop_content_length_or_the_forwarded_headers():
    out = forward({"connection": "content-length, x-forwarded-for", "content-length": "5"})
    assert out == {"content-length": "5", **SET_BY_PROXY}


@pytest.mark.parametrize(
    "cookie,kept",
    [
        ("a=1; CF_Authorization=tok; b=2", "a=1; b=2"),
        ("CF_Authorization=tok; a=1", "a=1"),
        ("a=1; CF_Authorization=tok", "a=1"),
        ("a=1;CF_Authorization=tok;b=2", "a=1; b=2"),
        ("  CF_Authorization = tok ;  a=1 ", "a=1"),
        ("a=1;  CF_Authorization=tok  ;b=2", "a=1; b=2"),
        ("cf_authorization=tok; a=1", "a=1"),
        ("CF_AppSession=s; CF_Binding=b; a=1", "a=1"),
        ("cf_clearance=c; a=1", "a=1"),
        ("CF_Authorization; a=1", "a=1"),
        ("a=1; CF_Authorization=x; CF_Authorization=y; b=2", "a=1; b=2"),
        ("XCF_Authorization=1; a=CF_Authorization=2", "XCF_Authorization=1; a=CF_Authorization=2"),
        ("__cf_bm=1; a=1", "__cf_bm=1; a=1"),
        ("session=abc", "session=abc"),
        ("a=1; b=2", "a=1; b=2"),
        # a header without a Cloudflare cookie is forwarded as it came
        ("a=1;b=2", "a=1;b=2"),
        ("a=1;  b=2", "a=1;  b=2"),
        ("a=1;;b=2;", "a=1; b=2"),
    ],
)
def test_cloudflare_cookies_leave_the_cookie_header(cookie, kept):
    assert forward({"cookie": cookie})["cookie"] == kept


@pytest.mark.parametrize(
    "cookie", ["CF_Authorization=tok", " CF_Authorization=tok ", "CF_Authorization=x; CF_Binding=y", ";"]
)
def test_a_cookie_header_with_nothing_left_is_dropped(cookie):
    assert forward({"cookie": cookie, "accept": "*/*"}) == {"accept": "*/*", **SET_BY_PROXY}


# --- response headers ---


def relay(*pairs: tuple[str, str]) -> list[tuple[str, str]]:
    return response_headers(list(pairs))


def test_a_plain_response_is_relayed_in_order():
    pairs = [
        ("Content-Type", "text/html"),
        ("Content-Length", "42"),
        ("Set-Cookie", "a=1; Path=/"),
        ("Cache-Control", "no-store"),
        ("Set-Cookie", "b=2; Expires=Wed, 21 Oct 2026 07:28:00 GMT; HttpOnly"),
        ("set-cookie", "a=3"),
    ]
    assert response_headers(pairs) == pairs


@pytest.mark.parametrize("name", sorted(HOP_BY_HOP) + ["x-flarebox-proxy-error", "X-Flarebox-Anything"])
def test_response_header_dropped(name):
    assert relay((name, "evil"), ("content-type", "text/plain")) == [("content-type", "text/plain")]
    assert relay((name.upper(), "evil"), ("content-type", "text/plain")) == [("content-type", "text/plain")]


@pytest.mark.parametrize("name", ["Clear-Site-Data", "Service-Worker-Allowed"])
def test_response_headers_that_reach_beyond_the_port_are_dropped(name):
    assert relay((name, '"cookies"'), ("etag", "1")) == [("etag", "1")]


def test_connection_named_response_headers_are_dropped():
    out = relay(
        ("Connection", "X-Hop, keep-alive"),
        ("x-hop", "1"),
        ("connection", "x-second"),
        ("X-Second", "2"),
        ("x-end", "3"),
        ("Content-Length", "3"),
    )
    assert out == [("x-end", "3"), ("Content-Length", "3")]


def test_connection_cannot_drop_the_response_content_length():
    assert relay(("connection", "Content-Length"), ("content-length", "3")) == [("content-length", "3")]


@pytest.mark.parametrize(
    "value",
    [
        "CF_Authorization=forged; Path=/; HttpOnly",
        "cf_authorization=forged",
        "CF_AppSession=x",
        "CF_Binding=x; Domain=example.com",
        " CF_Authorization=forged",
        "CF_Authorization =forged",
        "CF_Authorization",  # no "=": a nameless cookie the browser would send back as "CF_Authorization"
        "CF_Authorization; Path=/",
        "a=1, CF_Authorization=forged",  # several Set-Cookie joined with ", " by a careless adapter
        "a=1; Expires=Wed, 21 Oct 2026 07:28:00 GMT, cf_x=1",
    ],
)
def test_set_cookie_of_a_cloudflare_cookie_is_dropped(value):
    assert relay(("Set-Cookie", "a=1"), ("Set-Cookie", value), ("set-cookie", "b=2")) == [
        ("Set-Cookie", "a=1"),
        ("set-cookie", "b=2"),
    ]


@pytest.mark.parametrize(
    "value",
    [
        "XCF_Authorization=1",
        "a=CF_Authorization",
        "a=1; Path=/CF_x",
        "__cf_bm=1",
        "a=1; Expires=Wed, 21 Oct 2026 07:28:00 GMT",
        "__Secure-CF_Authorization=1",
    ],
)
def test_other_set_cookie_values_stay(value):
    assert relay(("Set-Cookie", value)) == [("Set-Cookie", value)]


def test_the_cf_prefix_only_matters_in_set_cookie():
    assert relay(("x-note", "CF_Authorization=x"), ("Link", "</CF_x>")) == [
        ("x-note", "CF_Authorization=x"),
        ("Link", "</CF_x>"),
    ]
