"""Query-string parsing with the protocol's rules: every parameter known to the route, none repeated, valid
percent-encoding and UTF-8. Decoding follows application/x-www-form-urlencoded (`+` is a space), like the
ASGI and Workers URL parsers the runtimes use."""

import re
from urllib.parse import unquote_plus

from protocol.errors import ProtocolError

_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def parse_query(raw: str, allowed: frozenset[str] | set[str]) -> dict[str, str]:
    params: dict[str, str] = {}
    if not raw:
        return params  # a shortcut: the loop below gives the same for ""  # pragma: no mutate
    for item in raw.split("&"):
        if item == "":
            continue  # tolerate `?a=1&` and a bare `?`
        key_raw, _, value_raw = item.partition("=")
        if _BAD_ESCAPE.search(item):
            raise ProtocolError("invalid_query", "malformed percent-encoding in the query")
        try:
            key = unquote_plus(key_raw, errors="strict")
            value = unquote_plus(value_raw, errors="strict")
        except UnicodeDecodeError:
            raise ProtocolError("invalid_query", "query parameters must be UTF-8") from None
        if key not in allowed:
            raise ProtocolError("invalid_query", f"unknown query parameter {key[:64]!r}")
        if key in params:
            raise ProtocolError("invalid_query", f"query parameter {key!r} is repeated")
        params[key] = value
    return params


def names_parameter(raw: str, name: str) -> bool:
    """Whether a raw query has a parameter called `name` (an ASCII name, never percent-encoded), whatever else it
    holds: it picks the route's endpoint, whose own parse_query then checks the whole query."""
    return any(item.partition("=")[0] == name for item in raw.split("&"))
