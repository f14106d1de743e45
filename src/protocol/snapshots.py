"""Validation of what a caller says about snapshots and backups: ids, labels, pins, rollback and fork requests.

Snapshot ids are the container platform's (standalone `s-<ms>-<hex>`, Cloudflare its own), so they are checked
for shape only; whether one exists is the workspace's answer (snapshot_not_found). No runtime imports.
"""

import re

from protocol.errors import ProtocolError
from protocol.validate import _bool, _reject_unknown, _text, validate_name

LATEST = "latest"
MAX_LABEL_CHARS = 100
_SNAPSHOT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")
_BACKUP_ID = re.compile(r"b-\d{13}-[0-9a-f]{6}")


def validate_snapshot_id(value: object, what: str = "snapshot") -> str:
    if not isinstance(value, str) or not _SNAPSHOT_ID.fullmatch(value):
        raise ProtocolError("invalid_field", f"{what} must be a snapshot id (GET …/snapshots lists them)")
    return value


def validate_backup_id(value: object) -> str:
    if not isinstance(value, str) or not _BACKUP_ID.fullmatch(value):
        raise ProtocolError("invalid_field", "backup must be a backup id like b-1764406800123-9f2c1a")
    return value


def parse_label(value: object) -> str | None:
    """A label is free text for people: 1 to 100 characters, no control characters; null for none."""
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_LABEL_CHARS:
        raise ProtocolError("invalid_field", f"label must be a string of 1 to {MAX_LABEL_CHARS} characters, or null")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ProtocolError("invalid_field", "label must not contain control characters")
    return value


def parse_snapshot_request(obj: dict) -> tuple[str | None, bool]:
    """POST …/snapshot {"label"?, "keep"?} → (label, keep)."""
    _reject_unknown(obj, frozenset(("label", "keep")))
    return parse_label(obj.get("label")), _bool(obj, "keep", False)


def parse_snapshot_patch(obj: dict) -> tuple[bool, str | None, bool | None]:
    """PATCH …/snapshots/{id} {"label"?, "keep"?} → (label given, label, keep or None); at least one field."""
    _reject_unknown(obj, frozenset(("label", "keep")))
    if not obj:
        raise ProtocolError("invalid_field", "send label, keep or both")
    keep = _bool(obj, "keep", False) if "keep" in obj else None
    return "label" in obj, parse_label(obj.get("label")), keep


def parse_restore_request(obj: dict) -> tuple[str | None, str | None, bool]:
    """POST …/restore {"snapshot": id|"latest"} or {"backup": id}, plus "discard_changes" → (snapshot, backup,
    discard)."""
    _reject_unknown(obj, frozenset(("snapshot", "backup", "discard_changes")))
    has_snapshot, has_backup = obj.get("snapshot") is not None, obj.get("backup") is not None
    if has_snapshot == has_backup:
        raise ProtocolError("invalid_field", 'send exactly one of "snapshot" (an id or "latest") and "backup"')
    snapshot = validate_snapshot_id(obj["snapshot"]) if has_snapshot else None
    backup = validate_backup_id(obj["backup"]) if has_backup else None
    return snapshot, backup, _bool(obj, "discard_changes", False)


def parse_fork_source(value: object) -> tuple[str, str, str | None]:
    """PUT's "from": {"namespace", "workspace", "snapshot"?} → (namespace, workspace, snapshot id, "latest" or
    None for the source's files as they are now)."""
    if not isinstance(value, dict):
        raise ProtocolError("invalid_field", 'from must be an object {"namespace", "workspace", "snapshot"?}')
    _reject_unknown(value, frozenset(("namespace", "workspace", "snapshot")))
    namespace = validate_name(_text(value, "namespace"), "from.namespace")
    workspace = validate_name(_text(value, "workspace"), "from.workspace")
    snapshot = value.get("snapshot")
    return namespace, workspace, None if snapshot is None else validate_snapshot_id(snapshot, "from.snapshot")
