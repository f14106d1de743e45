"""The public route table (docs/protocol.md) and matching of raw request paths against it.

Matching works on the raw, percent-encoded path: a name containing `%` is reported as invalid_name rather than
decoded into something else. Unknown shapes are 404 not_found; a known shape with another method is 405.
"""

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from durable import operations as ops
from durable.settings import Settings
from protocol.errors import ProtocolError
from protocol.validate import validate_name, validate_request_id
from worker import prepare
from worker.authorize import ADMIN_ONLY, ANY_SCOPE
from worker.request import EdgeRequest

# (request, the path's request id or None, settings) -> the operation's typed arguments
Prepare = Callable[[EdgeRequest, str | None, Settings], Awaitable[Any]]


@dataclass(frozen=True)
class Endpoint:
    """One method of one workspace route: the operation it calls, how its arguments are prepared, the scope a key
    needs for it (worker/authorize.py), and whether it is written to the audit log (it changes or runs something)."""

    operation: ops.Operation
    prepare: Prepare
    need: str
    audited: bool = False


# Workspace sub-routes: segments after /v1/workspaces/{ns}/{ws}, with `{id}` for a request id → {method: endpoint}.
WORKSPACE_ROUTES: dict[tuple[str, ...], dict[str, Endpoint]] = {
    (): {
        "GET": Endpoint(ops.GET, prepare.no_args, ANY_SCOPE),
        "PUT": Endpoint(ops.PUT_CONFIG, prepare.put_config, "manage", audited=True),
        "DELETE": Endpoint(ops.DELETE, prepare.delete, "manage", audited=True),
    },
    ("exec",): {"POST": Endpoint(ops.EXEC, prepare.exec_, "exec", audited=True)},
    ("exec", "{id}"): {"GET": Endpoint(ops.REATTACH, prepare.reattach, "exec")},
    ("exec", "{id}", "cancel"): {"POST": Endpoint(ops.CANCEL, prepare.cancel, "exec", audited=True)},
    ("files",): {
        "GET": Endpoint(ops.READ_FILE, prepare.read_file, "files"),
        "PUT": Endpoint(ops.WRITE_FILE, prepare.write_file, "files", audited=True),
    },
    ("snapshot",): {"POST": Endpoint(ops.SNAPSHOT, prepare.no_args, "snapshots", audited=True)},
    ("snapshots",): {"GET": Endpoint(ops.SNAPSHOTS, prepare.no_args, "snapshots")},
    ("stop",): {"POST": Endpoint(ops.STOP, prepare.no_args, "snapshots", audited=True)},
}


@dataclass(frozen=True)
class DeploymentEndpoint:
    """A route about the deployment rather than one workspace, answered by the edge with the directory object.
    `name` is the edge's handler; `need` as for Endpoint (listing routes filter by the caller's reach instead)."""

    name: str
    need: str | None
    audited: bool = False


# Deployment routes: segments after /v1, with `{key}` for a key id → {method: endpoint}.
DEPLOYMENT_ROUTES: dict[tuple[str, ...], dict[str, DeploymentEndpoint]] = {
    ("health",): {"GET": DeploymentEndpoint("health", ANY_SCOPE)},
    ("keys",): {
        "POST": DeploymentEndpoint("mint_key", ADMIN_ONLY, audited=True),
        "GET": DeploymentEndpoint("list_keys", ADMIN_ONLY),
    },
    ("keys", "{key}"): {"DELETE": DeploymentEndpoint("revoke_key", ADMIN_ONLY, audited=True)},
    ("workspaces",): {"GET": DeploymentEndpoint("list_workspaces", ANY_SCOPE)},
    ("audit",): {"GET": DeploymentEndpoint("list_audit", "manage")},
}


@dataclass(frozen=True)
class Route:
    endpoint: Endpoint | DeploymentEndpoint
    namespace: str | None = None
    workspace: str | None = None
    request_id: str | None = None
    key_id: str | None = None  # as sent: validated by its handler, after the admin-only check


class MethodNotAllowed(ProtocolError):
    """405 carrying the route's methods, for the Allow header."""

    def __init__(self, methods: Iterable[str]):
        self.allow = ", ".join(sorted(methods))
        super().__init__("method_not_allowed", f"allowed methods: {self.allow}")


def _shape_matches(template: tuple[str, ...], rest: list[str]) -> bool:
    # the lengths are compared first, so zip's strictness could never matter
    same_length = len(template) == len(rest)
    return same_length and all(t in ("{id}", "{key}") or t == r for t, r in zip(template, rest))  # noqa: B905


def match(method: str, path: str) -> Route:
    """Resolve (method, raw path) to a Route, raising not_found, method_not_allowed, invalid_name or
    invalid_request_id — in that order, so a bad name on an unknown route is still a 404."""
    if not path.startswith("/"):
        raise ProtocolError("not_found")
    parts = path[1:].split("/")
    if "" in parts or parts[0] != "v1":
        raise ProtocolError("not_found")
    parts = parts[1:]
    if len(parts) < 3:
        template = next((t for t in DEPLOYMENT_ROUTES if _shape_matches(t, parts)), None)
        if template is None:
            raise ProtocolError("not_found")
        methods = DEPLOYMENT_ROUTES[template]
        if method not in methods:
            raise MethodNotAllowed(methods)
        return Route(methods[method], key_id=parts[1] if "{key}" in template else None)
    if parts[0] != "workspaces":
        raise ProtocolError("not_found")
    ns, ws, rest = parts[1], parts[2], parts[3:]
    template = next((t for t in WORKSPACE_ROUTES if _shape_matches(t, rest)), None)
    if template is None:
        raise ProtocolError("not_found")
    methods = WORKSPACE_ROUTES[template]
    if method not in methods:
        raise MethodNotAllowed(methods)
    validate_name(ns, "namespace")
    validate_name(ws, "workspace")
    request_id = validate_request_id(rest[1]) if "{id}" in template else None
    return Route(methods[method], ns, ws, request_id)
