"""The workspace's tables in its private SQL storage (ctx.storage.sql / one SQLite file).

One statement per call (both runtimes accept that) and no explicit transactions (Durable Objects forbid BEGIN in
SQL): every write is a single statement, so a crash leaves either the old or the new value.
"""

import json
from typing import Any

from durable.ports import Storage

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS snapshots (id TEXT PRIMARY KEY, created_at_ms INTEGER NOT NULL, size INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS ledger (seq INTEGER PRIMARY KEY, request_id TEXT NOT NULL UNIQUE, kind TEXT NOT NULL)",
)
_TABLES = ("meta", "snapshots", "ledger")


class Store:
    def __init__(self, storage: Storage):
        self.sql = storage.sql
        for statement in _SCHEMA:
            self.sql(statement)

    def get(self, key: str, default: Any = None) -> Any:
        rows = self.sql("SELECT value FROM meta WHERE key = ?", key)
        return json.loads(rows[0]["value"]) if rows else default

    def put(self, key: str, value: Any) -> None:
        self.sql(
            "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            key,
            json.dumps(value, separators=(",", ":")),
        )

    def delete(self, key: str) -> None:
        self.sql("DELETE FROM meta WHERE key = ?", key)

    def wipe(self) -> None:
        """Forget everything (the tables stay, empty): a deleted workspace leaves no metadata behind."""
        for table in _TABLES:
            self.sql(f"DELETE FROM {table}")  # noqa: S608 - fixed table names
