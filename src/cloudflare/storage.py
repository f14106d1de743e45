"""ports.Storage over the Durable Object's SQLite: `ctx.storage.sql.exec(query, *bindings)`."""

from typing import Any

from pyodide.ffi import JsProxy

from cloudflare.jsutil import is_null, to_bytes


def _binding(value: Any) -> Any:
    # SQLite has no boolean type and the runtime's SQL bindings take numbers, strings, buffers and null only.
    if isinstance(value, bool):
        return int(value)
    return value


def _column(value: Any) -> Any:
    if is_null(value):
        return None
    if isinstance(value, JsProxy):  # a BLOB arrives as an ArrayBuffer
        return to_bytes(value)
    return value


class DurableStorage:
    def __init__(self, ctx_storage: Any):
        # ctx.storage is the SDK's wrapper: arguments are converted to JS and results back to Python.
        self._sql = ctx_storage.sql

    def sql(self, query: str, *params: Any) -> list[dict[str, Any]]:
        cursor = self._sql.exec(query, *(_binding(p) for p in params))
        return [{str(k): _column(v) for k, v in dict(row).items()} for row in cursor.toArray()]
