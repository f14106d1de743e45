"""Small conversions between Python values and the raw JS objects of the Workers runtime."""

from typing import Any

import js
from pyodide.ffi import JsProxy, to_js

try:  # Pyodide ≥ 0.26 keeps JS null distinct from undefined (None)
    from pyodide.ffi import jsnull
except ImportError:  # pragma: no cover - older Pyodide maps both to None
    jsnull = None


def jsobj(value: dict[str, Any]) -> Any:
    """A Python dict as a plain JS object (nested dicts and lists too). Raw bindings such as ctx.container take
    no Python dicts: without `Object.fromEntries` they would arrive as JS Maps and their options would be ignored."""
    return to_js(value, dict_converter=js.Object.fromEntries)


def is_null(value: Any) -> bool:
    """True for Python None and for JS null/undefined as they reach Python."""
    return value is None or value is jsnull


def headers_dict(js_headers: Any) -> dict[str, str]:
    """A JS Headers object as a dict (the Headers iterator yields lower-case names)."""
    return {str(pair[0]): str(pair[1]) for pair in js_headers.entries()}


def header_pairs(js_headers: Any) -> list[tuple[str, str]]:
    """Every header of a JS Headers object, lower-case names, in its order. Set-Cookie comes from getSetCookie(),
    one pair per cookie: joined with ", " (as a runtime's entries() may give them) they could not be told apart,
    an Expires date holding a comma itself."""
    get_set_cookie = getattr(js_headers, "getSetCookie", None)
    cookies = None if is_null(get_set_cookie) else [str(cookie) for cookie in js_headers.getSetCookie()]
    pairs: list[tuple[str, str]] = []
    for pair in js_headers.entries():
        name, value = str(pair[0]), str(pair[1])
        if name == "set-cookie" and cookies is not None:
            pairs.extend(("set-cookie", cookie) for cookie in cookies)
            cookies = []  # all of them at the first set-cookie entry: later entries repeat them
            continue
        pairs.append((name, value))
    return pairs


def uint8(data: bytes) -> Any:
    """bytes as a JS Uint8Array that owns a copy (valid after this call returns)."""
    return to_js(data)


def to_bytes(value: Any) -> bytes:
    """A JS ArrayBuffer/Uint8Array (or Python bytes/memoryview) as bytes."""
    if isinstance(value, JsProxy):
        return bytes(value.to_bytes())
    return bytes(value)
