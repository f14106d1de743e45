"""The request as the edge sees it: a runtime-neutral dataclass each adapter builds from its own request type."""

from dataclasses import dataclass, field
from typing import Any

from durable.ports import RequestBody


@dataclass(frozen=True)
class PathParams:
    """What a route's path carries besides namespace and workspace, validated by the route match."""

    request_id: str | None = None  # …/exec/{id}
    name: str | None = None  # …/services/{service}, …/secrets/{secret}, …/snapshots/{snapshot}
    port: int | None = None  # …/ports/{port}/…
    pid: int | None = None  # …/processes/{pid}/signal
    tail: str | None = None  # the proxied path as sent (raw), "/" at least
    prefix: str | None = None  # the path the proxied one sits under (X-Forwarded-Prefix)


@dataclass
class EdgeRequest:
    method: str
    path: str  # raw, still percent-encoded: `%` in a name must reach validation, not be decoded away
    query: str = ""  # raw query string, without the `?`
    headers: dict[str, str] = field(default_factory=dict)  # lower-case names
    body: RequestBody | None = None
    socket: Any = None  # a WebSocket upgrade: the client's ports.Socket, not yet accepted
    client_ip: str = ""  # the caller's address as the runtime saw it (X-Forwarded-For of a proxied request)
    scheme: str = "http"  # "https" behind TLS (X-Forwarded-Proto)
