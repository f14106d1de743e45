"""The ports through which the workspace logic (and the edge) talk to their runtime.

Two runtimes implement them: `src/entry.py` (Cloudflare: ctx.storage.sql, setAlarm, ctx.container, JS streams)
and `src/standalone/` (SQLite files, asyncio timers, bubblewrap sandboxes, async iterators). Nothing here imports
a runtime; stream and body objects are opaque and only passed between ports.
"""

import json
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, Protocol

from durable.timefmt import iso_ms
from protocol.errors import ProtocolError
from protocol.limits import CONTROL_BODY_BYTES

JSON_TYPE = "application/json"
NDJSON_TYPE = "application/x-ndjson"


@dataclass
class Response:
    """What the edge and the workspace return. `body` is bytes or an opaque runtime stream that the adapter
    passes through untouched (a StreamSink.readable or a ContainerResponse.body)."""

    status: int
    body: Any = b""
    headers: dict[str, str] = field(default_factory=dict)
    # A proxied answer's headers as the upstream sent them, repeats kept (several Set-Cookie): sent after `headers`
    header_pairs: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def json(cls, status: int, obj: Any, headers: dict[str, str] | None = None) -> "Response":
        data = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        return cls(status, data, {"content-type": JSON_TYPE, **(headers or {})})

    @classmethod
    def error(cls, err: ProtocolError) -> "Response":
        return cls.json(err.status, err.body())


class RequestBody(Protocol):
    """A request body as the edge sees it."""

    async def read(self, limit: int) -> bytes:
        """The whole body; raises ProtocolError('payload_too_large') as soon as it passes `limit` bytes."""

    @property
    def stream(self) -> Any:
        """The body as an opaque runtime stream, for passing a file upload through unbuffered."""

    def stream_at_most(self, limit: int) -> Any:
        """`stream` that fails with ProtocolError('payload_too_large') once more than `limit` bytes passed (a
        proxied body of unknown length); where the platform itself caps request bodies at `limit`, `stream`."""


class Storage(Protocol):
    """SQL storage private to one workspace (ctx.storage.sql / one SQLite file). Synchronous, like ctx.storage.sql."""

    def sql(self, query: str, *params: Any) -> list[dict[str, Any]]: ...


class Alarm(Protocol):
    """One alarm per workspace (Cloudflare semantics): setting it replaces the previous one. When it fires the
    runtime calls `Workspace.alarm()`."""

    async def set(self, at_ms: int) -> None: ...

    async def clear(self) -> None: ...


class Clock(Protocol):
    def now_ms(self) -> int: ...

    async def sleep(self, seconds: float) -> None: ...

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run a task that may outlive the current request (Cloudflare: ctx.waitUntil)."""


class StreamSink(Protocol):
    """The writable end of a response stream; `readable` is returned to the client as the Response body."""

    readable: Any

    async def write(self, data: bytes) -> None: ...

    async def pipe_from(self, body: Any) -> None:
        """Copy an opaque stream (a ContainerResponse.body) into this sink without per-chunk Python where the
        runtime allows. Returns when `body` ends; raises ContainerGone if it ends abnormally."""

    async def close(self) -> None: ...

    async def abort(self) -> None:
        """End the stream abnormally: the client sees a broken body, not a complete one (a proxied answer whose
        upstream failed midway must not look whole)."""


class Streams(Protocol):
    def open(self) -> StreamSink: ...


@dataclass(frozen=True)
class StartSpec:
    image: str
    instance: str
    env: dict[str, str]
    enable_internet: bool
    snapshot_id: str | None = None  # restore from this snapshot instead of starting the image fresh


@dataclass(frozen=True)
class SnapshotInfo:
    """One snapshot, the same from the container port through the state and retention to the wire."""

    id: str
    size: int  # bytes
    created_at_ms: int
    # When the platform deletes it on its own (Cloudflare: 30 days after it was made or last restored); None where
    # snapshots live until deleted (standalone). Set by the container port; a restore extends it (Workspace).
    expires_at_ms: int | None = None
    # The user's own: a label (POST …/snapshot {"label"}) and a pin that retention honours ({"keep": true}). Set by
    # the workspace, never by a container port.
    label: str | None = None
    kept: bool = False

    def expired(self, now_ms: int) -> bool:
        """Past its expiry: the platform no longer restores it, so it is neither listed, kept nor offered."""
        return self.expires_at_ms is not None and now_ms >= self.expires_at_ms

    def to_wire(self) -> dict[str, Any]:
        """The snapshot object of docs/protocol.md."""
        return {
            "id": self.id,
            "created_at": iso_ms(self.created_at_ms),
            "size": self.size,
            "expires_at": iso_ms(self.expires_at_ms),
            "label": self.label,
            "kept": self.kept,
        }


@dataclass(frozen=True)
class BackupInfo:
    """One backup: a portable export (docs/protocol.md, "Export archives") kept in the deployment's backup store,
    listed only once it was read back and matched its sha256."""

    id: str  # b-<13-digit ms>-<6 hex>, time-sortable like snapshot ids
    size: int  # bytes of the archive
    created_at_ms: int
    sha256: str  # of the whole archive

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "created_at": iso_ms(self.created_at_ms), "size": self.size, "sha256": self.sha256}


class BackupStore(Protocol):
    """Where backups live beyond the container platform's snapshot lifetime: an R2 bucket binding written by the
    object (Cloudflare; no credentials ever reach a container), a directory such as another disk (standalone,
    BACKUP_DIR). Keyed by namespace/workspace/id; the store is the truth about which backups exist."""

    available: bool  # False: none configured; backup routes answer backups_unavailable

    async def write(self, namespace: str, workspace: str, backup_id: str, body: Any, created_at_ms: int) -> BackupInfo:
        """Store `body` (an opaque stream: a ContainerResponse.body of the supervisor's export) as backup
        `backup_id`, read it back, and list it only when it matched the sha256 of what was written. Raises
        ProtocolError('backup_failed') — the store is full, gone, or gave back other bytes — leaving nothing listed
        (and nothing half-written under the final name)."""

    async def list(self, namespace: str, workspace: str) -> list[BackupInfo]:
        """The good backups of one workspace, newest first."""

    async def open(self, namespace: str, workspace: str, backup_id: str) -> tuple[BackupInfo, Any]:
        """A backup and its archive as an opaque stream a Container.fetch can send as its body. Raises
        ProtocolError('backup_not_found')."""

    async def delete(self, namespace: str, workspace: str, backup_id: str) -> None:
        """Remove a backup (missing is fine)."""


class ContainerGone(Exception):
    """The container is not running, or stopped while a request to it was in flight."""


class ContainerResponse(Protocol):
    """The supervisor's answer. Everything in a sandbox is hostile: a control answer is read whole only up to a
    cap, and streamed bodies (exec output, downloads) are passed through as `body`, never buffered."""

    status: int
    headers: dict[str, str]  # lower-case names
    header_pairs: list[tuple[str, str]]  # every header as sent (lower-case names), repeats kept (Set-Cookie)
    body: Any  # opaque runtime stream

    async def read(self, limit: int = CONTROL_BODY_BYTES) -> bytes:
        """The whole body; raises ContainerGone (a misbehaving supervisor counts as an unreachable one) as soon as
        it passes `limit` bytes, without buffering past it. The standalone runtime also bounds the whole read in
        time (the request's timeout)."""

    async def json(self) -> Any:
        """`read()` (capped) as JSON."""


class Socket(Protocol):
    """One WebSocket: a client's (a terminal, GET …/pty) or the supervisor's. A frame is bytes (binary) or str
    (text)."""

    async def accept(self) -> None:
        """A client's socket: answer its upgrade (101). Before this, the request can still be refused over HTTP."""

    async def receive(self) -> bytes | str | None:
        """The next frame; None once the other side closed (or went away)."""

    async def send(self, frame: bytes | str) -> None:
        """Raises ConnectionError once the other side is gone."""

    async def close(self, code: int = 1000, reason: str = "") -> None: ...


class Container(Protocol):
    """The workspace's container (ctx.container / a bubblewrap sandbox running the supervisor)."""

    def running(self) -> bool: ...

    def has_disk(self) -> bool:
        """True when a stopped container's filesystem still exists (a crashed standalone sandbox keeps its files
        on the host). Always False on Cloudflare, where a container's disk dies with it. Starting without a
        snapshot then resumes those files (`container: restarted`)."""

    async def start(self, spec: StartSpec) -> None:
        """Start (or restore) the container. Returns once the runtime accepted the start; readiness is checked
        by polling the supervisor's /health. Raises ProtocolError('snapshot_damaged') for a snapshot that fails
        its integrity check, ProtocolError('container_unavailable') when it cannot start."""

    async def fetch(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> ContainerResponse:
        """An HTTP request to the supervisor (path includes any query string). `body` is bytes or an opaque
        stream. Raises ContainerGone when the container cannot be reached."""

    async def fetch_port(
        self,
        port: int,
        method: str,
        path: str,
        *,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> ContainerResponse:
        """An HTTP request to `port` inside the container (path includes any query string; `headers` are already
        the proxy's, credentials stripped). The answer streams without a silence limit (an SSE stream may be quiet
        for long); its head must come within PROXY_HEAD_SECONDS. Raises ProtocolError('upstream_unavailable') when
        nothing accepts the connection, ProtocolError('upstream_timeout') without a head in time, ContainerGone
        when the container is not running."""

    async def connect(self, path: str) -> Socket:
        """A WebSocket to the supervisor (path includes any query string). Raises the supervisor's refusal of the
        upgrade as a ProtocolError, ContainerGone when the container cannot be reached."""

    async def snapshot(self) -> SnapshotInfo:
        """Save the container's filesystem, its `expires_at_ms` set where the platform expires snapshots. Raises
        ProtocolError('snapshot_failed') and leaves it running."""

    def snapshot_expiry(self, alive_from_ms: int) -> int | None:
        """When a snapshot made or last restored at `alive_from_ms` expires: Cloudflare keeps one 30 days from
        then; None where snapshots never expire (standalone). The workspace asks after each restore."""

    async def snapshot_ref(self, snapshot_id: str) -> dict[str, Any]:
        """A JSON-shaped reference to one of this workspace's snapshots that another workspace of the same
        deployment can adopt (a fork): standalone where its archives are, Cloudflare the platform's handle. Raises
        ProtocolError('snapshot_not_found') when it is gone."""

    async def adopt_snapshot(self, ref: dict[str, Any]) -> SnapshotInfo:
        """Make a snapshot another workspace shared (snapshot_ref) this workspace's own, so a boot can restore it:
        standalone links its archives (every link of an incremental chain) into this workspace's store; Cloudflare
        records the handle. The source keeps its snapshot. Raises ProtocolError('snapshot_not_found')."""

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Drop a snapshot the retention policy no longer keeps, or one that expired (Cloudflare has no delete: it
        forgets the handle)."""

    async def destroy(self) -> None:
        """Stop the container and discard its filesystem (snapshots are kept)."""


class Cipher(Protocol):
    """Secrets at rest (AES-256-GCM under the deployment's key): standalone a key file in the data dir, Cloudflare
    the SECRETS_KEY secret through WebCrypto. `aad` binds a sealed value to where it is stored."""

    available: bool  # False: no key configured; storing a secret answers secrets_unavailable

    async def seal(self, plaintext: bytes, aad: bytes) -> bytes:
        """A fresh 12-byte nonce followed by the ciphertext and its tag."""

    async def open(self, sealed: bytes, aad: bytes) -> bytes:
        """The plaintext; raises ValueError when the value was not sealed under this key and `aad`."""


class WorkspaceStub(Protocol):
    """The edge's handle on one workspace object (in-process, or a Durable Object stub)."""

    async def call(self, op: str, args: Any, body: Any = None) -> Response:
        """Run operation `op` (durable/operations.py) with its typed args; `body` is a stream for file uploads."""


class Workspaces(Protocol):
    """Every workspace object of the deployment, by name (the registry / the WORKSPACE Durable Object namespace)."""

    def get(self, namespace: str, workspace: str) -> WorkspaceStub: ...


class DirectoryStub(Protocol):
    """The edge's handle on the deployment's directory object (directory/directory.py): keys, the workspace index
    and the audit log."""

    async def call(self, op: str, args: dict[str, Any]) -> Any:
        """Run directory operation `op` with JSON-shaped args; its JSON-shaped answer. Raises ProtocolError for a
        refusal (unauthorized, key_not_found, quota_exceeded); anything else means the directory could not answer."""
