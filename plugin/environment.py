"""CloudflareSandboxEnvironment: Hermes' BaseEnvironment on a Flarebox workspace.

Hermes builds every command itself (snapshot sourcing, cd, cwd markers) and hands it to `_run_bash`; we run it
remotely and stream it back through a RemoteProcess. Nothing holds a lock across a command: execute_code polls for
tool calls with more commands while its script runs, and a lock here would deadlock it.
"""

from __future__ import annotations

import logging
import posixpath
import re
import threading
import uuid
from pathlib import Path

from tools.environments.base import BaseEnvironment

from .client import ApiError, Client, TransportError
from .compat import EnvironmentConnectionError, FileFetchError
from .config import Settings
from .process import RemoteProcess

logger = logging.getLogger(__name__)

MAX_SERVER_TIMEOUT = 900
# Hermes enforces each command's timeout itself (and kills us at the deadline); the server's own deadline is a
# backstop a little later, so the agent sees Hermes' usual "[Command timed out after Ns]" and 124.
SERVER_TIMEOUT_GRACE = 2
# JSON bodies are limited to 1 MiB; the command takes up to 64 KiB and JSON escaping can grow text, so stdin above
# this is staged through PUT /files instead of travelling inline.
INLINE_STDIN_LIMIT = 512 * 1024
STDIN_STAGE_DIR = "/tmp"  # noqa: S108 - a path inside the sandbox, not on the host
RETRY_HINT = (
    "This is a failure of the Flarebox connection or workspace, not of the command. The command may or may not "
    "have run: check the workspace state before repeating anything with side effects. Retry once the server at "
    "{endpoint} is reachable; the next command reconnects by itself."
)


def hermes_safe(text: str) -> str:
    """Hermes reports any backend error whose text contains "timeout" as a timed-out command (exit 124); an
    infrastructure failure such as startup_timeout is not one, so spell it so that rule cannot misfire."""
    return re.sub("timeout", "time-out", text, flags=re.IGNORECASE)


class CloudflareSandboxEnvironment(BaseEnvironment):
    # A cold start or a restore from a snapshot happens inside the first command (init_session); give it time.
    _snapshot_timeout = 120
    _stdin_mode = "pipe"

    def __init__(
        self,
        *,
        settings: Settings,
        workspace: str,
        cwd: str,
        timeout: int,
        persistent: bool,
        probe: bool = False,
        client: Client | None = None,
    ):
        super().__init__(cwd=cwd, timeout=timeout)
        # Hermes tears down every environment without `_persistent` at the end of each agent turn.
        self._persistent = bool(persistent)
        self._closed = False
        self._degraded = False
        self._seen_started = False
        self._cleanup_lock = threading.Lock()
        self._settings = settings
        self.namespace = settings.namespace
        self.workspace = workspace
        self._client = client or Client(
            settings.endpoint,
            settings.token,
            access_client_id=settings.access_client_id,
            access_client_secret=settings.access_client_secret,
        )
        try:
            self._client.put_workspace(self.namespace, workspace, settings.workspace_config(self._persistent))
        except ApiError as exc:
            self._give_up()
            hint = ""
            if exc.code == "config_conflict":
                hint = " (it exists with another image, instance or persistence: pick another HERMES_CF_WORKSPACE)"
            raise EnvironmentConnectionError(
                hermes_safe(f"Flarebox refused workspace {workspace}: {exc.code}: {exc.message}{hint}"),
                retry_hint=self._hint(),
            ) from None
        except TransportError as exc:
            self._give_up()
            raise EnvironmentConnectionError(
                f"cannot reach the Flarebox server: {exc.reason}", retry_hint=self._hint()
            ) from None
        if probe:
            # The prompt probe runs one `uname` with a 4 s budget, then force-removes us: skip the session
            # snapshot (its login-shell bootstrap could eat the whole budget on a cold start).
            return
        # init_session() swallows exceptions (it falls back to login shells); remember an infrastructure failure
        # seen meanwhile and raise it here, so Hermes does not cache an environment that cannot work.
        self._init_failure: str | None = None
        self._initializing = True
        try:
            self.init_session()
        finally:
            self._initializing = False
        if self._init_failure:
            self._give_up()
            raise EnvironmentConnectionError(hermes_safe(self._init_failure), retry_hint=self._hint())

    # --- BaseEnvironment ---------------------------------------------------------------------------------

    def _run_bash(self, cmd_string: str, *, login: bool = False, timeout: int = 120, stdin_data: str | None = None):
        seconds = min(MAX_SERVER_TIMEOUT, max(1, int(timeout or self.timeout or 120)) + SERVER_TIMEOUT_GRACE)
        return RemoteProcess(
            command=cmd_string,
            request_fields={"timeout": seconds, "login": bool(login), "cwd": None},
            run_fn=self._stream,
            cancel_fn=self._cancel,
            stage_fn=self._stage_stdin,
            stdin=stdin_data,
            on_started=self._on_started,
            inline_stdin_limit=INLINE_STDIN_LIMIT,
        )

    def _wait_for_process(self, proc, *args, **kwargs):
        """Hermes' wait, then: a command whose outcome is unknown or whose workspace failed is an infrastructure
        failure (EnvironmentConnectionError → a `degraded` tool result), never a made-up exit code."""
        result = super()._wait_for_process(proc, *args, **kwargs)
        error = getattr(proc, "error", None)
        if error and proc.poll() is not None:
            if getattr(self, "_initializing", False) and self._init_failure is None:
                self._init_failure = error
            self._degraded = True
            raise EnvironmentConnectionError(hermes_safe(error), retry_hint=self._hint())
        return result

    def fetch_file(self, remote_path: str, local_dest: Path, *, max_bytes: int) -> None:
        """Binary download through GET /files instead of base64 over exec (no 2M-character output limit)."""
        path = remote_path
        if path.startswith("~"):
            fetch = getattr(super(), "fetch_file", None)
            if fetch is None:
                raise FileFetchError(f"cannot resolve {remote_path!r} in the sandbox")
            return fetch(remote_path, local_dest, max_bytes=max_bytes)
        if not path.startswith("/"):
            path = posixpath.join(self.cwd, path)
        try:
            self._client.read_file(self.namespace, self.workspace, path, Path(local_dest), max_bytes=max_bytes)
        except ApiError as exc:
            if exc.code == "file_too_large":
                raise FileFetchError(
                    f"{remote_path!r} exceeds the {max_bytes // (1024 * 1024)} MB delivery limit"
                ) from None
            raise FileFetchError(f"could not read {remote_path!r} in the sandbox ({exc.code})") from None
        except (TransportError, OSError) as exc:
            raise FileFetchError(f"transfer of {remote_path!r} failed: {exc}") from None

    def cleanup(self, *, force_remove: bool = False) -> None:
        """Idempotent and never raises (Hermes calls it from __del__ too). Persistent → stop (snapshot, then stop);
        ephemeral or force_remove → delete. The call runs on a daemon thread so Hermes is not held up by a large
        snapshot; if Hermes exits first, the server's idle timer still saves the workspace (nothing is lost)."""
        try:
            with self._cleanup_lock:
                if self._closed:
                    return
                self._closed = True
            client = self._client
            if force_remove or not self._persistent:
                action = client.delete_workspace
            elif self._degraded:
                action = None  # the connection failed: leave the workspace to its idle timer, kill nothing
            else:
                action = client.stop
            threading.Thread(target=self._finish, args=(action,), name="flarebox-cleanup", daemon=True).start()
        except Exception:
            logger.debug("flarebox cleanup failed", exc_info=True)

    # --- helpers ---------------------------------------------------------------------------------------------

    def _finish(self, action) -> None:
        try:
            if action is not None:
                action(self.namespace, self.workspace)
        except ApiError as exc:
            if exc.code not in ("workspace_not_found", "not_found"):
                logger.info("Flarebox cleanup of %s: %s", self.workspace, exc.code)
        except Exception as exc:
            logger.info("Flarebox cleanup of %s failed: %s", self.workspace, type(exc).__name__)
        finally:
            try:
                self._client.close()
            except Exception:
                pass

    def _give_up(self) -> None:
        """Construction failed: close the client without touching the workspace (never delete a persistent one)."""
        self._closed = True
        try:
            self._client.close()
        except Exception:
            pass

    def _hint(self) -> str:
        return RETRY_HINT.format(endpoint=self._settings.endpoint)

    def _stream(self, request: dict, offset: int | None):
        if offset is None:
            return self._client.exec(self.namespace, self.workspace, request)
        return self._client.reattach(self.namespace, self.workspace, request["request_id"], offset)

    def _cancel(self, request_id: str) -> None:
        self._client.cancel(self.namespace, self.workspace, request_id)

    def _stage_stdin(self, data: bytes) -> str:
        path = f"{STDIN_STAGE_DIR}/.flarebox-stdin-{uuid.uuid4().hex}"
        self._client.write_file(self.namespace, self.workspace, path, data, mode=0o600)
        return path

    def _on_started(self, event: dict) -> None:
        container = event.get("container")
        # restored/restarted: files came back, processes did not — news even on an environment's first command,
        # since a resumed Hermes session may remember processes from before. An empty `fresh` workspace is only
        # news after this environment has already used it.
        replaced = container in ("restored", "restarted") or (container == "fresh" and self._seen_started)
        self._seen_started = True
        if replaced:
            logger.info("Flarebox workspace %s came back %s: running processes are gone", self.workspace, container)
            mark = getattr(self, "_mark_recreated", None)
            if mark is not None:
                mark()
