"""The operations a workspace object accepts: each one's name and its typed arguments.

The edge's route table names these (worker/routes.py), the workspace dispatches on them (durable/workspace.py),
and tests/unit/test_operations.py checks the two against this table. Arguments cross the Cloudflare stub as the
JSON of `to_json` (plain field names, nested dataclasses as objects) and are rebuilt by `from_json` without being
validated again: only the Worker can call the object, and it validated them.

No runtime imports: this runs under CPython and Pyodide.
"""

from dataclasses import MISSING, asdict, dataclass, fields, is_dataclass
from typing import Any, get_args, get_origin

from protocol.errors import ProtocolError
from protocol.files import ListRequest, MkdirRequest, MoveRequest, SignalRequest
from protocol.pty import PtyRequest
from protocol.validate import ExecRequest, WorkspaceConfig


@dataclass(frozen=True)
class NoArgs:
    """Operations on the workspace as a whole: everything they need is the workspace itself."""


@dataclass(frozen=True)
class ForkSource:
    """PUT {"from": …}: the workspace (and snapshot; None = its files as they are now) a new one starts from."""

    namespace: str
    workspace: str
    snapshot: str | None = None  # an id, "latest", or None
    image_given: bool = False  # the PUT named an image (otherwise the fork takes its source's)


@dataclass(frozen=True)
class PutConfigArgs:
    config: WorkspaceConfig  # validated, with the deployment's default instance filled in
    source: ForkSource | None = None
    # The source's snapshot, shared with this workspace by the edge (SHARE_SNAPSHOT) before the PUT reaches it
    fork: dict[str, Any] | None = None


@dataclass(frozen=True)
class ShareArgs:
    """What a fork asks of its source: a snapshot to share (None = a new one when it runs, else its newest)."""

    snapshot: str | None = None


@dataclass(frozen=True)
class SnapshotArgs:
    label: str | None = None
    keep: bool = False


@dataclass(frozen=True)
class PatchSnapshotArgs:
    snapshot_id: str
    label: str | None = None
    set_label: bool = False  # the body named "label" (null clears it)
    keep: bool | None = None


@dataclass(frozen=True)
class RestoreArgs:
    snapshot: str | None = None  # an id or "latest"
    backup: str | None = None  # exactly one of the two
    discard_changes: bool = False


@dataclass(frozen=True)
class ImportArgs:
    length: int | None  # the archive's Content-Length, when sent


@dataclass(frozen=True)
class ExecArgs:
    request: ExecRequest


@dataclass(frozen=True)
class ReattachArgs:
    request_id: str
    offset: int = 0


@dataclass(frozen=True)
class CancelArgs:
    request_id: str


@dataclass(frozen=True)
class ReadFileArgs:
    path: str


@dataclass(frozen=True)
class WriteFileArgs:
    path: str
    mode: int
    length: int  # the upload's Content-Length, checked against the deployment's limit


@dataclass(frozen=True)
class StatArgs:
    path: str


@dataclass(frozen=True)
class DeleteFileArgs:
    path: str
    recursive: bool = False


@dataclass(frozen=True)
class ArchiveArgs:
    """GET or PUT …/files/archive: one directory as a tar.zst."""

    path: str
    length: int | None = None  # a PUT's Content-Length, when sent


@dataclass(frozen=True)
class SignalArgs:
    pid: int
    request: SignalRequest


@dataclass(frozen=True)
class ServiceArgs:
    name: str  # validated service name


@dataclass(frozen=True)
class PutServiceArgs:
    name: str
    spec: dict[str, Any]  # protocol.services.ServiceSpec.to_json() of the validated body


@dataclass(frozen=True)
class ServiceLogsArgs:
    name: str
    offset: int = 0


@dataclass(frozen=True)
class SecretArgs:
    name: str  # validated secret name


@dataclass(frozen=True)
class PutSecretArgs:
    name: str
    value: str  # never logged, audited or answered


@dataclass(frozen=True)
class ProxyArgs:
    """A request for a port inside the workspace, as the edge prepared it: the path normalized (protocol/proxy.py)
    and the headers the upstream may see (the caller's credentials already stripped)."""

    method: str
    path: str  # normalized, decoded; encoded again when forwarded
    query: str  # raw, without `?`
    headers: dict[str, str]
    port: int | None = None  # …/ports/{port}/…
    service: str | None = None  # /v1/proxy: the service the key is bound to


@dataclass(frozen=True)
class Operation:
    name: str
    args: type  # the frozen dataclass its handler takes
    streams_body: bool = False  # the request body is passed to the workspace as a stream (file uploads)
    socket: bool = False  # a WebSocket: the client's socket (ports.Socket) is passed as the body


GET = Operation("get", NoArgs)
PUT_CONFIG = Operation("put_config", PutConfigArgs)
DELETE = Operation("delete", NoArgs)
EXEC = Operation("exec", ExecArgs)
REATTACH = Operation("reattach", ReattachArgs)
CANCEL = Operation("cancel", CancelArgs)
READ_FILE = Operation("read_file", ReadFileArgs)
WRITE_FILE = Operation("write_file", WriteFileArgs, streams_body=True)
LIST_FILES = Operation("list_files", ListRequest)
STAT_FILE = Operation("stat_file", StatArgs)
DELETE_FILE = Operation("delete_file", DeleteFileArgs)
MOVE_FILE = Operation("move_file", MoveRequest)
MAKE_DIR = Operation("make_dir", MkdirRequest)
GET_ARCHIVE = Operation("get_archive", ArchiveArgs)
PUT_ARCHIVE = Operation("put_archive", ArchiveArgs, streams_body=True)
PROCESSES = Operation("processes", NoArgs)
SIGNAL_PROCESS = Operation("signal_process", SignalArgs)
PTY = Operation("pty", PtyRequest, socket=True)
SNAPSHOT = Operation("snapshot", SnapshotArgs)
SNAPSHOTS = Operation("snapshots", NoArgs)
PATCH_SNAPSHOT = Operation("patch_snapshot", PatchSnapshotArgs)
RESTORE = Operation("restore", RestoreArgs)
SHARE_SNAPSHOT = Operation("share_snapshot", ShareArgs)  # the edge's, for a fork: no route of its own
EXPORT = Operation("export", NoArgs)
IMPORT = Operation("import", ImportArgs, streams_body=True)
BACKUP = Operation("backup", NoArgs)
BACKUPS = Operation("backups", NoArgs)
STOP = Operation("stop", NoArgs)
PUT_SERVICE = Operation("put_service", PutServiceArgs)
LIST_SERVICES = Operation("list_services", NoArgs)
DELETE_SERVICE = Operation("delete_service", ServiceArgs)
SERVICE_LOGS = Operation("service_logs", ServiceLogsArgs)
PROXY = Operation("proxy", ProxyArgs, streams_body=True)
PUT_SECRET = Operation("put_secret", PutSecretArgs)
LIST_SECRETS = Operation("list_secrets", NoArgs)
DELETE_SECRET = Operation("delete_secret", SecretArgs)

# Called by the edge itself, never by a route of their own (a fork asks its source for a snapshot)
EDGE_ONLY: frozenset[Operation] = frozenset({SHARE_SNAPSHOT})

OPERATIONS: dict[str, Operation] = {
    op.name: op
    for op in (
        GET,
        PUT_CONFIG,
        DELETE,
        EXEC,
        REATTACH,
        CANCEL,
        READ_FILE,
        WRITE_FILE,
        LIST_FILES,
        STAT_FILE,
        DELETE_FILE,
        MOVE_FILE,
        MAKE_DIR,
        GET_ARCHIVE,
        PUT_ARCHIVE,
        PROCESSES,
        SIGNAL_PROCESS,
        PTY,
        SNAPSHOT,
        SNAPSHOTS,
        PATCH_SNAPSHOT,
        RESTORE,
        SHARE_SNAPSHOT,
        EXPORT,
        IMPORT,
        BACKUP,
        BACKUPS,
        STOP,
        PUT_SERVICE,
        LIST_SERVICES,
        DELETE_SERVICE,
        SERVICE_LOGS,
        PROXY,
        PUT_SECRET,
        LIST_SECRETS,
        DELETE_SECRET,
    )
}


def to_json(args: Any) -> dict[str, Any]:
    return asdict(args)


def _dataclass_of(annotation: Any) -> type | None:
    """The dataclass a field holds: `X` or `X | None`."""
    if is_dataclass(annotation):
        return annotation
    members = [a for a in get_args(annotation) if is_dataclass(a)]
    return members[0] if len(members) == 1 else None


def _build(cls: type, obj: dict[str, Any]) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = set(obj) - known
    if unknown:
        raise ValueError(f"{cls.__name__} has no field {sorted(unknown)[0]!r}")
    values = {}
    for f in fields(cls):
        if f.name not in obj:
            if f.default is MISSING and f.default_factory is MISSING:
                raise ValueError(f"{cls.__name__} needs {f.name!r}")
            continue
        value = obj[f.name]
        nested = _dataclass_of(f.type)
        if nested is not None and isinstance(value, dict):
            value = _build(nested, value)
        elif get_origin(f.type) is tuple and isinstance(value, list):  # JSON has arrays only
            value = tuple(value)
        values[f.name] = value
    return cls(**values)


def from_json(op: str, obj: dict[str, Any]) -> Any:
    """The typed arguments of `op` from their JSON; not_found for an operation that does not exist."""
    operation = OPERATIONS.get(op)
    if operation is None:
        raise ProtocolError("not_found")
    return _build(operation.args, obj)
