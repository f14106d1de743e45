"""ports.Storage over one SQLite file per workspace (the standalone stand-in for ctx.storage.sql)."""

import sqlite3
from pathlib import Path
from typing import Any

from protocol.errors import ProtocolError
from standalone.reserve import DiskReserve

_SQLITE_FULL = 13


class SqliteStorage:
    """Autocommit per statement, WAL: a killed server keeps every statement that returned."""

    def __init__(self, path: Path, reserve: DiskReserve | None = None):
        self.path = Path(path)
        self.reserve = reserve
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: autocommit, like ctx.storage.sql outside an explicit transaction
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL is durable across a process crash (SIGKILL); only a power cut can lose the last commits
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA busy_timeout=5000")

    def sql(self, query: str, *params: Any) -> list[dict[str, Any]]:
        """Run one statement. A full disk first releases the data dir's reserve and retries once; still full, it
        is ProtocolError('storage_full') with nothing written (each statement commits alone)."""
        try:
            rows = self._sql(query, params)
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorcode", None) != _SQLITE_FULL:
                raise
            if self.reserve is None or not self.reserve.release():
                raise ProtocolError("storage_full") from None
            try:
                rows = self._sql(query, params)
            except sqlite3.OperationalError as again:
                if getattr(again, "sqlite_errorcode", None) == _SQLITE_FULL:
                    raise ProtocolError("storage_full") from None
                raise
        if self.reserve is not None:
            self.reserve.recheck()
        return rows

    def _sql(self, query: str, params: tuple) -> list[dict[str, Any]]:
        if self._db is None:
            raise RuntimeError(f"storage {self.path.name} is closed")
        try:
            cursor = self._db.execute(query, params)
        except sqlite3.ProgrammingError as exc:
            # ctx.storage.sql.exec accepts several statements at once (schema scripts); sqlite3 needs executescript
            if params or "one statement" not in str(exc):
                raise
            self._db.executescript(query)
            return []
        return [dict(row) for row in cursor.fetchall()]

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
