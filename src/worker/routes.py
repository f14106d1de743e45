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
from protocol.files import validate_pid
from protocol.services import parse_port_segment, validate_secret_name, validate_service_name
from protocol.snapshots import validate_snapshot_id
from protocol.validate import validate_name, validate_request_id
from worker import prepare
from worker.authorize import ADMIN_ONLY, ANY_SCOPE
from worker.query import names_parameter
from worker.request import EdgeRequest, PathParams

# (request, the path's parameters, settings) -> the operation's typed arguments
Prepare = Callable[[EdgeRequest, PathParams, Settings], Awaitable[Any]]


@dataclass(frozen=True)
class Endpoint:
    """One method of one workspace route: the operation it calls, how its arguments are prepared, the scope a key
    needs for it (worker/authorize.py), and whether it is written to the audit log (it changes or runs something)."""

    operation: ops.Operation
    prepare: Prepare
    need: str
    audited: bool = False
    # (a query parameter, the endpoint that answers instead when the query names it): GET …/files?list=1
    switch: tuple[str, "Endpoint"] | None = None


# Methods the port proxy forwards (CONNECT and TRACE are not HTTP a service answers through a proxy).
PROXY_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
_PROXY = Endpoint(ops.PROXY, prepare.proxy, "proxy")

# Workspace sub-routes: segments after /v1/workspaces/{ns}/{ws} → {method: endpoint}. Placeholders: `{id}` a request
# id, `{service}` a service name, `{secret}` a secret name, `{snapshot}` a snapshot id, `{pid}` a process id; the
# port proxy (…/ports/{port}/{path…}) is matched apart.
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
        "GET": Endpoint(
            ops.READ_FILE,
            prepare.read_file,
            "files",
            switch=("list", Endpoint(ops.LIST_FILES, prepare.list_files, "files")),
        ),
        "PUT": Endpoint(ops.WRITE_FILE, prepare.write_file, "files", audited=True),
        "DELETE": Endpoint(ops.DELETE_FILE, prepare.delete_file, "files", audited=True),
    },
    ("files", "stat"): {"GET": Endpoint(ops.STAT_FILE, prepare.stat_file, "files")},
    ("files", "move"): {"POST": Endpoint(ops.MOVE_FILE, prepare.move_file, "files", audited=True)},
    ("files", "mkdir"): {"POST": Endpoint(ops.MAKE_DIR, prepare.make_dir, "files", audited=True)},
    ("files", "archive"): {
        "GET": Endpoint(ops.GET_ARCHIVE, prepare.get_archive, "files"),
        "PUT": Endpoint(ops.PUT_ARCHIVE, prepare.put_archive, "files", audited=True),
    },
    # a terminal runs what it is typed, and seeing and signalling what runs is the exec scope's too
    ("pty",): {"GET": Endpoint(ops.PTY, prepare.pty, "exec", audited=True)},
    ("processes",): {"GET": Endpoint(ops.PROCESSES, prepare.no_args, "exec")},
    ("processes", "{pid}", "signal"): {
        "POST": Endpoint(ops.SIGNAL_PROCESS, prepare.signal_process, "exec", audited=True)
    },
    ("snapshot",): {"POST": Endpoint(ops.SNAPSHOT, prepare.snapshot, "snapshots", audited=True)},
    ("snapshots",): {"GET": Endpoint(ops.SNAPSHOTS, prepare.no_args, "snapshots")},
    ("snapshots", "{snapshot}"): {
        "PATCH": Endpoint(ops.PATCH_SNAPSHOT, prepare.patch_snapshot, "snapshots", audited=True)
    },
    ("restore",): {"POST": Endpoint(ops.RESTORE, prepare.restore, "snapshots", audited=True)},
    # an export reads every file and an import replaces them all: the files scope, like one file's GET and PUT
    ("export",): {"GET": Endpoint(ops.EXPORT, prepare.no_args, "files")},
    ("import",): {"PUT": Endpoint(ops.IMPORT, prepare.import_, "files", audited=True)},
    ("backup",): {"POST": Endpoint(ops.BACKUP, prepare.no_args, "snapshots", audited=True)},
    ("backups",): {"GET": Endpoint(ops.BACKUPS, prepare.no_args, "snapshots")},
    ("stop",): {"POST": Endpoint(ops.STOP, prepare.no_args, "snapshots", audited=True)},
    ("services",): {"GET": Endpoint(ops.LIST_SERVICES, prepare.no_args, "manage")},
    ("services", "{service}"): {
        "PUT": Endpoint(ops.PUT_SERVICE, prepare.put_service, "manage", audited=True),
        "DELETE": Endpoint(ops.DELETE_SERVICE, prepare.service, "manage", audited=True),
    },
    ("services", "{service}", "logs"): {"GET": Endpoint(ops.SERVICE_LOGS, prepare.service_logs, "manage")},
    ("secrets",): {"GET": Endpoint(ops.LIST_SECRETS, prepare.no_args, "manage")},
    ("secrets", "{secret}"): {
        "PUT": Endpoint(ops.PUT_SECRET, prepare.put_secret, "manage", audited=True),
        "DELETE": Endpoint(ops.DELETE_SECRET, prepare.secret, "manage", audited=True),
    },
    ("ports", "{port}", "{path}"): {method: _PROXY for method in PROXY_METHODS},
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
    # the key-resolved proxy: the workspace and service come from the key (authorize.proxy_target), never the path
    ("proxy", "{path}"): {method: DeploymentEndpoint("proxy", "proxy") for method in PROXY_METHODS},
}


@dataclass(frozen=True)
class Route:
    endpoint: Endpoint | DeploymentEndpoint
    namespace: str | None = None
    workspace: str | None = None
    params: PathParams = PathParams()
    key_id: str | None = None  # as sent: validated by its handler, after the admin-only check


class MethodNotAllowed(ProtocolError):
    """405 carrying the route's methods, for the Allow header."""

    def __init__(self, methods: Iterable[str]):
        self.allow = ", ".join(sorted(methods))
        super().__init__("method_not_allowed", f"allowed methods: {self.allow}")


_PLACEHOLDERS = ("{id}", "{key}", "{service}", "{secret}", "{snapshot}", "{pid}")


def _shape_matches(template: tuple[str, ...], rest: list[str]) -> bool:
    # the lengths are compared first, so zip's strictness could never matter
    same_length = len(template) == len(rest)
    return same_length and all(t in _PLACEHOLDERS or t == r for t, r in zip(template, rest))  # noqa: B905


def _methods(table: dict[tuple[str, ...], dict[str, Any]], template: tuple[str, ...], method: str) -> Any:
    methods = table[template]
    if method not in methods:
        raise MethodNotAllowed(methods)
    return methods[method]


def _proxied(method: str, parts: list[str]) -> Route | None:
    """The two proxy shapes, whose tail is any path (empty segments included: protocol/proxy.py normalizes it)."""
    if parts[0] == "proxy":
        endpoint = _methods(DEPLOYMENT_ROUTES, ("proxy", "{path}"), method)
        return Route(endpoint, params=PathParams(tail="/" + "/".join(parts[1:]), prefix="/v1/proxy"))
    if len(parts) >= 5 and parts[0] == "workspaces" and parts[3] == "ports":
        endpoint = _methods(WORKSPACE_ROUTES, ("ports", "{port}", "{path}"), method)
        ns, ws = validate_name(parts[1], "namespace"), validate_name(parts[2], "workspace")
        port = parse_port_segment(parts[4])
        prefix = f"/v1/workspaces/{ns}/{ws}/ports/{port}"
        return Route(endpoint, ns, ws, PathParams(port=port, tail="/" + "/".join(parts[5:]), prefix=prefix))
    return None


def is_proxied(path: str) -> bool:
    """Whether a raw path has the shape of a proxied request (whatever its credential or validity)."""
    parts = path.split("/")
    if parts[1:3] == ["v1", "proxy"]:
        return True
    return len(parts) >= 6 and parts[1:3] == ["v1", "workspaces"] and parts[5] == "ports"


def match(method: str, path: str, query: str = "") -> Route:
    """Resolve (method, raw path, raw query) to a Route, raising not_found, method_not_allowed, then the path's
    own validation (invalid_name, invalid_request_id, invalid_port, invalid_pid) — in that order, so a bad name on
    an unknown route is still a 404."""
    if not path.startswith("/"):
        raise ProtocolError("not_found")
    parts = path[1:].split("/")
    if parts[0] != "v1" or len(parts) < 2:
        raise ProtocolError("not_found")
    parts = parts[1:]
    proxied = _proxied(method, parts)
    if proxied is not None:
        return proxied
    if "" in parts:
        raise ProtocolError("not_found")
    if len(parts) < 3:
        template = next((t for t in DEPLOYMENT_ROUTES if _shape_matches(t, parts)), None)
        if template is None:
            raise ProtocolError("not_found")
        endpoint = _methods(DEPLOYMENT_ROUTES, template, method)
        return Route(endpoint, key_id=parts[1] if "{key}" in template else None)
    if parts[0] != "workspaces":
        raise ProtocolError("not_found")
    ns, ws, rest = parts[1], parts[2], parts[3:]
    template = next((t for t in WORKSPACE_ROUTES if _shape_matches(t, rest)), None)
    if template is None:
        raise ProtocolError("not_found")
    endpoint = _methods(WORKSPACE_ROUTES, template, method)
    if endpoint.switch is not None and names_parameter(query, endpoint.switch[0]):
        endpoint = endpoint.switch[1]
    validate_name(ns, "namespace")
    validate_name(ws, "workspace")
    values = dict(zip(template, rest))  # noqa: B905 - same length (matched)
    name = None
    if "{service}" in values:
        name = validate_service_name(values["{service}"])
    elif "{secret}" in values:
        name = validate_secret_name(values["{secret}"])
    elif "{snapshot}" in values:
        name = validate_snapshot_id(values["{snapshot}"])
    request_id = validate_request_id(values["{id}"]) if "{id}" in values else None
    pid = validate_pid(values["{pid}"]) if "{pid}" in values else None
    return Route(endpoint, ns, ws, PathParams(request_id=request_id, name=name, pid=pid))
