"""The directory object's operations. `call(op, args)` is its whole interface: JSON-shaped arguments in, a
JSON-shaped answer out (so the in-process stub and the Durable Object stub carry the same thing), ProtocolError for
a refusal.

Keys are stored as SHA-256 digests of the whole key; a presented key is looked up by its public id and its digest
compared in constant time (`hmac.compare_digest`), also when no such id exists.
"""

import hashlib
import hmac
import json
import secrets
from typing import Any

from directory.audit import AuditRecord, to_wire
from directory.store import open_tables
from durable.ports import Clock, Storage
from durable.settings import Settings
from durable.timefmt import iso_ms
from protocol import limits
from protocol.errors import ProtocolError
from protocol.keys import KEY_PREFIX, KeyRequest, split_key

# `last_used` is written at most this often per key: a verified request must not cost a write every time.
LAST_USED_RESOLUTION_MS = 60_000
# Retention runs on every this many appended records (and on the first).
PRUNE_EVERY = 64
# One audit page holds at most this much of records' details (command texts run to 64 KiB each): a page past it
# ends early, with `next` pointing on, so no answer outgrows a Worker's memory and nothing is cut.
AUDIT_PAGE_DETAIL_BYTES = 4 * 1024 * 1024

_NO_SUCH_DIGEST = hashlib.sha256(b"no such key").hexdigest()


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def key_to_wire(row: dict[str, Any]) -> dict[str, Any]:
    """A key object of docs/protocol.md §6.15 (never its secret or digest)."""
    return {
        "id": row["id"],
        "label": row["label"],
        "namespace": row["namespace"],
        "workspace": row["workspace"],
        "scopes": row["scopes"].split(",") if row["scopes"] else [],
        "service": row.get("service"),
        "created_at": iso_ms(row["created_ms"]),
        "expires_at": iso_ms(row["expires_ms"]),
        "last_used_at": iso_ms(row["last_used_ms"]),
    }


class Directory:
    def __init__(self, storage: Storage, clock: Clock, settings: Settings):
        self._sql = storage.sql
        self._clock = clock
        self._settings = settings
        open_tables(storage)
        self._ops = {
            "mint_key": self.mint_key,
            "list_keys": self.list_keys,
            "revoke_key": self.revoke_key,
            "verify_key": self.verify_key,
            "reserve_workspace": self.reserve_workspace,
            "unindex_workspace": self.unindex_workspace,
            "list_workspaces": self.list_workspaces,
            "append_audit": self.append_audit,
            "list_audit": self.list_audit,
        }

    async def call(self, op: str, args: dict[str, Any]) -> Any:
        handler = self._ops.get(op)
        if handler is None:
            raise ProtocolError("not_found")
        return handler(**args)

    # --- keys --------------------------------------------------------------------------------------------------

    def mint_key(self, request: dict[str, Any]) -> dict[str, Any]:
        req = KeyRequest(**{**request, "scopes": tuple(request["scopes"])})
        now = self._clock.now_ms()
        key_id = secrets.token_hex(8)
        key = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(24)}"
        expires = None if req.expires_in is None else now + req.expires_in * 1000
        # one statement: the cap holds however many mints race; expired keys (listed until revoked) do not count
        self._sql(
            "INSERT INTO keys (id, digest, label, namespace, workspace, scopes, created_ms, expires_ms, service)"
            " SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?"
            " WHERE (SELECT count(*) FROM keys WHERE expires_ms IS NULL OR expires_ms > ?) < ?",
            key_id,
            _digest(key),
            req.label,
            req.namespace,
            req.workspace,
            ",".join(req.scopes),
            now,
            expires,
            req.service,
            now,
            limits.MAX_KEYS,
        )
        rows = self._sql("SELECT * FROM keys WHERE id = ?", key_id)
        if not rows:
            raise ProtocolError("quota_exceeded", f"the deployment already holds {limits.MAX_KEYS} keys")
        return {**key_to_wire(rows[0]), "key": key}

    def list_keys(self, namespace: str | None) -> list[dict[str, Any]]:
        if namespace is None:
            rows = self._sql("SELECT * FROM keys ORDER BY created_ms, id")
        else:
            rows = self._sql("SELECT * FROM keys WHERE namespace = ? ORDER BY created_ms, id", namespace)
        return [key_to_wire(r) for r in rows]

    def revoke_key(self, key_id: str) -> dict[str, Any]:
        rows = self._sql("SELECT * FROM keys WHERE id = ?", key_id)
        if not rows:
            raise ProtocolError("key_not_found")
        self._sql("DELETE FROM keys WHERE id = ?", key_id)
        return key_to_wire(rows[0])

    def verify_key(self, key: str) -> dict[str, Any]:
        """The key's record, or unauthorized (unknown, revoked, expired or a wrong secret: one answer)."""
        parts = split_key(key)
        rows = self._sql("SELECT * FROM keys WHERE id = ?", parts[0]) if parts else []
        stored = rows[0]["digest"] if rows else _NO_SUCH_DIGEST
        matches = hmac.compare_digest(stored.encode(), _digest(key).encode())
        if not (rows and matches):
            raise ProtocolError("unauthorized")
        row = rows[0]
        now = self._clock.now_ms()
        if row["expires_ms"] is not None and now >= row["expires_ms"]:
            raise ProtocolError("unauthorized", "the key has expired")
        if row["last_used_ms"] is None or now - row["last_used_ms"] >= LAST_USED_RESOLUTION_MS:
            try:
                self._sql("UPDATE keys SET last_used_ms = ? WHERE id = ?", now, row["id"])
            except ProtocolError as err:  # a full disk must not lock every key out: last_used is a courtesy
                if err.code != "storage_full":
                    raise
        return key_to_wire(row)

    # --- the workspace index ------------------------------------------------------------------------------------

    def reserve_workspace(self, namespace: str, workspace: str) -> dict[str, bool]:
        """Index a workspace about to be created. `created` tells whether this call added it (so a failed create
        can take it back); quota_exceeded when the namespace is full. One statement, so the cap holds under any
        number of concurrent creations."""
        cap = self._settings.max_workspaces_per_namespace or -1
        existed = self._indexed(namespace, workspace)
        self._sql(
            "INSERT OR IGNORE INTO workspaces (namespace, workspace, created_ms) SELECT ?, ?, ?"
            " WHERE ? < 0 OR (SELECT count(*) FROM workspaces WHERE namespace = ?) < ?",
            namespace,
            workspace,
            self._clock.now_ms(),
            cap,
            namespace,
            cap,
        )
        if existed:
            return {"created": False}
        if not self._indexed(namespace, workspace):
            raise ProtocolError(
                "quota_exceeded", f"the namespace {namespace!r} already holds {cap} workspaces; delete one first"
            )
        return {"created": True}

    def adopt(self, namespace: str, workspace: str) -> None:
        """Index a workspace that existed before its deployment had a directory (no cap: it is already there)."""
        self._sql(
            "INSERT OR IGNORE INTO workspaces (namespace, workspace, created_ms) VALUES (?, ?, ?)",
            namespace,
            workspace,
            self._clock.now_ms(),
        )

    def _indexed(self, namespace: str, workspace: str) -> bool:
        return bool(self._sql("SELECT 1 FROM workspaces WHERE namespace = ? AND workspace = ?", namespace, workspace))

    def unindex_workspace(self, namespace: str, workspace: str) -> dict[str, bool]:
        self._sql("DELETE FROM workspaces WHERE namespace = ? AND workspace = ?", namespace, workspace)
        return {"unindexed": True}

    def list_workspaces(
        self, namespace: str | None, workspace: str | None, after: str | None, limit: int
    ) -> dict[str, Any]:
        """Index entries in (namespace, workspace) order after the cursor `after` ("ns/ws"), at most `limit`."""
        after_ns, _, after_ws = (after or "").partition("/")
        rows = self._sql(
            "SELECT namespace, workspace FROM workspaces"
            " WHERE (? IS NULL OR namespace = ?) AND (? IS NULL OR workspace = ?)"
            " AND (namespace > ? OR (namespace = ? AND workspace > ?))"
            " ORDER BY namespace, workspace LIMIT ?",
            namespace,
            namespace,
            workspace,
            workspace,
            after_ns,
            after_ns,
            after_ws,
            limit + 1,
        )
        page = [(r["namespace"], r["workspace"]) for r in rows[:limit]]
        following = f"{page[-1][0]}/{page[-1][1]}" if len(rows) > limit else None
        return {"workspaces": page, "next": following}

    # --- the audit log ------------------------------------------------------------------------------------------

    def append_audit(self, record: dict[str, Any]) -> dict[str, int]:
        r = AuditRecord.from_json(record)
        at_ms = self._clock.now_ms()
        # RETURNING: one statement, not a second one for last_insert_rowid() (every audited request makes one, and
        # on Cloudflare each statement is a call out of Pyodide)
        rows = self._sql(
            "INSERT INTO audit (at_ms, key_id, key_label, namespace, workspace, operation, request_id, status, code,"
            " duration_ms, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING seq",
            at_ms,
            r.key_id,
            r.key_label,
            r.namespace,
            r.workspace,
            r.operation,
            r.request_id,
            r.status,
            r.code,
            r.duration_ms,
            json.dumps(r.detail, ensure_ascii=False, separators=(",", ":")),
        )
        seq = rows[0]["seq"]
        if (seq - 1) % PRUNE_EVERY == 0:
            self._prune(seq)
        return {"seq": seq}

    def _prune(self, newest: int) -> None:
        oldest_kept_ms = self._clock.now_ms() - self._settings.audit_max_age_days * 86_400_000
        self._sql(
            "DELETE FROM audit WHERE seq <= ? OR at_ms < ?", newest - self._settings.audit_max_records, oldest_kept_ms
        )

    def list_audit(
        self,
        namespace: str | None,
        workspace: str | None,
        since_ms: int | None,
        before: int | None,
        limit: int,
    ) -> dict[str, Any]:
        """Newest first; `before` is the `next` cursor of the previous page (a seq)."""
        rows = self._sql(
            "SELECT * FROM audit WHERE (? IS NULL OR namespace = ?) AND (? IS NULL OR workspace = ?)"
            " AND (? IS NULL OR at_ms >= ?) AND (? IS NULL OR seq < ?) ORDER BY seq DESC LIMIT ?",
            namespace,
            namespace,
            workspace,
            workspace,
            since_ms,
            since_ms,
            before,
            before,
            limit + 1,
        )
        records = []
        size = 0
        for row in rows[:limit]:
            size += len(row["detail"])
            if records and size > AUDIT_PAGE_DETAIL_BYTES:
                return {"records": records, "next": records[-1]["seq"]}
            seq = row.pop("seq")
            row["detail"] = json.loads(row["detail"])
            records.append(to_wire(seq, AuditRecord(**row)))
        following = records[-1]["seq"] if len(rows) > limit else None
        return {"records": records, "next": following}
