"""CloudflareSandboxEnvironment: Hermes' BaseEnvironment on a Flarebox workspace.

Hermes builds every command itself (snapshot sourcing, cd, cwd markers) and hands it to `_run_bash`; we run it
remotely and stream it back through a RemoteProcess. Nothing holds a lock across a command: execute_code polls for
tool calls with more commands while its script runs, and a lock here would deadlock it.

`execute` is wrapped for three things Hermes' generic code gets wrong on a remote sandbox (see README):
- a restore notice is kept until a `terminal` result carries it (Hermes gives it to whatever command comes first);
- a background job started by Hermes' process registry runs in the cwd it was started with (Hermes drops it);
- `process kill` of such a job ends the job, not only the subshell Hermes wraps it in.
After `cleanup()` the environment runs nothing: a late command (Hermes' atexit kernel teardown) would boot the workspace
the plugin has just stopped.
"""

from __future__ import annotations

import logging
import posixpath
import re
import sys
import threading
import uuid
from pathlib import Path

from tools.environments.base import BaseEnvironment

from .client import ApiError, Client, TransportError, key_id_of
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
CREDENTIAL_HINT = (
    "This is a refusal of the Flarebox credential, not a failure of the command: retrying will not help until "
    "HERMES_CF_TOKEN in the Hermes profile's .env is the server's token or a scoped key that opens this workspace "
    "with the exec and files scopes."
)
CREDENTIAL_CODES = ("unauthorized", "forbidden")
# What the plugin needs of a scoped key (HERMES_CF_TOKEN may be one): exec and files on its workspace; manage only to
# create a workspace (and to delete an ephemeral one); snapshots to save a persistent one when Hermes releases it.
SCOPE_OF = {"stop": "snapshots", "delete_workspace": "manage"}
# After cleanup(): what became of the workspace, for the refusal of a late command.
RELEASED_AS = {"stop": "stopped", "delete_workspace": "deleted", None: "left to the server's idle timer"}
RELEASED_CODE = "environment_released"
RELEASED_MESSAGE = (
    "Flarebox environment released: Hermes cleaned this environment up and its workspace was {fate}, so the command "
    "did not run (the workspace is not started again for it)"
)
RELEASED_HINT = (
    "Hermes let go of this environment (its session ended or idled out). Its next command builds a new environment, "
    "which restores the workspace from its snapshot."
)
# Hermes' process registry (tools/process_registry.py, spawn_via_env) starts a background job in a sandbox as
#   mkdir -p T && ( nohup bash -lc CMD > T/hermes_bg_ID.log 2>&1; rc=$?; … ) & echo $! > T/hermes_bg_ID.pid && cat …
# and kills it with `kill PID 2>/dev/null`, PID being that subshell's.
BACKGROUND_SPAWN_MARKS = ("( nohup bash -lc ", "/hermes_bg_", ".pid && cat ")
BACKGROUND_KILL = re.compile(r"kill (\d+) 2>/dev/null")
# Ends a background job: the subshell, every descendant, and its process group unless that is the killer's own (a
# job's daemon that left the tree but not the group goes too). TERM, up to 2 s for them to go, then KILL. Plain bash
# and /proc, nothing else assumed of the image.
KILL_JOB_SCRIPT = r"""__fb_root=%d
__fb_stat() { local s; { read -r s < "/proc/$1/stat"; } 2>/dev/null || return 1; s=${s##*) }; echo "$s"; }
__fb_s=$(__fb_stat "$__fb_root") || exit 0
set -- $__fb_s; __fb_group=$3
__fb_s=$(__fb_stat $$); set -- $__fb_s; __fb_own=$3
__fb_job() {
  local pids=" $__fb_root " grew=1 p s
  while [ -n "$grew" ]; do
    grew=
    for p in /proc/[0-9]*; do
      p=${p#/proc/}
      case "$pids" in *" $p "*) continue ;; esac
      [ "$p" = 1 ] || [ "$p" = $$ ] && continue
      s=$(__fb_stat "$p") || continue
      set -- $s
      [ "$1" = Z ] && continue
      case "$pids" in *" $2 "*) pids="$pids$p "; grew=1; continue ;; esac
      if [ "$__fb_group" != "$__fb_own" ] && [ "$3" = "$__fb_group" ]; then pids="$pids$p "; grew=1; fi
    done
  done
  echo $pids
}
__fb_alive() {
  local p s
  for p in "$@"; do s=$(__fb_stat "$p") && set -- $s && [ "$1" != Z ] && return 0; done
  return 1
}
__fb_pids=$(__fb_job)
kill -TERM $__fb_pids 2>/dev/null
for __fb_i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
  __fb_alive $__fb_pids || break
  sleep 0.1
done
__fb_alive $__fb_pids && kill -KILL $__fb_pids $(__fb_job) 2>/dev/null
true"""


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
        self._released_as = RELEASED_AS[None]
        self._degraded = False
        self._seen_started = False
        self._cleanup_lock = threading.Lock()
        self._notice_lock = threading.Lock()
        self._restore_notice = False  # a restore the model has not been told of yet (see execute)
        self._background_pids: set[int] = set()  # subshells of jobs Hermes' process registry started here
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
            self._open_workspace(settings.workspace_config(self._persistent))
        except ApiError as exc:
            self._give_up()
            hint = ""
            if exc.code == "config_conflict":
                hint = " (it exists with another image, instance or persistence: pick another HERMES_CF_WORKSPACE)"
            raise EnvironmentConnectionError(
                hermes_safe(f"Flarebox refused workspace {workspace}: {exc.code}: {exc.message}{hint}"),
                retry_hint=self._hint(exc.code),
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

    def execute(self, command: str, cwd: str = "", **kwargs):
        """Hermes' execute(), with three corrections (kwargs are Hermes' and go on as they are):

        - `terminal` (the one caller that sets bounded_capture, by Hermes' own rule) gets a pending restore notice,
          whichever command met the restore: Hermes hands it to the first result, often a file tool's whose extra
          keys nobody reads, and the model would never learn that its processes are gone;
        - a background job from Hermes' process registry runs in the cwd it was started with (Hermes records it but
          does not pass it on), and leaves the foreground cwd alone;
        - `process kill` of such a job ends the job and everything it started, not only its wrapper subshell."""
        foreground = bool(kwargs.get("bounded_capture"))
        spawn_cwd = _background_spawn_cwd(command)
        if spawn_cwd is not None and not cwd:
            cwd = spawn_cwd
        kill = None if foreground else BACKGROUND_KILL.fullmatch(command.strip())
        if kill is not None and int(kill.group(1)) in self._background_pids:
            self._background_pids.discard(int(kill.group(1)))
            command = KILL_JOB_SCRIPT % int(kill.group(1))
        cwd_before = self.cwd
        result = super().execute(command, cwd, **kwargs)
        if spawn_cwd is not None:
            self.cwd = cwd_before  # the job's cwd is not the terminal's
            output = result.get("output", "") if isinstance(result, dict) else ""
            self._background_pids.update(int(line) for line in map(str.strip, output.splitlines()) if line.isdigit())
        if isinstance(result, dict):
            with self._notice_lock:
                if result.get("environment_recreated"):
                    self._restore_notice = True  # Hermes' own flag, on whichever command it landed
                if foreground and self._restore_notice:
                    result["environment_recreated"] = True
                    self._restore_notice = False
        return result

    def _run_bash(self, cmd_string: str, *, login: bool = False, timeout: int = 120, stdin_data: str | None = None):
        seconds = min(MAX_SERVER_TIMEOUT, max(1, int(timeout or self.timeout or 120)) + SERVER_TIMEOUT_GRACE)
        if self._closed:
            # Released (cleanup ran): nothing runs, since any request that needs the container would boot the
            # workspace the plugin has just stopped or deleted. Answered at once as an infrastructure failure.
            return RemoteProcess(
                command=cmd_string,
                request_fields={},
                run_fn=self._refuse_released,
                cancel_fn=lambda _request_id: None,
            )
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
            code = getattr(proc, "error_code", None)
            if code in CREDENTIAL_CODES:
                error += self._credential_advice(code, "running a command needs exec (large stdin also files)")
            if getattr(self, "_initializing", False) and self._init_failure is None:
                self._init_failure = error
            self._degraded = True
            raise EnvironmentConnectionError(hermes_safe(error), retry_hint=self._hint(code))
        return result

    def fetch_file(self, remote_path: str, local_dest: Path, *, max_bytes: int) -> None:
        """Binary download through GET /files instead of base64 over exec (no 2M-character output limit)."""
        if self._closed:  # a download boots the container too
            raise FileFetchError(RELEASED_MESSAGE.format(fate=self._released_as))
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
            advice = (
                self._credential_advice(exc.code, "reading a file needs files") if exc.code in CREDENTIAL_CODES else ""
            )
            raise FileFetchError(f"could not read {remote_path!r} in the sandbox ({exc.code}){advice}") from None
        except (TransportError, OSError) as exc:
            raise FileFetchError(f"transfer of {remote_path!r} failed: {exc}") from None

    def cleanup(self, *, force_remove: bool = False) -> None:
        """Idempotent and never raises (Hermes calls it from __del__ too). Persistent → stop (snapshot, then stop);
        ephemeral or force_remove → delete. The call runs on a daemon thread so Hermes is not held up by a large
        snapshot; if Hermes exits first, the server's idle timer still saves the workspace (nothing is lost)."""
        try:
            client = self._client
            if force_remove or not self._persistent:
                action = client.delete_workspace
            elif self._degraded:
                action = None  # the connection failed: leave the workspace to its idle timer, kill nothing
            else:
                action = client.stop
            with self._cleanup_lock:
                if self._closed:
                    return
                self._released_as = RELEASED_AS.get(getattr(action, "__name__", None), "released")
                self._closed = True  # from here on nothing runs (_run_bash, fetch_file)
            threading.Thread(target=self._finish, args=(action,), name="flarebox-cleanup", daemon=True).start()
        except Exception:
            logger.debug("flarebox cleanup failed", exc_info=True)

    # --- helpers ---------------------------------------------------------------------------------------------

    def _finish(self, action) -> None:
        try:
            if action is not None:
                action(self.namespace, self.workspace)
        except ApiError as exc:
            if exc.code == "forbidden":
                # a scoped key without the scope: the server's idle timer still saves (or ends) the workspace
                scope = SCOPE_OF.get(getattr(action, "__name__", ""), "manage")
                logger.info(
                    "Flarebox cleanup of %s: forbidden (HERMES_CF_TOKEN lacks the %s scope)", self.workspace, scope
                )
            elif exc.code not in ("workspace_not_found", "not_found"):
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

    def _hint(self, code: str | None = None) -> str:
        if code in CREDENTIAL_CODES:
            return CREDENTIAL_HINT
        if code == RELEASED_CODE:
            return RELEASED_HINT
        return RETRY_HINT.format(endpoint=self._settings.endpoint)

    def _key_id(self) -> str | None:
        return key_id_of(self._settings.token)

    def _credential_advice(self, code: str, need: str) -> str:
        key_id = self._key_id()
        if key_id is None:
            if code == "unauthorized":
                return " (HERMES_CF_TOKEN is neither this server's token nor one of its scoped keys)"
            return ""
        if code == "unauthorized":
            return (
                f" (HERMES_CF_TOKEN is the scoped key {key_id}: revoked, expired, or not this server's; mint a new one)"
            )
        return f" (HERMES_CF_TOKEN is the scoped key {key_id}, without the scope this needs: {need})"

    def _open_workspace(self, config: dict) -> dict:
        """PUT the workspace's config (create it, or confirm it). A scoped key without `manage` may not PUT, but
        every key on a workspace may read it: then an existing workspace with this config is used as it is, and a
        missing one is refused with a message naming the missing scope. Raises ApiError with a message that says
        what to do."""
        ns, ws = self.namespace, self.workspace
        try:
            return self._client.put_workspace(ns, ws, config)
        except ApiError as exc:
            if exc.code == "unauthorized":
                raise ApiError(exc.status, exc.code, exc.message + self._credential_advice(exc.code, "")) from None
            if exc.code != "forbidden":
                raise
            put_refused = exc
        try:
            status = self._client.get_workspace(ns, ws)
        except ApiError as exc:
            key = f"scoped key {self._key_id()}" if self._key_id() else "credential"
            if exc.code == "workspace_not_found":
                raise ApiError(
                    put_refused.status,
                    "forbidden",
                    f"workspace {ns}/{ws} does not exist, and HERMES_CF_TOKEN (a {key}) lacks the manage scope "
                    "that creating it needs: create it with the deployment token (`flarebox exec -n "
                    f"{ns} {ws} -- true`), or use a key with the manage scope",
                ) from None
            if exc.code == "forbidden":
                raise ApiError(
                    exc.status,
                    "forbidden",
                    f"HERMES_CF_TOKEN (a {key}) does not open workspace {ns}/{ws}: set HERMES_CF_NAMESPACE (and "
                    "HERMES_CF_WORKSPACE, for a key on one workspace) to what the key opens, or use a key for this "
                    "workspace with the exec and files scopes",
                ) from None
            raise
        existing = status.get("config") if isinstance(status, dict) else None
        differs = sorted(k for k, v in config.items() if not isinstance(existing, dict) or existing.get(k) != v)
        if differs:
            raise ApiError(
                409, "config_conflict", f"the workspace exists with another {', '.join(differs)}: {existing}"
            )
        logger.info("Flarebox workspace %s/%s: using it as it is (the key may not configure it)", ns, ws)
        return status

    def _stream(self, request: dict, offset: int | None):
        if offset is None:
            return self._client.exec(self.namespace, self.workspace, request)
        return self._client.reattach(self.namespace, self.workspace, request["request_id"], offset)

    def _refuse_released(self, request: dict, offset: int | None):
        yield {"type": "error", "code": RELEASED_CODE, "message": RELEASED_MESSAGE.format(fate=self._released_as)}

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
            with self._notice_lock:
                self._restore_notice = True  # until a terminal result carries it (execute)
            mark = getattr(self, "_mark_recreated", None)
            if mark is not None:
                mark()


def _background_spawn_cwd(command: str) -> str | None:
    """The cwd Hermes' process registry meant for this background spawn, or None when the command is not one.

    spawn_via_env(env, command, cwd, …) records `cwd` (the tool call's workdir, resolved) on its session but calls
    env.execute() without it, so the job would run wherever the previous command left the shell. Hermes offers no
    other way to see it: it is read from the caller's frame, and only for a command of exactly that wrapper's
    shape; anything else (another Hermes, another caller) leaves the command as Hermes made it."""
    if not all(mark in command for mark in BACKGROUND_SPAWN_MARKS):
        return None
    frame = sys._getframe(1)
    for _ in range(4):  # execute() ← spawn_via_env(), allowing for a wrapper or two in between
        frame = frame.f_back
        if frame is None:
            return None
        if frame.f_code.co_name == "spawn_via_env" and frame.f_globals.get("__name__", "").startswith("tools."):
            cwd = frame.f_locals.get("cwd")
            return posixpath.normpath(cwd) if isinstance(cwd, str) and cwd.startswith("/") else None
    return None
