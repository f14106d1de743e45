"""The workspace's tables in its private SQL storage (ctx.storage.sql / one SQLite file).

One statement per call (both runtimes accept that) and no explicit transactions (Durable Objects forbid BEGIN in
SQL): every write is a single statement, so a crash leaves either the old or the new value.
"""

import json
from typing import Any

from durable.ports import Storage

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    # expires_at_ms: NULL where the platform never expires a snapshot (standalone)
    "CREATE TABLE IF NOT EXISTS snapshots (id TEXT PRIMARY KEY, created_at_ms INTEGER NOT NULL, size INTEGER NOT NULL,"
    " expires_at_ms INTEGER, label TEXT, kept INTEGER NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS ledger (seq INTEGER PRIMARY KEY, request_id TEXT NOT NULL UNIQUE, kind TEXT NOT NULL)",
)
_TABLES = ("meta", "snapshots", "ledger")


class Store:
    def __init__(self, storage: Storage):
        self.sql = storage.sql
        self._cache: dict[str, str] | None = None
        for statement in _SCHEMA:
            self.sql(statement)
        # True when this construction added snapshots.expires_at_ms to a table made before it existed: its rows'
        # expiries are unknown until the workspace fills them in (WorkspaceState.fill_expiries)
        self.added_expiry = self._add_column("snapshots", "expires_at_ms", "INTEGER")
        self._add_column("snapshots", "label", "TEXT")  # labels and pins came later still
        self._add_column("snapshots", "kept", "INTEGER NOT NULL DEFAULT 0")

    def _add_column(self, table: str, column: str, kind: str) -> bool:
        """Add a column a table made by an older release lacks (CREATE TABLE IF NOT EXISTS keeps the old shape).
        Probed with a query that fails only on such a table, so a current one never sees an error."""
        try:
            self.sql(f"SELECT {column} FROM {table} LIMIT 0")  # noqa: S608 - fixed names
            return False
        except Exception:
            self.sql(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            return True

    def _meta(self) -> dict[str, str]:
        """The meta table as stored (JSON text per key), read once: this object is its storage's only user (one
        Durable Object, one workspace entry), so what it wrote is what is there. Every exec reads and writes a few
        keys, and on Cloudflare each statement is a call out of Pyodide."""
        if self._cache is None:
            self._cache = {row["key"]: row["value"] for row in self.sql("SELECT key, value FROM meta")}
        return self._cache

    def has(self, key: str) -> bool:
        """A value other than null is stored under `key` (without decoding it: a workspace's config is read this
        way on every request only to learn that the workspace exists)."""
        text = self._meta().get(key)
        return text is not None and text != "null"

    def get(self, key: str, default: Any = None) -> Any:
        text = self._meta().get(key)
        return json.loads(text) if text is not None else default

    def put(self, key: str, value: Any) -> None:
        text = json.dumps(value, separators=(",", ":"))
        meta = self._meta()
        if meta.get(key) == text:
            return  # unchanged: no statement
        self.sql(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            key,
            text,
        )
        meta[key] = text  # only once stored: a failed write leaves the cache as the table is

    def delete(self, key: str) -> None:
        meta = self._meta()
        if key not in meta:
            return
        self.sql("DELETE FROM meta WHERE key = ?", key)
        del meta[key]

    def wipe(self) -> None:
        """Forget everything (the tables stay, empty): a deleted workspace leaves no metadata behind."""
        try:
            for table in _TABLES:
                self.sql(f"DELETE FROM {table}")  # noqa: S608 - fixed table names
        finally:
            self._cache = None  # read again: what is there now
