"""Validation of names, ids, paths and request bodies. Each failure raises ProtocolError with its code."""

import json
import re
from dataclasses import dataclass, field

from protocol import limits
from protocol.errors import ProtocolError

_NAME = re.compile(limits.NAME_PATTERN)
_REQUEST_ID = re.compile(limits.REQUEST_ID_PATTERN)
_ENV_NAME = re.compile(limits.ENV_NAME_PATTERN)
_IMAGE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def validate_name(value: object, what: str = "name") -> str:
    # fullmatch, not match: `$` would accept a trailing newline
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ProtocolError("invalid_name", f"{what} must match {limits.NAME_PATTERN}")
    return value


def validate_request_id(value: object) -> str:
    if not isinstance(value, str) or not _REQUEST_ID.fullmatch(value):
        raise ProtocolError("invalid_request_id")
    return value


def validate_abs_path(value: object, code: str = "invalid_path", what: str = "path") -> str:
    if not isinstance(value, str) or not value.startswith("/"):
        raise ProtocolError(code, f"{what} must be an absolute path")
    if "\x00" in value:
        raise ProtocolError(code, f"{what} must not contain NUL")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise ProtocolError(code, f"{what} must be valid UTF-8") from None
    if size > limits.MAX_PATH_BYTES:
        raise ProtocolError(code, f"{what} is over {limits.MAX_PATH_BYTES} bytes")
    return value


def validate_offset(value: object) -> int:
    """Query-string offset for reattach: a non-negative integer in decimal."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 12:
        return int(value)
    raise ProtocolError("invalid_query", "offset must be a non-negative integer")


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_JSON_BRACKET = re.compile(rb"[\[\]{}]")


def _json_depth(body: bytes) -> int:
    """How deep objects and arrays nest, counted over the brackets outside strings (no parse). Most bodies hold
    fewer opening brackets than the limit in all, which answers without the scan."""
    if body.count(b"[") + body.count(b"{") <= limits.MAX_JSON_DEPTH:  # a shortcut only  # pragma: no mutate
        return 0  # pragma: no mutate
    depth = deepest = 0
    for bracket in _JSON_BRACKET.findall(_JSON_STRING.sub(b"", body)):
        depth += 1 if bracket in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ProtocolError("invalid_json", f"the key {twice!r} appears twice in one object")
    return obj


def parse_json_object(body: bytes, max_bytes: int = limits.MAX_BODY_BYTES) -> dict:
    if len(body) > max_bytes:
        raise ProtocolError("payload_too_large", f"JSON bodies are limited to {max_bytes} bytes")
    if _json_depth(body) > limits.MAX_JSON_DEPTH:  # before parsing: a deep body would exhaust the parser's stack
        raise ProtocolError("invalid_json", f"objects and arrays nest deeper than {limits.MAX_JSON_DEPTH} levels")
    try:
        value = json.loads(body.decode("utf-8"), object_pairs_hook=_unique_keys)
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError("invalid_json") from None
    if not isinstance(value, dict):
        raise ProtocolError("invalid_json")
    return value


def _reject_unknown(obj: dict, allowed: frozenset) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ProtocolError("unknown_field", f"unknown field {unknown[0]!r}")


def _text(obj: dict, key: str, default: str | None = None) -> str | None:
    value = obj.get(key, default)
    if value is not None and not isinstance(value, str):
        raise ProtocolError("invalid_field", f"{key} must be a string")
    return value


def _bool(obj: dict, key: str, default: bool) -> bool:
    value = obj.get(key, default)
    if not isinstance(value, bool):
        raise ProtocolError("invalid_field", f"{key} must be true or false")
    return value


@dataclass(frozen=True)
class ExecRequest:
    request_id: str
    command: str
    timeout: float = limits.DEFAULT_TIMEOUT_SECONDS
    stdin: str | None = None
    login: bool = False
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()  # names of the workspace's secrets to add to env (resolved by the workspace)

    def to_json(self) -> dict:
        return {
            "request_id": self.request_id,
            "command": self.command,
            "timeout": self.timeout,
            "stdin": self.stdin,
            "login": self.login,
            "cwd": self.cwd,
            "env": dict(self.env),
            "secrets": list(self.secrets),
        }


_EXEC_FIELDS = frozenset(("request_id", "command", "timeout", "stdin", "login", "cwd", "env", "secrets"))


def parse_timeout(value: object) -> float:
    # bool is an int subclass; reject it explicitly
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError("invalid_timeout")
    # NaN and infinity fail the range check too (an int may be too large for a float: never convert)
    if not 0 < value <= limits.MAX_TIMEOUT_SECONDS:
        raise ProtocolError("invalid_timeout")
    return value


def parse_env(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProtocolError("invalid_field", "env must be an object of strings")
    if len(value) > limits.MAX_ENV_VARS:
        raise ProtocolError("invalid_field", f"env has more than {limits.MAX_ENV_VARS} variables")
    for name, val in value.items():
        if not _ENV_NAME.fullmatch(name) or len(name) > limits.MAX_ENV_NAME_BYTES:
            raise ProtocolError("invalid_field", "env names must match " + limits.ENV_NAME_PATTERN)
        if not isinstance(val, str) or "\x00" in val:
            raise ProtocolError("invalid_field", f"env value of {name} must be a string without NUL")
        try:
            size = len(name) + 1 + len(val.encode("utf-8"))  # the "NAME=value" string the command gets
        except UnicodeEncodeError:
            raise ProtocolError("invalid_field", f"env value of {name} must be valid UTF-8") from None
        if size > limits.MAX_ENV_ENTRY_BYTES:
            raise ProtocolError(
                "invalid_field",
                f"env {name}=value is {size} bytes; the kernel takes at most {limits.MAX_ENV_ENTRY_BYTES}"
                " (pass larger data in a file)",
            )
    return dict(value)


def validate_command(command: object) -> str:
    """A command for `bash -c` (an exec's, a service's): a string without NUL, at most MAX_COMMAND_BYTES of UTF-8."""
    if not isinstance(command, str):
        raise ProtocolError("invalid_field", "command must be a string")
    if "\x00" in command:
        raise ProtocolError("invalid_field", "command must not contain NUL")
    try:
        command_bytes = len(command.encode("utf-8"))
    except UnicodeEncodeError:
        raise ProtocolError("invalid_field", "command must be valid UTF-8") from None
    if command_bytes > limits.MAX_COMMAND_BYTES:
        raise ProtocolError("command_too_large")
    return command


def parse_exec_request(obj: dict) -> ExecRequest:
    _reject_unknown(obj, _EXEC_FIELDS)
    request_id = validate_request_id(obj.get("request_id"))
    command = validate_command(obj.get("command"))
    timeout = obj.get("timeout")
    timeout = limits.DEFAULT_TIMEOUT_SECONDS if timeout is None else parse_timeout(timeout)
    stdin = _text(obj, "stdin")
    if stdin is not None:
        try:
            stdin.encode("utf-8")
        except UnicodeEncodeError:
            raise ProtocolError("invalid_field", "stdin must be UTF-8 text") from None
    login = _bool(obj, "login", False)
    cwd = obj.get("cwd")
    if cwd is not None:
        validate_abs_path(cwd, "invalid_cwd", "cwd")
    env = parse_env(obj.get("env"))
    secrets = _secret_names(obj.get("secrets"))
    _check_env_room(env, secrets)
    return ExecRequest(request_id, command, timeout, stdin, login, cwd, env, secrets)


_SECRET_NAME = re.compile(limits.SECRET_NAME_PATTERN)


def _check_env_room(env: dict[str, str], secrets: tuple[str, ...]) -> None:
    """Secrets join env under their own names: none may clash, and together they stay within MAX_ENV_VARS."""
    clash = sorted(set(secrets) & set(env))
    if clash:
        raise ProtocolError("invalid_field", f"{clash[0]} is both in env and in secrets")
    if len(env) + len(secrets) > limits.MAX_ENV_VARS:
        raise ProtocolError("invalid_field", f"env and secrets together hold more than {limits.MAX_ENV_VARS} variables")


def _secret_names(value: object) -> tuple[str, ...]:
    """A list of secret names (a service's or an exec's `secrets`), duplicates dropped."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > limits.MAX_SERVICE_SECRETS:
        raise ProtocolError("invalid_field", f"secrets is a list of at most {limits.MAX_SERVICE_SECRETS} secret names")
    names: list[str] = []
    for name in value:
        if not isinstance(name, str) or not _SECRET_NAME.fullmatch(name):
            raise ProtocolError("invalid_name", f"secret names must match {limits.SECRET_NAME_PATTERN}")
        if name not in names:
            names.append(name)
    return tuple(names)


@dataclass(frozen=True)
class WorkspaceConfig:
    image: str = limits.DEFAULT_IMAGE
    instance: str | None = None  # None: the deployment's DEFAULT_INSTANCE_TYPE, resolved by the workspace
    persistent: bool = True
    cwd: str = limits.DEFAULT_CWD

    def to_json(self) -> dict:
        return {"image": self.image, "instance": self.instance, "persistent": self.persistent, "cwd": self.cwd}


_CONFIG_FIELDS = frozenset(("image", "instance", "persistent", "cwd"))


def parse_workspace_config(obj: dict) -> WorkspaceConfig:
    _reject_unknown(obj, _CONFIG_FIELDS)
    image = _text(obj, "image", limits.DEFAULT_IMAGE)
    if image is None or not _IMAGE.fullmatch(image):  # null is not "the default": only omission is
        raise ProtocolError("invalid_field", "image must match ^[A-Za-z0-9_-]{1,128}$")
    instance = _text(obj, "instance")
    if instance is not None and instance not in limits.INSTANCE_TYPES:
        raise ProtocolError("instance_not_allowed", f"instance must be one of {', '.join(limits.INSTANCE_TYPES)}")
    persistent = _bool(obj, "persistent", True)
    cwd = validate_abs_path(_text(obj, "cwd", limits.DEFAULT_CWD), "invalid_cwd", "cwd")
    return WorkspaceConfig(image, instance, persistent, cwd)


def parse_file_mode(value: str | None) -> int:
    if value is None:
        return 0o644
    if not (isinstance(value, str) and 1 <= len(value) <= 4 and all(c in "01234567" for c in value)):
        raise ProtocolError("invalid_query", "mode is an octal permission such as 0644")
    return int(value, 8)
