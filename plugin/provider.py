"""The `cloudflare_sandbox` terminal backend Hermes selects with terminal.backend, for both of Hermes' contracts.

- The provider contract (Hermes v0.20.6 / v2026.8.27 and later): CloudflareSandboxProvider, registered with
  ctx.register_terminal_environment_provider; Hermes calls its create_environment().
- The backend-definition contract (upstream's tools/environments/registry.py): backend_definition() builds the frozen
  TerminalBackendDefinition registered with ctx.register_terminal_backend; Hermes calls environment_from_request()
  with a read-only TerminalBackendRequest and owns the environment's lifecycle (its cache, and calling cleanup()).

Both build the same CloudflareSandboxEnvironment through open_environment(). __init__.register picks the contract.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from .client import Client, FlareboxError
from .config import (
    _IMAGE,
    DEFAULT_CWD,
    INSTANCE_TYPES,
    PROBE_TASK_ID,
    SECRET_KEYS,
    ConfigError,
    load_settings,
    read_setting,
    sandbox_cwd,
)

try:
    from agent.terminal_env_provider import TerminalEnvironmentProvider
except ImportError:  # a Hermes with only the backend-definition contract: the provider class is then never registered
    TerminalEnvironmentProvider = object

logger = logging.getLogger(__name__)

PROBE_SECONDS = 1.0  # per phase (connect, read): the whole probe stays within Hermes' ~2 s budget
BACKEND_NAME = "cloudflare_sandbox"
# The backend-definition contract's image keys. Hermes resolves TerminalBackendRequest.image from a per-task override
# under IMAGE_OVERRIDE_KEY, else IMAGE_CONFIG_KEY in the plugin's settings block
# (plugins.entries.cloudflare-sandbox.terminal_backend in config.yaml), else the definition's default_image (none:
# then HERMES_CF_IMAGE, as on the provider contract, and without it the server's default image).
IMAGE_OVERRIDE_KEY = "cloudflare_sandbox_image"
IMAGE_CONFIG_KEY = "image"
# What the settings block may set, each the config.yaml twin of a HERMES_CF_* setting or of terminal.*. Credentials
# and the endpoint are never read from it: they stay in the profile's .env (HERMES_CF_*).
SETTING_KEYS = frozenset({IMAGE_CONFIG_KEY, "instance", "container_persistent"})
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class CloudflareSandboxProvider(TerminalEnvironmentProvider):
    name = BACKEND_NAME
    is_remote = True
    is_container = True
    # With container_persistent: false every session gets its own (ephemeral) workspace.
    session_isolated_when_nonpersistent = True

    @property
    def display_name(self) -> str:
        return "Cloudflare Sandbox (Flarebox)"

    @property
    def description(self) -> str:
        return "Run commands, file tools and execute_code in a remote Flarebox workspace, snapshotted when idle."

    @property
    def env_description(self) -> str:
        return "a remote Linux sandbox (Flarebox workspace at /workspace; no access to the host filesystem)"

    @property
    def skip_container_guards(self) -> bool:
        # Deliberately True by default (Hermes' default for containers, as for docker and modal): the sandbox IS the
        # isolation boundary; no host path is mounted and the token never enters it. Approval prompts would only
        # stop unattended execute_code and cron runs from working. kiyo-e's plugin chose False; users who want
        # that set HERMES_CF_REQUIRE_APPROVAL=true (see plugin/README.md).
        try:
            return (read_setting("HERMES_CF_REQUIRE_APPROVAL") or "").lower() not in ("1", "true", "yes", "on")
        except Exception:
            return False  # settings unreadable: keep Hermes' approvals on (fail safe)

    @property
    def cache_path_base(self):
        return None  # Hermes' host cache is not synced into the sandbox

    @property
    def strip_env_keys(self) -> frozenset:
        return SECRET_KEYS

    def is_available(self) -> bool:
        try:
            load_settings()
            return True
        except Exception:
            return False

    def check_requirements(self, config: dict[str, Any]) -> bool:
        try:
            load_settings()
            return True
        except ConfigError as exc:
            logger.error("cloudflare_sandbox backend: %s", exc)
            return False
        except Exception as exc:
            logger.error("cloudflare_sandbox backend: settings unreadable (%s)", type(exc).__name__)
            return False

    def probe(self) -> tuple[str, str]:
        """A health check of the server within ~2 s; never raises."""
        try:
            settings = load_settings()
        except Exception as exc:
            return "needs_setup", str(exc) if isinstance(exc, ConfigError) else "settings unreadable"
        try:
            with Client(
                settings.endpoint,
                settings.token,
                timeout=PROBE_SECONDS,
                connect_timeout=PROBE_SECONDS,
                access_client_id=settings.access_client_id,
                access_client_secret=settings.access_client_secret,
            ) as client:
                health = client.health()
            if isinstance(health, dict) and health.get("ok") is True:
                return "ready", f"Flarebox {health.get('version', '?')} at {settings.endpoint}"
            return "unavailable", "the server's health check did not answer ok"
        except FlareboxError as exc:
            return "unavailable", f"{settings.endpoint}: {exc}"
        except Exception as exc:
            return "unavailable", f"{settings.endpoint}: {type(exc).__name__}"

    def setup_instructions(self) -> list[str]:
        return [
            "Start a Flarebox server (`flarebox serve`, or deploy it to Cloudflare) and note its URL and token.",
            "Set HERMES_CF_ENDPOINT (https://…, or http://127.0.0.1:PORT) and HERMES_CF_TOKEN in the profile's .env.",
            "Optional: HERMES_CF_NAMESPACE, HERMES_CF_WORKSPACE, HERMES_CF_IMAGE, HERMES_CF_INSTANCE,",
            "          HERMES_CF_ACCESS_CLIENT_ID / HERMES_CF_ACCESS_CLIENT_SECRET (Cloudflare Access).",
            "Recommended: terminal.cwd /workspace and terminal.container_persistent true.",
        ]

    def doctor_checks(self) -> list[tuple[bool, str, str]]:
        try:
            settings = load_settings()
        except Exception as exc:
            return [(False, "cloudflare_sandbox settings", str(exc) if isinstance(exc, ConfigError) else "unreadable")]
        status, detail = self.probe()
        return [
            (True, "cloudflare_sandbox settings", f"endpoint {settings.endpoint}, namespace {settings.namespace}"),
            (status == "ready", "cloudflare_sandbox server", detail),
        ]

    def create_environment(
        self,
        *,
        cwd: str,
        timeout: int,
        task_id: str = "default",
        image: str | None = None,
        container_config: dict[str, Any] | None = None,
        **kwargs: Any,
    ):
        # `image` stays ignored: Hermes fills it from its own backends' image settings (empty for a plugin), not
        # with a Flarebox image name; HERMES_CF_IMAGE names that.
        return open_environment(
            cwd=cwd,
            timeout=timeout,
            task_id=task_id,
            persistent=bool((container_config or {}).get("container_persistent", True)),
            probe_only=bool(kwargs.get("probe_only")),
        )


def open_environment(
    *,
    cwd: str | None,
    timeout: int | None,
    task_id: str | None,
    persistent: bool = True,
    probe_only: bool = False,
    image: str | None = None,
    instance: str | None = None,
):
    """A CloudflareSandboxEnvironment for one Hermes task, on either contract. `image` and `instance`, when given,
    win over HERMES_CF_IMAGE / HERMES_CF_INSTANCE. A settings problem is an EnvironmentConnectionError."""
    from .compat import EnvironmentConnectionError
    from .environment import CloudflareSandboxEnvironment

    try:
        settings = load_settings()
        if image:
            if not _IMAGE.fullmatch(image):
                raise ConfigError(
                    f"the image {image!r} (the {IMAGE_CONFIG_KEY!r} setting or the {IMAGE_OVERRIDE_KEY!r} task "
                    "override) is not a Flarebox image name: it must match [A-Za-z0-9_-]{1,128}"
                )
            settings = dataclasses.replace(settings, image=image)
        if instance:
            if instance not in INSTANCE_TYPES:
                raise ConfigError(f"the 'instance' setting must be one of {', '.join(INSTANCE_TYPES)}")
            settings = dataclasses.replace(settings, instance=instance)
    except ConfigError as exc:
        raise EnvironmentConnectionError(
            f"cloudflare_sandbox is not configured: {exc}", retry_hint="Set the HERMES_CF_* settings, then retry."
        ) from None
    task_id = str(task_id or "default")
    probe = task_id == PROBE_TASK_ID or bool(probe_only)
    persistent = bool(persistent) and not probe
    workspace = settings.persistent_workspace(task_id) if persistent else settings.ephemeral_workspace(task_id)
    return CloudflareSandboxEnvironment(
        settings=settings,
        workspace=workspace,
        cwd=sandbox_cwd(cwd),
        timeout=int(timeout or 180),
        persistent=persistent,
        probe=probe,
    )


# --- the backend-definition contract (ctx.register_terminal_backend) -----------------------------------------------


def backend_definition(definition_cls):
    """The backend's definition, built with Hermes' own TerminalBackendDefinition class (its registry accepts only
    instances of it, and validates the fields when the definition is built)."""
    return definition_cls(
        name=BACKEND_NAME,
        factory=environment_from_request,
        container_paths=True,  # paths belong to the sandbox, never to the Hermes host
        default_cwd=DEFAULT_CWD,
        default_image="",  # none: HERMES_CF_IMAGE, else the server's default image
        image_override_key=IMAGE_OVERRIDE_KEY,
        image_config_key=IMAGE_CONFIG_KEY,
    )


def environment_from_request(request):
    """The definition's factory: one new environment for a TerminalBackendRequest (name, task_id, cwd, timeout,
    image, settings). The request and its settings are only read. Hermes caches what this returns per task and
    calls its cleanup() when it lets the environment go: a persistent workspace is then snapshotted and stopped, an
    ephemeral one deleted."""
    from .compat import EnvironmentConnectionError

    settings = request.settings if isinstance(request.settings, Mapping) else {}
    unknown = sorted(str(key) for key in settings if key not in SETTING_KEYS)
    if unknown:
        logger.warning(
            "cloudflare_sandbox: ignoring terminal_backend settings %s (known: %s; credentials and the endpoint "
            "belong in the profile's .env as HERMES_CF_*)",
            ", ".join(unknown),
            ", ".join(sorted(SETTING_KEYS)),
        )
    try:
        persistent = _flag(settings.get("container_persistent"), "container_persistent", default=True)
        instance = _text(settings.get("instance"), "instance")
        image = _text(request.image, "image")
    except ConfigError as exc:
        raise EnvironmentConnectionError(
            f"cloudflare_sandbox is not configured: {exc}",
            retry_hint="Fix plugins.entries.cloudflare-sandbox.terminal_backend in config.yaml, then retry.",
        ) from None
    return open_environment(
        cwd=request.cwd,
        timeout=request.timeout,
        task_id=request.task_id,
        persistent=persistent,
        image=image,
        instance=instance,
    )


def _flag(value: Any, name: str, *, default: bool) -> bool:
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise ConfigError(f"the {name!r} setting must be true or false, not {value!r}")


def _text(value: Any, name: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ConfigError(f"the {name!r} setting must be a string, not {type(value).__name__}")
    return value.strip() or None
