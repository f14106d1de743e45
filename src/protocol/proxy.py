"""Policy of the port proxy: which path a client's request reaches inside the sandbox, and which headers cross.

The upstream is hostile and shares the deployment's origin, and the client is only as trusted as its key: the path is
decoded and resolved here, once, and the very result is both checked against the service's allow_paths and
forwarded (re-encoded), so the check and the upstream never read two different paths. Stdlib only: this runs under
CPython and Pyodide.
"""

import re

from protocol import limits
from protocol.errors import ProtocolError

_HEX = frozenset(b"0123456789abcdefABCDEF")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# RFC 3986 pchar without pct-encoded (unreserved, sub-delims, ":" and "@"), plus the separator "/"
_PATH_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@/")
_ENCODED = tuple(chr(b) if b in _PATH_SAFE else f"%{b:02X}" for b in range(256))


def _refuse(message: str) -> ProtocolError:
    return ProtocolError("path_not_allowed", message)


def _percent_decode(raw: str) -> bytes:
    try:
        data = raw.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate
        raise _refuse("the path is not valid UTF-8") from None
    first, *rest = data.split(b"%")
    out = bytearray(first)
    for part in rest:
        # checked digit by digit: int(..., 16) would take "+1" or " 1"
        if len(part) < 2 or part[0] not in _HEX or part[1] not in _HEX:
            raise _refuse("the path has a malformed percent escape (% must be followed by two hex digits)")
        out.append(int(part[:2], 16))
        out += part[2:]
    return bytes(out)


def normalize_path(raw: str) -> str:
    """The decoded, resolved path of the raw (still percent-encoded) tail a client sent after the proxy prefix.

    Decoded exactly once ("%252e" stays the literal "%2e"); "\\", "%2F" and "%5C" all separate segments, decoded
    before splitting so none of them hides a ".."; empty and "." segments go, ".." resolves and may not climb above
    the root. A trailing slash (or a trailing "." or "..", as RFC 3986 resolves them) is kept; "" is "/".
    """
    # a shortcut only: every raw character decodes to at least a third of a byte, so this is over the cap anyway
    if len(raw) > 3 * limits.MAX_PATH_BYTES:  # pragma: no mutate
        raise _refuse(f"the path is over {limits.MAX_PATH_BYTES} bytes")
    data = _percent_decode(raw)
    if len(data) > limits.MAX_PATH_BYTES:
        raise _refuse(f"the path is over {limits.MAX_PATH_BYTES} bytes")
    try:
        # strict: overlong forms (%c0%ae is an overlong "."), encoded surrogates and truncated sequences all fail
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse("the decoded path is not valid UTF-8") from None
    if _CONTROL.search(text):
        raise _refuse("the path contains NUL or an ASCII control character")
    segments = text.replace("\\", "/").split("/")
    resolved: list[str] = []
    for segment in segments:
        if segment in ("", "."):
            continue
        if segment == "..":
            if not resolved:
                raise _refuse("the path climbs above the root with ..")
            resolved.pop()
            continue
        if segment.partition(";")[0] in (".", ".."):
            # Tomcat, Jetty and Spring strip ";params" from a segment before resolving it, so "..;x" would be ".."
            # to them while it is a plain name here: "/public/..;/admin" would pass the allow-list and reach /admin
            raise _refuse("a path segment is . or .. followed by ;parameters")
        resolved.append(segment)
    trailing = segments[-1] in ("", ".", "..")
    path = "/" + "/".join(resolved) + ("/" if trailing and resolved else "")
    if len(path.encode("utf-8")) > limits.MAX_PATH_BYTES:  # the "/" added in front of a relative tail
        raise _refuse(f"the path is over {limits.MAX_PATH_BYTES} bytes")
    return path


def encode_path(path: str) -> str:
    """Percent-encode a normalized path for the upstream: one decode gives `path` back, and normalize_path of the
    result is `path` again. Everything but RFC 3986 pchar and "/" is encoded ("%", "?", "#", spaces, non-ASCII)."""
    return "".join(_ENCODED[b] for b in path.encode("utf-8"))


def path_allowed(path: str, allow_paths: tuple[str, ...]) -> bool:
    """Whether a normalized path is under one of the allow-list's prefixes. Prefixes match whole segments: "/v1"
    allows "/v1", "/v1/" and "/v1/chat" but not "/v1x"; "/api/" allows "/api/" and below but not "/api"; "/"
    allows everything, and so does an empty allow-list."""
    if not allow_paths:
        return True
    for prefix in allow_paths:
        if prefix.endswith("/"):
            if path.startswith(prefix):
                return True
        elif path == prefix or path.startswith(prefix + "/"):
            return True
    return False


def validate_allow_paths(value: object) -> tuple[str, ...]:
    """The allow_paths of a service spec: a list of normalized absolute paths; duplicates go, the order stays."""
    if not isinstance(value, (list, tuple)):
        raise ProtocolError("invalid_field", "allow_paths must be a list of paths")
    if len(value) > limits.MAX_ALLOW_PATHS:
        raise ProtocolError("invalid_field", f"allow_paths holds more than {limits.MAX_ALLOW_PATHS} paths")
    seen: dict[str, None] = {}
    for i, entry in enumerate(value):
        if not isinstance(entry, str) or not entry.startswith("/"):
            raise ProtocolError("invalid_field", f"allow_paths[{i}] must be a string starting with /")
        try:
            size = len(entry.encode("utf-8"))
        except UnicodeEncodeError:
            raise ProtocolError("invalid_field", f"allow_paths[{i}] must be valid UTF-8") from None
        if size > limits.MAX_ALLOW_PATH_BYTES:
            raise ProtocolError("invalid_field", f"allow_paths[{i}] is over {limits.MAX_ALLOW_PATH_BYTES} bytes")
        # entries are compared with decoded paths, so they are written decoded: "%" cannot appear in one, and an
        # entry such as "/a%20b" is refused rather than silently meaning the literal "%20"
        try:
            normal = normalize_path(entry) == entry
        except ProtocolError:
            normal = False
        if not normal:
            raise ProtocolError(
                "invalid_field",
                f"allow_paths[{i}] {entry!r} is not a normalized path (decoded, no //, no . or .. segments,"
                " no backslash, no %)",
            )
        seen[entry] = None
    return tuple(seen)


HOP_BY_HOP = frozenset(
    (
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    )
)
# what the edge and Cloudflare add or read about the client: a client could forge any of them, and the credentials
# among them (authorization, cf-access-jwt-assertion, the service token) are the deployment's, not the sandbox's
_REQUEST_DROPPED = frozenset(("host", "authorization", "cdn-loop", "x-real-ip", "true-client-ip", "forwarded"))
_REQUEST_DROPPED_PREFIXES = ("cf-", "x-forwarded-", "x-flarebox-")
# the sandbox is served from the deployment's origin: it may not clear the origin's cookies (Access' session among
# them) nor widen a service worker's scope beyond its own port's prefix
_RESPONSE_DROPPED = frozenset(("clear-site-data", "service-worker-allowed"))
# framing the adapters rely on: a peer naming it in Connection does not remove it
_NEVER_CONNECTION_OPTION = frozenset(("content-length",))


def _connection_options(values: list[str]) -> set[str]:
    options = {token.strip().lower() for value in values for token in value.split(",")}
    return options - _NEVER_CONNECTION_OPTION - {""}


def _is_cf_cookie(name: str) -> bool:
    # CF_Authorization (Access' session, a credential), CF_AppSession, CF_Binding, cf_clearance: Cloudflare's
    return name.strip().lower().startswith("cf_")


def _without_cf_cookies(cookie: str) -> str:
    pairs = [pair.strip() for pair in cookie.split(";")]
    kept = [pair for pair in pairs if pair and not _is_cf_cookie(pair.partition("=")[0])]
    if len(kept) == len(pairs):
        return cookie
    return "; ".join(kept)


def request_headers(headers: dict[str, str], *, client_ip: str, scheme: str, host: str, prefix: str) -> dict[str, str]:
    """The headers forwarded to the upstream with a client's request (names lower-case, joined values).

    Hop-by-hop headers (and those the Connection header names) go, and so does whatever the edge or Cloudflare
    knows about the client or its credentials; Cloudflare's cookies (CF_*) leave the cookie header. Content-Length
    stays. The x-forwarded-* headers are then set from what the edge itself saw, replacing any the client sent.
    """
    named = _connection_options([v for k, v in headers.items() if k.lower() == "connection"])
    out: dict[str, str] = {}
    for name, value in headers.items():
        name = name.lower()  # they should be already; a capitalised Authorization must not slip through
        if (
            name in HOP_BY_HOP
            or name in named
            or name in _REQUEST_DROPPED
            or name.startswith(_REQUEST_DROPPED_PREFIXES)
        ):
            continue
        if name == "cookie":
            value = _without_cf_cookies(value)
            if not value:
                continue
        out[name] = value
    out["x-forwarded-for"] = client_ip
    out["x-forwarded-proto"] = scheme
    out["x-forwarded-host"] = host
    out["x-forwarded-prefix"] = prefix
    return out


def _sets_cf_cookie(value: str) -> bool:
    # the name is what precedes the first "=" of the first attribute; a bare "CF_x" (no "=") is a nameless cookie
    # with that value, which the browser sends back as "CF_x": refused too. Each comma-separated piece is looked at,
    # in case an adapter joined several Set-Cookie values with ", " (an Expires date's comma yields " 21 Oct ...")
    return any(_is_cf_cookie(piece.partition(";")[0].partition("=")[0]) for piece in value.split(","))


def response_headers(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The upstream's response headers that reach the client, in order, names as given (several Set-Cookie stay
    separate: pass each one as its own pair).

    Hop-by-hop headers (and those the Connection header names) go, every x-flarebox-* (the proxy's own signals,
    which the upstream may not forge), Set-Cookie of Cloudflare's CF_* cookies (Access' session shares this origin),
    Clear-Site-Data and Service-Worker-Allowed.
    """
    named = _connection_options([v for k, v in headers if k.lower() == "connection"])
    out: list[tuple[str, str]] = []
    for name, value in headers:
        lower = name.lower()
        if lower in HOP_BY_HOP or lower in named or lower in _RESPONSE_DROPPED or lower.startswith("x-flarebox-"):
            continue
        if lower == "set-cookie" and _sets_cf_cookie(value):
            continue
        out.append((name, value))
    return out
