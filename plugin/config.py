"""The plugin's settings, read from HERMES_CF_* (the seed's names) through Hermes' profile-scoped secret lookup.

HERMES_CF_TOKEN is the server's token or a scoped key (`fbk_…`); both are sent the same way. A key needs the exec
and files scopes on the workspace, and manage only where the plugin creates workspaces (environment.py).

Raw task ids and host paths never leave the host: the default namespace is a hash of the Hermes profile home, and a
workspace name is a hash of namespace + task id unless HERMES_CF_WORKSPACE names one.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import uuid
from dataclasses import dataclass, field

from .client import NAME_PATTERN, check_endpoint

SECRET_KEYS = frozenset(
    {"HERMES_CF_TOKEN", "HERMES_CF_ACCESS_CLIENT_ID", "HERMES_CF_ACCESS_CLIENT_SECRET", "SANDBOX_API_TOKEN"}
)
INSTANCE_TYPES = ("lite", "standard-1", "standard-2", "standard-3", "standard-4")
MIN_TOKEN_CHARS = 32
_NAME = re.compile(NAME_PATTERN)
_IMAGE = re.compile(r"[A-Za-z0-9_-]{1,128}")
PROBE_TASK_ID = "prompt-backend-probe"
DEFAULT_CWD = "/workspace"


class ConfigError(ValueError):
    """The settings are missing or invalid; the message says which variable and how to fix it."""


def read_setting(name: str) -> str | None:
    """One HERMES_CF_* value. Inside Hermes it comes from agent.secret_scope.get_secret (profile-scoped); when
    that raises UnscopedSecretError (multiplexing with no scope bound) we do NOT fall back to os.environ, which
    could hold another profile's credentials."""
    try:
        from agent.secret_scope import get_secret
    except ImportError:  # outside Hermes (CLI, tests)
        value = os.environ.get(name)
    else:
        try:
            value = get_secret(name)
        except Exception as exc:  # UnscopedSecretError, and anything else the scope machinery raises
            raise ConfigError(
                f"{name} cannot be read: no Hermes profile scope is active ({type(exc).__name__})"
            ) from None
    value = value.strip() if isinstance(value, str) else None
    return value or None


def _hermes_home() -> str:
    try:
        from hermes_constants import get_hermes_home

        return str(get_hermes_home())
    except Exception:
        return os.environ.get("HERMES_HOME") or os.path.expanduser("~/.hermes")


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class Settings:
    endpoint: str
    token: str = field(repr=False)
    namespace: str
    workspace: str | None = None
    image: str | None = None
    instance: str | None = None
    access_client_id: str | None = field(default=None, repr=False)
    access_client_secret: str | None = field(default=None, repr=False)

    def workspace_config(self, persistent: bool, cwd: str = "/workspace") -> dict:
        config: dict = {"persistent": persistent, "cwd": cwd}
        if self.image:
            config["image"] = self.image
        if self.instance:
            config["instance"] = self.instance
        return config

    def persistent_workspace(self, task_id: str) -> str:
        """HERMES_CF_WORKSPACE, or `t-` + a hash of namespace and task id (stable per profile and task)."""
        return self.workspace or "t-" + _digest(self.namespace, task_id)[:40]

    def ephemeral_workspace(self, task_id: str) -> str:
        """A fresh name every time: ephemeral workspaces are never shared or reused."""
        return f"e-{_digest(self.namespace, task_id)[:16]}-{uuid.uuid4().hex}"


def load_settings() -> Settings:
    """Read and validate every setting; ConfigError names the first problem."""
    endpoint = read_setting("HERMES_CF_ENDPOINT")
    if not endpoint:
        raise ConfigError("HERMES_CF_ENDPOINT is not set: set it to your Flarebox server's https:// URL")
    try:
        endpoint = check_endpoint(endpoint)
    except ValueError as exc:
        raise ConfigError(f"HERMES_CF_ENDPOINT: {exc}") from None
    token = read_setting("HERMES_CF_TOKEN")
    if not token:
        raise ConfigError(
            "HERMES_CF_TOKEN is not set: use the server's SANDBOX_API_TOKEN, or a scoped key (fbk_…) from "
            "`flarebox keys create` with the exec and files scopes"
        )
    if len(token) < MIN_TOKEN_CHARS or not token.isascii() or any(c.isspace() for c in token):
        raise ConfigError(f"HERMES_CF_TOKEN must be at least {MIN_TOKEN_CHARS} ASCII characters without spaces")
    namespace = read_setting("HERMES_CF_NAMESPACE") or "hermes-" + _digest(_hermes_home())[:12]
    if not _NAME.fullmatch(namespace):
        raise ConfigError(f"HERMES_CF_NAMESPACE must match {NAME_PATTERN}")
    workspace = read_setting("HERMES_CF_WORKSPACE")
    if workspace is not None and not _NAME.fullmatch(workspace):
        raise ConfigError(f"HERMES_CF_WORKSPACE must match {NAME_PATTERN}")
    image = read_setting("HERMES_CF_IMAGE")
    if image is not None and not _IMAGE.fullmatch(image):
        raise ConfigError("HERMES_CF_IMAGE must match [A-Za-z0-9_-]{1,128}")
    instance = read_setting("HERMES_CF_INSTANCE")
    if instance is not None and instance not in INSTANCE_TYPES:
        raise ConfigError(f"HERMES_CF_INSTANCE must be one of {', '.join(INSTANCE_TYPES)}")
    access_id = read_setting("HERMES_CF_ACCESS_CLIENT_ID")
    access_secret = read_setting("HERMES_CF_ACCESS_CLIENT_SECRET")
    if bool(access_id) != bool(access_secret):
        raise ConfigError("set both HERMES_CF_ACCESS_CLIENT_ID and HERMES_CF_ACCESS_CLIENT_SECRET, or neither")
    return Settings(endpoint, token, namespace, workspace, image, instance, access_id, access_secret)


def sandbox_cwd(cwd: str | None) -> str:
    """Hermes passes /root when terminal.cwd is unset (and rewrites host-looking paths to it); the sandbox user's
    home is not /root, so those and relative paths mean "the workspace"."""
    if not cwd or cwd in ("/root", "~") or not cwd.startswith("/"):
        return DEFAULT_CWD
    return posixpath.normpath(cwd)
