"""The request ledger: which request ids this workspace has seen, bounded to the newest LEDGER_MAX_REQUESTS.

An id used by an exec is never run again (duplicate_request). A cancel that arrives before its exec is kept as
`cancel`, so the exec, when it arrives, ends with command_cancelled instead of running; the id is then
`cancelled_early`: used, and answered on reattach with the terminal event that exec's stream ended with.
"""

from durable.store import Store
from protocol import limits

EXEC = "exec"  # handed to the supervisor (or on its way there)
CANCEL = "cancel"  # cancelled before any exec with this id arrived
CANCELLED_EARLY = "cancelled_early"  # its exec arrived after the cancel and ended command_cancelled, never run


class Ledger:
    def __init__(self, store: Store, limit: int = limits.LEDGER_MAX_REQUESTS):
        self._sql = store.sql
        self._limit = limit

    def lookup(self, request_id: str) -> str | None:
        rows = self._sql("SELECT kind FROM ledger WHERE request_id = ?", request_id)
        if not rows:
            return None
        return rows[0]["kind"]  # at most one row: [0] is [-1]  # pragma: no mutate

    def record_exec(self, request_id: str) -> str:
        """Mark the id used; returns its kind now: EXEC, or CANCELLED_EARLY when a cancel came first. The id keeps
        its place in the order."""
        kind = CANCELLED_EARLY if self.lookup(request_id) == CANCEL else EXEC
        self._sql(
            "INSERT INTO ledger (request_id, kind) VALUES (?, ?) ON CONFLICT(request_id) DO UPDATE SET kind = ?",
            request_id,
            kind,
            kind,
        )
        self._trim()
        return kind

    def record_cancel(self, request_id: str) -> None:
        self._sql("INSERT OR IGNORE INTO ledger (request_id, kind) VALUES (?, ?)", request_id, CANCEL)
        self._trim()

    def __len__(self) -> int:
        return self._sql("SELECT COUNT(*) AS n FROM ledger")[0]["n"]  # one row  # pragma: no mutate

    def _trim(self) -> None:
        self._sql("DELETE FROM ledger WHERE seq <= (SELECT MAX(seq) FROM ledger) - ?", self._limit)
