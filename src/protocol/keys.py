"""Scoped keys on the wire: their scopes, their shape, and validation of `POST /v1/keys` bodies.

A key is `fbk_<id>_<secret>`: the id (16 hex characters) names it in lists, the audit log and `DELETE
/v1/keys/{id}`; the secret (32 URL-safe base64 characters, 192 random bits) is shown once and stored only as a
digest.
"""

import re
from dataclasses import dataclass

from protocol import limits
from protocol.errors import ProtocolError
from protocol.services import validate_service_name
from protocol.validate import _reject_unknown, validate_name

# What a key may do, each a set of routes (docs/protocol.md §3.2). `proxy`: the port proxy; a proxy key bound to
# a service opens only /v1/proxy, that service's.
SCOPES = ("exec", "files", "snapshots", "manage", "proxy")

KEY_PREFIX = "fbk_"
KEY_ID_PATTERN = r"^[0-9a-f]{16}$"
# prefix, id, `_`, secret: anything of this shape is treated as a key secret wherever it must not appear
KEY_PATTERN = r"fbk_[0-9a-f]{16}_[A-Za-z0-9_-]{32}"

_KEY_ID = re.compile(KEY_ID_PATTERN)
_KEY = re.compile(KEY_PATTERN)
_KEY_FIELDS = frozenset(("namespace", "workspace", "scopes", "expires_in", "label", "service"))


def validate_key_id(value: object) -> str:
    if not isinstance(value, str) or not _KEY_ID.fullmatch(value):
        raise ProtocolError("key_not_found", "key ids are 16 lowercase hex characters")
    return value


def split_key(presented: str) -> tuple[str, str] | None:
    """(id, secret) of a presented key, or None when it does not have a key's shape."""
    if not _KEY.fullmatch(presented):
        return None
    return presented[4:20], presented[21:]


@dataclass(frozen=True)
class KeyRequest:
    namespace: str
    workspace: str | None  # None: every workspace of the namespace
    scopes: tuple[str, ...]  # sorted, each once
    expires_in: int | None  # seconds; None: never
    label: str
    service: str | None = None  # a proxy key bound to this service of its workspace: it opens /v1/proxy only


def parse_key_request(obj: dict) -> KeyRequest:
    _reject_unknown(obj, _KEY_FIELDS)
    if "namespace" not in obj:
        raise ProtocolError("invalid_field", "namespace is required")
    namespace = validate_name(obj["namespace"], "namespace")
    workspace = obj.get("workspace")
    if workspace is not None:
        workspace = validate_name(workspace, "workspace")
    scopes = obj.get("scopes")
    if not isinstance(scopes, list) or not scopes or not all(isinstance(s, str) for s in scopes):
        raise ProtocolError("invalid_field", f"scopes must be a non-empty list of: {', '.join(SCOPES)}")
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown:
        raise ProtocolError("invalid_field", f"unknown scope {unknown[0][:64]!r}; scopes are: {', '.join(SCOPES)}")
    expires_in = obj.get("expires_in")
    if expires_in is not None and (
        isinstance(expires_in, bool)
        or not isinstance(expires_in, int)
        or not 1 <= expires_in <= limits.MAX_KEY_EXPIRES_IN_SECONDS
    ):
        raise ProtocolError(
            "invalid_field", f"expires_in is a whole number of seconds from 1 to {limits.MAX_KEY_EXPIRES_IN_SECONDS}"
        )
    label = obj.get("label", "")
    if label is None:
        label = ""
    if not isinstance(label, str) or len(label) > limits.MAX_KEY_LABEL_CHARS or not label.isprintable():
        raise ProtocolError(
            "invalid_field", f"label is printable text of at most {limits.MAX_KEY_LABEL_CHARS} characters"
        )
    service = obj.get("service")
    if service is not None:
        service = validate_service_name(service)
        if workspace is None or set(scopes) != {"proxy"}:
            raise ProtocolError("invalid_field", 'a key bound to a service needs a workspace and scopes ["proxy"]')
    return KeyRequest(namespace, workspace, tuple(sorted(set(scopes))), expires_in, label, service)
