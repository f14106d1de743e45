"""The process handle Hermes waits on: one remote command, streamed into a real pipe by a reader thread.

Hermes' drain thread select()s on `stdout.fileno()`, and stops ~300 ms after poll() turns non-None; so the reader
writes all output into the pipe first, closes the write end, and only then publishes the return code.
There is deliberately NO `pid` attribute: Hermes' backstop would kill a HOST process with that number.
"""

from __future__ import annotations

import contextvars
import logging
import os
import select
import shlex
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from .client import ApiError, FlareboxError, TransportError

logger = logging.getLogger(__name__)

CANCELLED_EXIT_CODE = 130
# Terminal error codes that are infrastructure failures saying nothing about the command: execute() raises
# EnvironmentConnectionError. (command_cancelled and output_limit are the command's own outcomes.)
INFRA_ERROR_CODES = frozenset(
    {
        "workspace_lost",
        "snapshot_damaged",
        "startup_timeout",
        "container_unavailable",
        "container_exited",
        "storage_full",
        "exec_failed",
        "internal_error",
        "invalid_cwd",
        "workspace_not_found",
        "not_configured",
        "unauthorized",
    }
)
# Codes of error events the plugin makes itself (never the server's): their message is the whole story, as it is.
LOCAL_ERROR_CODES = frozenset({"environment_released"})
REATTACH_ATTEMPTS = 4  # consecutive failures without progress before the outcome is declared unknown
BUSY_RETRY_SECONDS = 60  # workspace_busy: the workspace is saving or stopping; it answers again soon
KILLED_WRITE_GRACE = 5.0  # after kill(), stop feeding a pipe nobody reads any more


class RemoteProcess:
    """A ProcessHandle for one command in a Flarebox workspace.

    `run_fn(request, offset)` yields events: offset None → start the command, an int → reattach from there.
    `request_fields` (timeout, login, cwd, env) go into the exec request as they are.
    `cancel_fn(request_id)` cancels remotely. `stage_fn(data) -> path` uploads oversized stdin and returns the path.
    `on_started(event)` sees the `started` event (container continuing / fresh / restored / restarted).
    """

    def __init__(
        self,
        *,
        command: str,
        request_fields: dict,
        run_fn: Callable,
        cancel_fn: Callable[[str], None],
        stage_fn: Callable[[bytes], str] | None = None,
        stdin: str | None = None,
        on_started: Callable[[dict], None] | None = None,
        inline_stdin_limit: int = 512 * 1024,
    ):
        self.request_id = uuid.uuid4().hex
        self.error: str | None = None  # set when the outcome is unknown or the infrastructure failed
        self.error_code: str | None = None
        self._command = command
        self._request_fields = request_fields
        self._run_fn = run_fn
        self._cancel_fn = cancel_fn
        self._stage_fn = stage_fn
        self._stdin = stdin
        self._on_started = on_started
        self._inline_stdin_limit = inline_stdin_limit
        self._returncode: int | None = None
        self._done = threading.Event()
        self._kill_lock = threading.Lock()
        self._killed_at: float | None = None
        read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._write_fd, False)
        self._stdout = os.fdopen(read_fd, "rb", buffering=0)
        # Keep Hermes' context (secret scope, session id) in the reader thread.
        ctx = contextvars.copy_context()
        threading.Thread(target=ctx.run, args=(self._reader,), name="flarebox-exec", daemon=True).start()

    # --- ProcessHandle -------------------------------------------------------------------------------------

    @property
    def stdout(self):
        return self._stdout

    @property
    def returncode(self) -> int | None:
        return self._returncode if self._done.is_set() else None

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        self._done.wait(timeout)
        return self.returncode

    def kill(self) -> None:
        """Cancel remotely, once, without blocking the caller (Hermes calls this on interrupt and timeout)."""
        with self._kill_lock:
            if self._killed_at is not None or self._done.is_set():
                return
            self._killed_at = time.monotonic()
        threading.Thread(target=self._cancel_quietly, name="flarebox-cancel", daemon=True).start()

    def _cancel_quietly(self) -> None:
        try:
            self._cancel_fn(self.request_id)
        except Exception as exc:  # the stream's own end tells the outcome; a failed cancel is only logged
            logger.info("cancel of a Flarebox command failed: %s", type(exc).__name__)

    # --- reader thread ----------------------------------------------------------------------------------

    def _reader(self) -> None:
        code: int | None = None
        try:
            code = self._run()
        except Exception as exc:  # never let the thread die silently: record, and end the handle
            self._fail("internal", f"the Flarebox client failed: {type(exc).__name__}")
            logger.debug("flarebox reader failed", exc_info=True)
        finally:
            try:
                os.close(self._write_fd)
            except OSError:
                pass
            self._returncode = code if code is not None else 1
            self._done.set()

    def _fail(self, code: str, message: str) -> None:
        if self.error is None:
            self.error_code, self.error = code, message

    def _build_request(self) -> dict:
        command, stdin = self._command, self._stdin
        if stdin:
            data = stdin.encode("utf-8", "surrogateescape")
            # Text that is not valid UTF-8 (surrogateescape'd bytes from Hermes' file tools) cannot travel in a
            # JSON string, and large stdin does not fit the 1 MiB body: both go through PUT /files, and the
            # shell reads them back by redirection.
            if len(data) > self._inline_stdin_limit or not _is_strict_utf8(stdin):
                path = self._stage_fn(data)
                quoted = shlex.quote(path)
                command = f"exec 0< {quoted} || exit $?\nrm -f -- {quoted}\n{command}"
                stdin = None
        return {**self._request_fields, "request_id": self.request_id, "command": command, "stdin": stdin or None}

    def _run(self) -> int | None:
        attempts = _Attempts()
        busy_deadline = time.monotonic() + BUSY_RETRY_SECONDS
        while True:
            try:
                return self._attempt(attempts)
            except FlareboxError as exc:
                if isinstance(exc, TransportError):
                    attempts.failures += 1
                step = next_step(
                    Failure(
                        exc,
                        started=attempts.offset is not None,
                        sent=attempts.sent,
                        request_built=attempts.request is not None,
                        failures=attempts.failures,
                        killed=self._killed_at is not None,
                        busy_retry_left=time.monotonic() < busy_deadline,
                    )
                )
            if step.action == FINISH:
                return step.exit_code
            if step.action == GIVE_UP:
                self._fail(step.error_code, step.message)
                return None
            if step.action == RESEND:
                self.request_id = uuid.uuid4().hex
                attempts.request = None
            elif step.assume_started:
                attempts.offset = 0
            time.sleep(step.delay)

    def _attempt(self, attempts: _Attempts) -> int | None:
        """Send the command (or reattach to it from `attempts.offset`) once and follow its stream: the exit code,
        or None for an error event (recorded). Raises the client's errors, and TransportError for a stream that
        stops without a terminal event."""
        if attempts.request is None:
            attempts.request = self._build_request()
            attempts.sent = False
        if attempts.offset is None:
            attempts.sent = True  # from here on the server may have it: only reattach can tell
        for event in self._run_fn(attempts.request, attempts.offset):
            kind = event["type"]
            if attempts.offset is None and kind in ("started", "output", "exit", "error"):
                attempts.offset = 0
            if kind == "started" and self._on_started is not None:
                self._on_started(event)
            elif kind == "output":
                self._write(event["data"].encode("utf-8", "surrogateescape"))
                attempts.offset = event["offset"] + len(event["data"])
                attempts.failures = 0
            elif kind == "exit":
                return event["exit_code"]
            elif kind == "error":
                return self._on_error_event(event)
        # The client raises this itself when a stream ends early; other run_fns may just stop.
        raise TransportError("the stream ended before its terminal event", reason="the stream ended early")

    def _on_error_event(self, event: dict) -> int | None:
        code = event["code"]
        if code == "command_cancelled":
            return CANCELLED_EXIT_CODE
        if code == "output_limit":
            # A real outcome of the command, not an infrastructure failure: say so in the output.
            self._write(f"\n[Flarebox: {event.get('message') or 'output limit exceeded'} ({code})]\n".encode())
            return 1
        if code in LOCAL_ERROR_CODES:
            self._fail(code, event.get("message") or code)
            return None
        if code not in INFRA_ERROR_CODES:  # still an unknown outcome; a newer server may know more codes
            logger.info("Flarebox stream ended with an unexpected error code %s", code)
        self._fail(code, f"the Flarebox workspace failed: {code}: {event.get('message', '')}")
        return None

    def _write(self, data: bytes) -> None:
        """Write into the pipe; if Hermes stopped reading after a kill, drop the rest instead of hanging."""
        view = memoryview(data)
        while view:
            try:
                written = os.write(self._write_fd, view)
                view = view[written:]
                continue
            except BlockingIOError:
                pass
            except OSError:  # the read end was closed: nobody wants this output
                return
            if self._killed_at is not None and time.monotonic() - self._killed_at > KILLED_WRITE_GRACE:
                return
            select.select([], [self._write_fd], [], 0.2)


@dataclass
class _Attempts:
    """What the reader knows about one command across its attempts."""

    request: dict | None = None  # None until built, and again after a busy rejection (resent under a fresh id)
    offset: int | None = None  # None until the command is known to exist on the server
    sent: bool = False  # the server may have the command: only a reattach can tell
    failures: int = 0  # transport failures in a row without new output


@dataclass(frozen=True)
class Failure:
    """One failed attempt and what was known when it failed: the input of `next_step`."""

    error: FlareboxError
    started: bool  # an offset is known: reattaching, not sending
    sent: bool
    request_built: bool  # False: uploading stdin failed, so the command was never sent
    failures: int  # transport failures in a row, this one included
    killed: bool
    busy_retry_left: bool  # still within BUSY_RETRY_SECONDS of the first attempt


RESEND = "resend"  # send again under a fresh request id
REATTACH = "reattach"  # reattach by request id from the last offset
FINISH = "finish"  # the command's outcome is known: `exit_code`
GIVE_UP = "give_up"  # the outcome is unknown or the infrastructure failed: `error_code`, `message`


@dataclass(frozen=True)
class Step:
    action: str
    delay: float = 0.0  # before the next attempt
    exit_code: int | None = None
    error_code: str | None = None
    message: str | None = None
    assume_started: bool = False  # reattach from offset 0: maybe it started (request_not_found if not)


def next_step(failure: Failure) -> Step:
    """What a failed attempt means: send again, reattach, or end with an exit code or an error."""
    exc = failure.error
    if isinstance(exc, ApiError):
        busy = not failure.started and exc.code == "workspace_busy"
        if busy and failure.killed:
            return Step(FINISH, exit_code=CANCELLED_EXIT_CODE)  # killed while waiting: never send it again
        if busy and failure.busy_retry_left:
            return Step(RESEND, delay=0.5)  # rejected before anything ran: safe to send again
        if exc.code == "command_cancelled":
            return Step(FINISH, exit_code=CANCELLED_EXIT_CODE)
        return _give_up(exc.code, f"the Flarebox server refused the command: {exc.code}: {exc.message}")
    if isinstance(exc, TransportError):
        # The stream broke off: reattach by request id from the last offset, so the real outcome is reported
        # instead of a guess. A command that never reached the server answers 404.
        if not failure.started and not exc.connected:
            return _give_up("transport", f"cannot reach the Flarebox server: {exc.reason}; the command did not run")
        if failure.failures > REATTACH_ATTEMPTS:
            return _give_up("transport", f"lost the connection to the Flarebox server: {exc.reason}")
        if not failure.request_built:  # no upload is retried
            return _give_up("transport", f"could not upload stdin to the Flarebox server: {exc.reason}")
        delay = min(0.25 * 2**failure.failures, 2.0)
        return Step(REATTACH, delay=delay, assume_started=not failure.started and failure.sent)
    # ProtocolViolation: the server or a proxy broke the protocol
    return _give_up("protocol", f"the Flarebox server broke the protocol: {exc}")


def _give_up(code: str, message: str) -> Step:
    return Step(GIVE_UP, error_code=code, message=message)


def _is_strict_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False
