"""Audit records: what one request that changed or ran something did, by whom, with what outcome.

Built by the edge (it knows the principal, the route and the answer) and stored by the directory. A record holds
no token, key secret or body other than a command's text, and that text is redacted first: the deployment token
and anything shaped like a key secret become `[redacted]`.
"""

import re
from dataclasses import dataclass, field
from typing import Any

from durable.timefmt import iso_ms
from protocol.keys import KEY_PATTERN

REDACTED = "[redacted]"
_KEY = re.compile(KEY_PATTERN)


def redact(text: str, token: str | None) -> str:
    if token:
        text = text.replace(token, REDACTED)
    return _KEY.sub(REDACTED, text)


@dataclass(frozen=True)
class AuditRecord:
    key_id: str | None  # None: the deployment token (admin)
    key_label: str | None
    namespace: str | None
    workspace: str | None
    operation: str  # the route's operation (durable/operations.py names, or mint_key / revoke_key)
    request_id: str | None
    status: int
    code: str | None  # the error code of a refused or failed request
    duration_ms: int
    detail: dict[str, Any] = field(default_factory=dict)  # command / path and size / the minted or revoked key
    at_ms: int | None = None  # stamped by the directory when it stores the record (the request's end)

    def to_json(self) -> dict[str, Any]:
        # not dataclasses.asdict: its recursive deep copy was a third of the audit's cost on every request
        return {**self.__dict__, "detail": dict(self.detail)}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "AuditRecord":
        return cls(**obj)


def to_wire(seq: int, record: AuditRecord) -> dict[str, Any]:
    """An audit record of docs/protocol.md §6.18."""
    return {
        "seq": seq,
        "at": iso_ms(record.at_ms),
        "actor": "admin" if record.key_id is None else "key",
        "key_id": record.key_id,
        "key_label": record.key_label,
        "namespace": record.namespace,
        "workspace": record.workspace,
        "operation": record.operation,
        "request_id": record.request_id,
        "status": record.status,
        "code": record.code,
        "duration_ms": record.duration_ms,
        **record.detail,
    }
