"""CloudflareSandboxProvider: the `cloudflare_sandbox` terminal backend Hermes selects with terminal.backend."""

from __future__ import annotations

import logging
from typing import Any

from agent.terminal_env_provider import TerminalEnvironmentProvider

from .client import Client, FlareboxError
from .config import PROBE_TASK_ID, SECRET_KEYS, ConfigError, load_settings, read_setting, sandbox_cwd

logger = logging.getLogger(__name__)

PROBE_SECONDS = 1.0  # per phase (connect, read): the whole probe stays within Hermes' ~2 s budget


class CloudflareSandboxProvider(TerminalEnvironmentProvider):
    name = "cloudflare_sandbox"
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
        from .compat import EnvironmentConnectionError
        from .environment import CloudflareSandboxEnvironment

        try:
            settings = load_settings()
        except ConfigError as exc:
            raise EnvironmentConnectionError(
                f"cloudflare_sandbox is not configured: {exc}", retry_hint="Set the HERMES_CF_* settings, then retry."
            ) from None
        task_id = str(task_id or "default")
        probe = task_id == PROBE_TASK_ID or bool(kwargs.get("probe_only"))
        persistent = bool((container_config or {}).get("container_persistent", True)) and not probe
        workspace = settings.persistent_workspace(task_id) if persistent else settings.ephemeral_workspace(task_id)
        return CloudflareSandboxEnvironment(
            settings=settings,
            workspace=workspace,
            cwd=sandbox_cwd(cwd),
            timeout=int(timeout or 180),
            persistent=persistent,
            probe=probe,
        )
