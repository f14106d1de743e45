"""The directory's tables in its private SQL storage. One statement per call, no explicit transactions (as in
durable/store.py): every decision that must be atomic — the namespace cap, the key cap — is a single statement."""

from durable.ports import Storage

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS keys (id TEXT PRIMARY KEY, digest TEXT NOT NULL, label TEXT NOT NULL,"
    " namespace TEXT NOT NULL, workspace TEXT, scopes TEXT NOT NULL, created_ms INTEGER NOT NULL,"
    " expires_ms INTEGER, last_used_ms INTEGER, service TEXT)",
    "CREATE TABLE IF NOT EXISTS workspaces (namespace TEXT NOT NULL, workspace TEXT NOT NULL,"
    " created_ms INTEGER NOT NULL, PRIMARY KEY (namespace, workspace))",
    "CREATE TABLE IF NOT EXISTS audit (seq INTEGER PRIMARY KEY AUTOINCREMENT, at_ms INTEGER NOT NULL,"
    " key_id TEXT, key_label TEXT, namespace TEXT, workspace TEXT, operation TEXT NOT NULL, request_id TEXT,"
    " status INTEGER NOT NULL, code TEXT, duration_ms INTEGER NOT NULL, detail TEXT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS audit_target ON audit (namespace, workspace, seq)",
)


# Columns added after the first release, for tables created before them (ADD COLUMN fails once it is there).
MIGRATIONS = ("ALTER TABLE keys ADD COLUMN service TEXT",)


def open_tables(storage: Storage) -> None:
    for statement in SCHEMA:
        storage.sql(statement)
    for statement in MIGRATIONS:
        try:
            storage.sql(statement)
        except Exception as exc:  # both runtimes raise their own error type for "duplicate column"
            if "duplicate column" not in str(exc).lower():
                raise
