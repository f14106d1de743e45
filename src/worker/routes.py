"""The public route table (docs/protocol.md) and matching of raw request paths against it.

Matching works on the raw, percent-encoded path: a name containing `%` is reported as invalid_name rather than
decoded into something else. Unknown shapes are 404 not_found; a known shape with another method is 405.
"""

from dataclasses import dataclass

from protocol.errors import ProtocolError
from protocol.validate import validate_name, validate_request_id

# Workspace sub-routes: segments after /v1/workspaces/{ns}/{ws}, with `{id}` for a request id → {method: op}.
_WORKSPACE_ROUTES: dict[tuple[str, ...], dict[str, str]] = {
    (): {"GET": "get", "PUT": "put_config", "DELETE": "delete"},
    ("exec",): {"POST": "exec"},
    ("exec", "{id}"): {"GET": "reattach"},
    ("exec", "{id}", "cancel"): {"POST": "cancel"},
    ("files",): {"GET": "read_file", "PUT": "write_file"},
    ("snapshot",): {"POST": "snapshot"},
    ("snapshots",): {"GET": "snapshots"},
    ("stop",): {"POST": "stop"},
}


@dataclass(frozen=True)
class Route:
    op: str  # "health" or a workspace op
    namespace: str | None = None
    workspace: str | None = None
    request_id: str | None = None


class MethodNotAllowed(ProtocolError):
    """405 carrying the route's methods, for the Allow header."""

    def __init__(self, methods: dict[str, str]):
        self.allow = ", ".join(sorted(methods))
        super().__init__("method_not_allowed", f"allowed methods: {self.allow}")


def _shape_matches(template: tuple[str, ...], rest: list[str]) -> bool:
    return len(template) == len(rest) and all(t == "{id}" or t == r for t, r in zip(template, rest, strict=True))


def match(method: str, path: str) -> Route:
    """Resolve (method, raw path) to a Route, raising not_found, method_not_allowed, invalid_name or
    invalid_request_id — in that order, so a bad name on an unknown route is still a 404."""
    if not path.startswith("/"):
        raise ProtocolError("not_found")
    parts = path[1:].split("/")
    if "" in parts or parts[0] != "v1":
        raise ProtocolError("not_found")
    parts = parts[1:]
    if parts == ["health"]:
        if method != "GET":
            raise MethodNotAllowed({"GET": "health"})
        return Route("health")
    if len(parts) < 3 or parts[0] != "workspaces":
        raise ProtocolError("not_found")
    ns, ws, rest = parts[1], parts[2], parts[3:]
    template = next((t for t in _WORKSPACE_ROUTES if _shape_matches(t, rest)), None)
    if template is None:
        raise ProtocolError("not_found")
    methods = _WORKSPACE_ROUTES[template]
    if method not in methods:
        raise MethodNotAllowed(methods)
    validate_name(ns, "namespace")
    validate_name(ws, "workspace")
    request_id = validate_request_id(rest[1]) if "{id}" in template else None
    return Route(methods[method], ns, ws, request_id)
