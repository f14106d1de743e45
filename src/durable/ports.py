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

    def to_wire(self) -> dict[str, Any]:
        """The snapshot object of docs/protocol.md."""
        return {"id": self.id, "created_at": iso_ms(self.created_at_ms), "size": self.size}


class ContainerGone(Exception):
    """The container is not running, or stopped while a request to it was in flight."""


class ContainerResponse(Protocol):
    """The supervisor's answer. Everything in a sandbox is hostile: a control answer is read whole only up to a
    cap, and streamed bodies (exec output, downloads) are passed through as `body`, never buffered."""

    status: int
    headers: dict[str, str]
    body: Any  # opaque runtime stream

    async def read(self, limit: int = CONTROL_BODY_BYTES) -> bytes:
        """The whole body; raises ContainerGone (a misbehaving supervisor counts as an unreachable one) as soon as
        it passes `limit` bytes, without buffering past it. The standalone runtime also bounds the whole read in
        time (the request's timeout)."""

    async def json(self) -> Any:
        """`read()` (capped) as JSON."""


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

    async def snapshot(self) -> SnapshotInfo:
        """Save the container's filesystem. Raises ProtocolError('snapshot_failed') and leaves it running."""

    async def delete_snapshot(self, snapshot_id: str) -> None:
        """Drop a snapshot the retention policy no longer keeps (a no-op where the platform expires them)."""

    async def destroy(self) -> None:
        """Stop the container and discard its filesystem (snapshots are kept)."""


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
