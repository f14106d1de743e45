"""Services (long-running processes a workspace keeps up) and secrets: their names and the bodies that define them.

Two shapes of a service: `ServiceSpec` is what a client PUTs and the workspace stores (it names secrets), and
`SupervisedService` is what the workspace hands the supervisor at boot (the secrets' values already in `env`, so the
supervisor never sees a name it would have to resolve). Both are validated here; the supervisor validates its shape
again, since it trusts nothing it is sent either.
"""

import re
from dataclasses import dataclass, field

from protocol import limits
from protocol.errors import ProtocolError
from protocol.proxy import validate_allow_paths
from protocol.validate import (
    _check_env_room,
    _reject_unknown,
    _secret_names,
    parse_env,
    validate_abs_path,
    validate_command,
)

_SERVICE_NAME = re.compile(limits.SERVICE_NAME_PATTERN)
RESTART_POLICIES = ("always", "on-failure", "never")
DEFAULT_RESTART = "on-failure"


def validate_service_name(value: object) -> str:
    if not isinstance(value, str) or not _SERVICE_NAME.fullmatch(value):
        raise ProtocolError("invalid_name", f"service names must match {limits.SERVICE_NAME_PATTERN}")
    return value


def validate_secret_name(value: object) -> str:
    return _secret_names([value])[0]


def validate_port(value: object) -> int:
    """A service's port: 1–65535 and not the supervisor's own."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise ProtocolError("invalid_port")
    if value == limits.SUPERVISOR_PORT:
        raise ProtocolError("invalid_port", f"port {limits.SUPERVISOR_PORT} is the supervisor's own")
    return value


def parse_port_segment(text: str) -> int:
    """A port as a path segment (…/ports/{port}/…): decimal digits only, then as validate_port."""
    if not (text.isascii() and text.isdigit() and len(text) <= 5):
        raise ProtocolError("invalid_port")
    return validate_port(int(text))


def parse_secret_value(obj: dict) -> str:
    _reject_unknown(obj, frozenset(("value",)))
    value = obj.get("value")
    if not isinstance(value, str) or "\x00" in value:
        raise ProtocolError("invalid_field", "value must be a string without NUL")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ProtocolError("invalid_field", "value must be valid UTF-8") from None
    if size > limits.MAX_SECRET_VALUE_BYTES:
        limit = limits.MAX_SECRET_VALUE_BYTES
        raise ProtocolError("payload_too_large", f"a secret's value is limited to {limit} bytes")
    return value


def _command(obj: dict) -> str:
    command = validate_command(obj.get("command"))
    if not command.strip():
        raise ProtocolError("invalid_field", "command must not be empty: a service is a program that keeps running")
    return command


def _cwd(obj: dict) -> str | None:
    cwd = obj.get("cwd")
    return None if cwd is None else validate_abs_path(cwd, "invalid_cwd", "cwd")


def _restart(obj: dict) -> str:
    restart = obj.get("restart", DEFAULT_RESTART)
    if restart not in RESTART_POLICIES:
        raise ProtocolError("invalid_field", f"restart is one of {', '.join(RESTART_POLICIES)}")
    return restart


def _health_path(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ProtocolError("invalid_field", 'health is an object such as {"path": "/health"}')
    _reject_unknown(value, frozenset(("path",)))
    path = value.get("path")
    paths = validate_allow_paths([path]) if isinstance(path, str) else ()
    if not paths:
        raise ProtocolError("invalid_field", "health.path is a normalized absolute path such as /health")
    return paths[0]


@dataclass(frozen=True)
class ServiceSpec:
    """A service as defined by PUT …/services/{name} and stored by the workspace."""

    command: str
    port: int
    cwd: str | None = None  # None: the workspace's cwd
    env: dict[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()  # names, injected as environment variables of the same name when it starts
    health_path: str | None = None
    allow_paths: tuple[str, ...] = ()  # empty: every path
    restart: str = DEFAULT_RESTART
    # the proxy authenticates to the service with `Authorization: Bearer <this secret's value>` (an API that insists
    # on a key, such as Hermes' API server): the caller's own credentials never cross, the service's own key does
    bearer_secret: str | None = None

    def to_json(self) -> dict:
        """The stored and public shape (as PUT takes it)."""
        return {
            "command": self.command,
            "port": self.port,
            "cwd": self.cwd,
            "env": dict(self.env),
            "secrets": list(self.secrets),
            "health": {"path": self.health_path} if self.health_path is not None else None,
            "allow_paths": list(self.allow_paths),
            "restart": self.restart,
            "bearer_secret": self.bearer_secret,
        }


_SERVICE_FIELDS = frozenset(
    ("command", "port", "cwd", "env", "secrets", "health", "allow_paths", "restart", "bearer_secret")
)


def parse_service(obj: dict) -> ServiceSpec:
    _reject_unknown(obj, _SERVICE_FIELDS)
    if "port" not in obj:
        raise ProtocolError("invalid_port", "port is required")
    command = _command(obj)
    port = validate_port(obj["port"])
    env = parse_env(obj.get("env"))
    secrets = _secret_names(obj.get("secrets"))
    _check_env_room(env, secrets)
    allow = obj.get("allow_paths")
    bearer = obj.get("bearer_secret")
    return ServiceSpec(
        command=command,
        port=port,
        cwd=_cwd(obj),
        env=env,
        secrets=secrets,
        health_path=_health_path(obj.get("health")),
        allow_paths=() if allow is None else validate_allow_paths(allow),
        restart=_restart(obj),
        bearer_secret=None if bearer is None else validate_secret_name(bearer),
    )


def service_from_json(obj: dict) -> ServiceSpec:
    """A stored spec back (it was validated when it was PUT)."""
    health = obj.get("health")
    return ServiceSpec(
        command=obj["command"],
        port=obj["port"],
        cwd=obj.get("cwd"),
        env=dict(obj.get("env") or {}),
        secrets=tuple(obj.get("secrets") or ()),
        health_path=health["path"] if health else None,
        allow_paths=tuple(obj.get("allow_paths") or ()),
        restart=obj.get("restart", DEFAULT_RESTART),
        bearer_secret=obj.get("bearer_secret"),
    )


@dataclass(frozen=True)
class SupervisedService:
    """A service as the supervisor runs it: everything resolved (cwd, the secrets' values inside env)."""

    command: str
    port: int
    cwd: str
    env: dict[str, str]
    health_path: str | None
    restart: str

    def to_json(self) -> dict:
        return {
            "command": self.command,
            "port": self.port,
            "cwd": self.cwd,
            "env": dict(self.env),
            "health_path": self.health_path,
            "restart": self.restart,
        }


_SUPERVISED_FIELDS = frozenset(("command", "port", "cwd", "env", "health_path", "restart"))


def parse_supervised_service(obj: dict) -> SupervisedService:
    _reject_unknown(obj, _SUPERVISED_FIELDS)
    if "port" not in obj:
        raise ProtocolError("invalid_port", "port is required")
    cwd = _cwd(obj)
    if cwd is None:
        raise ProtocolError("invalid_cwd", "cwd is required")
    health = obj.get("health_path")
    return SupervisedService(
        command=_command(obj),
        port=validate_port(obj["port"]),
        cwd=cwd,
        env=parse_env(obj.get("env")),
        health_path=None if health is None else _health_path({"path": health}),
        restart=_restart(obj),
    )


def supervised(spec: ServiceSpec, default_cwd: str, secret_values: dict[str, str]) -> SupervisedService:
    """What the supervisor is sent for `spec`: `secret_values` holds (at least) the values of the secrets it names."""
    env = dict(spec.env)
    for name in spec.secrets:
        if name in secret_values:  # a secret deleted since the service was defined: it starts without it
            env[name] = secret_values[name]
    return SupervisedService(spec.command, spec.port, spec.cwd or default_cwd, env, spec.health_path, spec.restart)
