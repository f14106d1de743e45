"""One command: spawn `bash -c` in its own session, feed stdin, enforce timeout/cancel/output limit, report the end.

Lifecycle: running (bash alive) → draining (bash exited; relay background output until DRAIN_IDLE_SECONDS of
silence, DRAIN_MAX_SECONDS at most) → finished (terminal event in the journal). A normal exit never signals the
group: background jobs keep running and their pipe keeps being read (see output.py).
"""

import asyncio
import errno
import os
import signal
import subprocess
import time

from flarebox_supervisor.groups import group_alive, signal_group
from flarebox_supervisor.identity import Identity
from flarebox_supervisor.journal import Journal
from flarebox_supervisor.output import OutputPipe, make_pipe
from flarebox_supervisor.settings import Settings
from flarebox_supervisor.stdin import StdinFeeder
from protocol import limits
from protocol.errors import ProtocolError
from protocol.events import error_event, exit_event
from protocol.validate import ExecRequest

_GROUP_POLL_SECONDS = 0.05


class Command:
    def __init__(self, request: ExecRequest, cwd: str, settings: Settings, identity: Identity):
        self.request = request
        self.cwd = cwd
        self.settings = settings
        self.identity = identity
        self.journal = Journal(settings.max_output_chars)
        self.state = "running"
        self._stop_reason: str | None = None  # "timeout" | "cancelled" | "output_limit"
        self._stop = asyncio.Event()
        self._exited = asyncio.Event()
        self._task: asyncio.Task | None = None

    # -- start ---------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the process (raising ProtocolError exec_failed before any streaming) and run it in a task."""
        req = self.request
        env = self.identity.base_env()
        env.update(req.env)
        argv, as_user = self.identity.spawn(["/bin/bash", "-lc" if req.login else "-c", req.command])
        read_fd, write_fd = make_pipe()
        try:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if req.stdin is not None else subprocess.DEVNULL,
                stdout=write_fd,
                stderr=write_fd,
                cwd=self.cwd,
                env=env,
                start_new_session=True,
                close_fds=True,
                **as_user,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            os.close(read_fd)
            if isinstance(exc, OSError) and exc.errno == errno.EAGAIN:
                # fork/clone refused: the sandbox's pids limit (or RLIMIT_NPROC) is full; retrying as is fails again
                raise ProtocolError("process_limit") from None
            reason = getattr(exc, "strerror", None) or type(exc).__name__
            raise ProtocolError("exec_failed", f"the command could not be started: {reason}") from None
        finally:
            os.close(write_fd)
        self.started_at = time.monotonic()
        self.started_wall = time.time()  # for listings (GET /processes); started_at measures durations
        self.pgid = self.process.pid  # start_new_session: the child leads its own group
        self.pipe = OutputPipe(read_fd, self.journal, self._output_limit)
        self._stdin = StdinFeeder(self.process.stdin, req.stdin) if req.stdin is not None else None
        self._watch_exit()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def _watch_exit(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            pidfd = os.pidfd_open(self.process.pid)
        except (AttributeError, OSError):
            # no pidfd (old kernel): a thread waits instead
            def wait() -> None:
                self.process.wait()
                loop.call_soon_threadsafe(self._exited.set)

            loop.run_in_executor(None, wait)
            return

        def on_exit() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            self.process.wait()
            self._exited.set()

        loop.add_reader(pidfd, on_exit)

    # -- control -------------------------------------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """The command's own process (bash) has not exited yet."""
        return not self._exited.is_set()

    def cancel(self) -> str:
        if self.state != "running" or not self.alive:
            return "finished"
        if self._stop_reason is None:
            self._stop_reason = "cancelled"
            self._stop.set()
        return "cancelled"

    def _output_limit(self) -> None:
        if self.journal.terminal is not None:
            return  # the stream has ended: background output past the limit is discarded
        self._stop_reason = "output_limit"
        signal_group(self.pgid, signal.SIGKILL)
        self._stop.set()

    def kill(self) -> None:
        """Supervisor shutdown: end everything this command started, background jobs included."""
        signal_group(self.pgid, signal.SIGKILL)

    # -- the run -------------------------------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._wait_exit_or_stop()
            exited_at = time.monotonic()
            self.state = "draining"
            if self._stop_reason != "output_limit":
                await self._drain()
            self.journal.finish(self._terminal_event(exited_at))
        except Exception as exc:  # never leave a stream without its terminal event
            signal_group(self.pgid, signal.SIGKILL)
            self.journal.finish(error_event("internal_error", f"supervisor failure: {type(exc).__name__}"))
            raise
        finally:
            self.state = "finished"
            if self._stdin is not None:
                self._stdin.close()

    async def _wait_exit_or_stop(self) -> None:
        deadline = self.started_at + self.request.timeout
        exited = asyncio.ensure_future(self._exited.wait())
        stopped = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait(
                {exited, stopped}, timeout=max(0.0, deadline - time.monotonic()), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stopped.cancel()
        if self._exited.is_set():
            exited.cancel()
            return
        if self._stop_reason is None:
            self._stop_reason = "timeout"
        if self._stop_reason != "output_limit":
            await self._terminate()
        await exited

    async def _terminate(self) -> None:
        """SIGTERM to the group; SIGKILL after the grace period, or at once when the output limit is hit."""
        signal_group(self.pgid, signal.SIGTERM)
        grace_end = time.monotonic() + self.settings.kill_grace_seconds
        while time.monotonic() < grace_end and self._stop_reason != "output_limit":
            if self._exited.is_set() and not group_alive(self.pgid):
                return
            await asyncio.sleep(_GROUP_POLL_SECONDS)
        signal_group(self.pgid, signal.SIGKILL)

    async def _drain(self) -> None:
        start = time.monotonic()
        pipe = self.pipe
        while not pipe.eof.is_set() and self._stop_reason != "output_limit":
            now = time.monotonic()
            idle_left = max(pipe.last_read, start) + self.settings.drain_idle_seconds - now
            total_left = start + self.settings.drain_max_seconds - now
            wait_for = min(idle_left, total_left)
            if wait_for <= 0:
                return
            eof = asyncio.ensure_future(pipe.eof.wait())
            stopped = asyncio.ensure_future(self._stop.wait())
            await asyncio.wait({eof, stopped}, timeout=wait_for, return_when=asyncio.FIRST_COMPLETED)
            eof.cancel()
            stopped.cancel()

    def _terminal_event(self, exited_at: float) -> dict:
        reason = self._stop_reason
        if reason == "output_limit":
            return error_event("output_limit")
        duration_ms = int((exited_at - self.started_at) * 1000)
        if reason == "timeout":
            return exit_event(limits.TIMEOUT_EXIT_CODE, "timeout", duration_ms)
        if reason == "cancelled":
            return exit_event(limits.CANCELLED_EXIT_CODE, "cancelled", duration_ms)
        code = self.process.returncode
        if code < 0:
            return exit_event(128 - code, "signal", duration_ms)
        return exit_event(code, "exited", duration_ms)
