"""GET /pty: interactive terminal sessions over a WebSocket.

A session is a login shell on a pseudo-terminal of its own, run as the sandbox user. It outlives its WebSocket: a
client that goes away only detaches; the supervisor keeps reading the pty (so a program never blocks on a full pty
buffer) into a bounded scrollback, and a client that comes back with `session=ID` gets that scrollback, then live
output. A session has at most one client (the newest wins) and ends when its shell exits, or after
PTY_LINGER_SECONDS without a client (SIGHUP, then SIGKILL), or when the supervisor shuts down.

Binary frames carry terminal bytes both ways, untouched; text frames are control (protocol/pty.py): the client's
`resize`, the server's `session`, `detached`, `exit` and `error`. FLAREBOX_PTY_LINGER_SECONDS (settings.py) may
lower the linger (tests).
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import shutil
import signal
import struct
import subprocess
import termios
import time
from typing import TYPE_CHECKING

from flarebox_supervisor.groups import signal_group
from flarebox_supervisor.httpio import no_query
from flarebox_supervisor.httpserver import Application, Request, StreamResponse
from flarebox_supervisor.identity import Identity
from flarebox_supervisor.settings import Settings
from protocol import limits
from protocol.errors import ProtocolError
from protocol.pty import parse_control_frame, parse_pty_query

if TYPE_CHECKING:
    from flarebox_supervisor.websocket import WebSocket

_QUERY = frozenset({"cols", "rows", "session", "offset"})
_READ_SIZE = 64 * 1024
# After the shell exits, background jobs may still hold the pty: relay their output until it is quiet this long (or
# at most _DRAIN_MAX_SECONDS), then end the session. Without such jobs the pty reports EIO at once.
_DRAIN_IDLE_SECONDS = 0.2
_DRAIN_MAX_SECONDS = 2.0
_CLOSE_SECONDS = 5.0  # a client that does not take its last frame and close in this time is cut off
# At shutdown the supervisor is about to close every connection: the close is sent and not waited for long.
_SHUTDOWN_CLOSE_SECONDS = 0.5
_SETSID = shutil.which("setsid", path="/usr/bin:/bin")
# setsid --ctty: the shell leads a new session with the pty (its stdin) as controlling terminal, so job control and
# Ctrl-C work; util-linux does what a preexec_fn would, which the threaded supervisor must not use.
_SHELL = ["/bin/bash", "--login", "-i"]
_DETACHED = {"type": "detached", "reason": "another client resumed this session"}


def _set_size(fd: int, cols: int, rows: int) -> None:
    # the kernel sends SIGWINCH to the terminal's foreground process group when the size changes
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _exit_code(returncode: int | None) -> int | None:
    if returncode is None:
        return None
    return 128 - returncode if returncode < 0 else returncode


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)


async def _spawn(identity: Identity, workdir: str, cols: int, rows: int) -> tuple[asyncio.subprocess.Process, int]:
    """A login shell on a new pty of `cols` × `rows`; returns it with the pty's (non-blocking) master side."""
    if _SETSID is None:
        raise ProtocolError("exec_failed", "setsid (util-linux) is not installed")
    master, slave = os.openpty()
    try:
        _set_size(master, cols, rows)
        if identity.drop:
            os.fchown(slave, identity.uid, -1)  # as login does: the user's programs may open their tty by name
        argv, as_user = identity.spawn([_SETSID, "--ctty", *_SHELL])
        env = identity.base_env() | {"TERM": "xterm-256color", "COLORTERM": "truecolor"}
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=workdir,
            env=env,
            close_fds=True,
            **as_user,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        os.close(master)
        if isinstance(exc, OSError) and exc.errno == errno.EAGAIN:
            raise ProtocolError("process_limit") from None  # the sandbox's pids limit is full
        reason = getattr(exc, "strerror", None) or type(exc).__name__
        raise ProtocolError("exec_failed", f"the shell could not be started: {reason}") from None
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)  # the shell holds it now; once every holder is gone the master reads EIO
    os.set_blocking(master, False)
    return process, master


class Session:
    """One shell on its pty: reads its output for the attached client (or none), writes the client's input."""

    def __init__(self, process, fd: int, cols: int, rows: int, grace: float, linger: float, on_end):
        self.id = os.urandom(16).hex()
        self.pid = process.pid  # setsid exec'd without forking: the shell, its session and its process group
        self.created = time.time()
        self.cols, self.rows = cols, rows
        self.ended = False
        self._process = process
        self._fd = fd
        self._grace = grace
        self._linger_seconds = linger
        self._on_end = on_end
        self._loop = asyncio.get_running_loop()
        self._scrollback = bytearray()
        self._total = 0  # bytes of output so far: the scrollback is its last len(_scrollback)
        self._ws: WebSocket | None = None  # the client, if any...
        self._farewell: asyncio.Future | None = None  # ...and how its handler learns to close it (with which frame)
        self._send_lock = asyncio.Lock()  # output, scrollback and the client change together, in order
        self._input_lock = asyncio.Lock()
        self._waiters: set[asyncio.Future] = set()
        self._exited_at: float | None = None
        self._last_output = time.monotonic()
        self._linger: asyncio.TimerHandle | None = None
        self._hang_up_task: asyncio.Task | None = None
        self._exit = asyncio.ensure_future(process.wait())
        self._exit.add_done_callback(self._on_exit)
        self._task = self._loop.create_task(self._run())
        self._start_linger()  # until a client attaches

    @property
    def attached(self) -> bool:
        return self._ws is not None

    def describe(self) -> dict:
        return {
            "session": self.id,
            "pid": self.pid,
            "created": self.created,
            "attached": self.attached,
            "cols": self.cols,
            "rows": self.rows,
        }

    # -- clients ---------------------------------------------------------------------------------------------------

    async def attach(
        self,
        ws: WebSocket,
        farewell: asyncio.Future,
        resumed: bool,
        size: tuple[int, int] | None,
        offset: int | None = None,
    ) -> bool:
        """Make `ws` the session's client, detaching any other; False if the session ended meanwhile. The session
        ends a client by setting its `farewell` to the last frame it gets (its handler then closes it). The replay
        starts at `offset` (what the client already has) or at the scrollback's start, whichever is later."""
        self._dismiss()  # before the lock too: the output pump may hold it, waiting on that client's send
        async with self._send_lock:
            if self.ended:
                return False
            self._dismiss()  # another resume attached while this one waited
            if size is not None:
                self._resize(*size)
            self._ws, self._farewell = ws, farewell
            self._cancel_linger()
            kept_from = self._total - len(self._scrollback)
            since = kept_from if offset is None else min(max(offset, kept_from), self._total)
            frame = {"type": "session", "session": self.id, "resumed": resumed, "cols": self.cols, "rows": self.rows}
            await ws.send_json({**frame, "offset": since})
            # a new session's first prompt may already be here: it is sent the same way as a resumed one's history
            if since < self._total:
                await ws.send_bytes(bytes(self._scrollback[since - kept_from :]))
        return True

    def detach(self, ws: WebSocket) -> None:
        """`ws` went away (a no-op if it was already replaced); the linger starts once no client is left."""
        if self._ws is ws:
            self._ws = self._farewell = None
        if self._ws is None and not self.ended:
            self._start_linger()

    def is_client(self, ws: WebSocket) -> bool:
        return self._ws is ws and not self.ended

    def _dismiss(self, frame: dict | None = _DETACHED) -> None:
        """Let go of the client (if any): its handler sends it `frame` and closes it."""
        if self._farewell is not None and not self._farewell.done():
            self._farewell.set_result(frame)
        self._ws = self._farewell = None

    # -- input -----------------------------------------------------------------------------------------------------

    async def write(self, ws: WebSocket, data: bytes) -> None:
        """The client's keystrokes to the pty; waits (on the loop) while the pty takes no more."""
        async with self._input_lock:
            view = memoryview(data)
            while view and self.is_client(ws):
                try:
                    view = view[os.write(self._fd, view) :]
                except BlockingIOError:
                    await self._wait(self._loop.add_writer, self._loop.remove_writer)
                except OSError:
                    return  # EIO: the shell has gone

    def resize(self, ws: WebSocket, cols: int, rows: int) -> None:
        if self.is_client(ws):
            self._resize(cols, rows)

    def _resize(self, cols: int, rows: int) -> None:
        if not self.ended:
            _set_size(self._fd, cols, rows)
            self.cols, self.rows = cols, rows

    # -- output ----------------------------------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            while (data := await self._read()) is not None:
                await self._output(data)
            if not self._exit.done():
                await self.hang_up()  # the shell closed its terminal: nothing could reach it any more
            await self._exit
        finally:
            await self._finish()

    async def _read(self) -> bytes | None:
        """The pty's next output; None at its end (EIO: nothing holds the terminal; or quiet after the shell exit)."""
        while True:
            try:
                data = os.read(self._fd, _READ_SIZE)
            except BlockingIOError:
                data = None
            except OSError:
                return None
            if data:
                self._last_output = time.monotonic()
                return data
            if data == b"":
                return None
            timeout = self._drain_left()
            if timeout is not None and timeout <= 0:
                return None
            await self._wait(self._loop.add_reader, self._loop.remove_reader, timeout)

    def _drain_left(self) -> float | None:
        if self._exited_at is None:
            return None
        now = time.monotonic()
        idle_end = max(self._last_output, self._exited_at) + _DRAIN_IDLE_SECONDS
        return min(idle_end, self._exited_at + _DRAIN_MAX_SECONDS) - now

    async def _output(self, data: bytes) -> None:
        async with self._send_lock:
            self._scrollback += data
            self._total += len(data)
            if len(self._scrollback) > limits.PTY_SCROLLBACK_BYTES:
                del self._scrollback[: -limits.PTY_SCROLLBACK_BYTES]
            ws = self._ws
            if ws is not None:
                try:
                    await ws.send_bytes(data)  # awaited: a slow client slows the reads (backpressure)
                except ConnectionError:
                    self.detach(ws)

    async def _wait(self, add, remove, timeout: float | None = None) -> None:
        """Until the pty is readable/writable (add/remove: the loop's reader or writer calls), the shell exits, or
        `timeout` passes."""
        waiter = self._loop.create_future()
        self._waiters.add(waiter)
        add(self._fd, _wake, waiter)
        try:
            async with asyncio.timeout(timeout):
                await waiter
        except TimeoutError:
            pass
        finally:
            self._waiters.discard(waiter)
            if self._fd >= 0:  # once closed, the number may be someone else's: _close_pty removed ours
                remove(self._fd)

    # -- the end ---------------------------------------------------------------------------------------------------

    def _on_exit(self, _future) -> None:
        self._exited_at = time.monotonic()
        for waiter in list(self._waiters):
            _wake(waiter)  # the pump now drains with a deadline instead of waiting for output forever

    async def hang_up(self) -> None:
        """SIGHUP to the shell's process group, as a terminal hangup; SIGKILL if the shell outlives the grace."""
        if self._exit.done():
            return
        signal_group(self.pid, signal.SIGHUP)  # an interactive bash passes it on to its jobs
        try:
            async with asyncio.timeout(self._grace):
                await asyncio.shield(self._exit)
        except TimeoutError:
            signal_group(self.pid, signal.SIGKILL)

    async def end(self) -> None:
        """Supervisor shutdown: hang up and wait until the session is over (its client told to close)."""
        await self.hang_up()
        # the pump may still wait on a client that takes no output: then it is stopped, and ends the session itself
        finished, _ = await asyncio.wait({self._task}, timeout=_DRAIN_MAX_SECONDS + _CLOSE_SECONDS)
        if not finished:
            self._task.cancel()
            await asyncio.wait({self._task})

    def _start_linger(self) -> None:
        self._cancel_linger()
        self._linger = self._loop.call_later(self._linger_seconds, self._linger_expired)

    def _cancel_linger(self) -> None:
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None

    def _linger_expired(self) -> None:
        self._linger = None
        if self._ws is None and not self.ended and self._hang_up_task is None:
            self._hang_up_task = self._loop.create_task(self.hang_up())

    def _close_pty(self) -> None:
        if self._fd < 0:
            return
        self._loop.remove_reader(self._fd)
        self._loop.remove_writer(self._fd)
        os.close(self._fd)
        self._fd = -1
        for waiter in list(self._waiters):
            _wake(waiter)

    async def _finish(self) -> None:
        self.ended = True
        self._cancel_linger()
        self._on_end(self)  # forgotten first: a resume from now on is session_not_found
        if not self._exit.done():
            signal_group(self.pid, signal.SIGKILL)  # only after a failure of the pump: never leave a shell behind
        self._close_pty()
        code = _exit_code(self._process.returncode)
        async with self._send_lock:  # after whatever an attach is sending
            self._dismiss({"type": "exit", "exit_code": code} if code is not None else None)


async def _last_words(ws: WebSocket, transport, frame: dict | None, seconds: float) -> None:
    """Send a client its last text frame and close it (1000); one that does not take them in time is cut off."""

    async def say_and_close() -> None:
        if frame is not None:
            await ws.send_json(frame)
        await ws.close(code=1000)

    try:
        async with asyncio.timeout(seconds):
            await say_and_close()
    except (ConnectionError, TimeoutError):
        if transport is not None:
            transport.abort()


class Terminals:
    """The supervisor's live sessions. count() and sessions() are the read-only view for listings and health."""

    def __init__(self, identity: Identity, settings: Settings, linger_seconds: float):
        self._identity = identity
        self._settings = settings
        self._linger = linger_seconds
        self._sessions: dict[str, Session] = {}
        self._starting = 0  # shells being spawned count against the limit too
        self.shutting_down = False

    def count(self) -> int:
        return len(self._sessions)

    def sessions(self) -> list[dict]:
        """session (id), pid (the shell's, also its session and process group id), created (Unix time), attached,
        cols, rows."""
        return [session.describe() for session in self._sessions.values()]

    def get(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    async def open(self, cols: int, rows: int) -> Session:
        if len(self._sessions) + self._starting >= limits.MAX_PTY_SESSIONS:
            raise ProtocolError("too_many_sessions")
        self._starting += 1
        try:
            process, fd = await _spawn(self._identity, self._settings.workdir, cols, rows)
        finally:
            self._starting -= 1
        session = Session(process, fd, cols, rows, self._settings.kill_grace_seconds, self._linger, self._forget)
        self._sessions[session.id] = session
        return session

    def _forget(self, session: Session) -> None:
        self._sessions.pop(session.id, None)

    async def end_all(self) -> None:
        self.shutting_down = True
        await asyncio.gather(*(session.end() for session in list(self._sessions.values())))


# -- the route ---------------------------------------------------------------------------------------------------------


def _requested_size(request: Request, cols: int, rows: int, session: Session) -> tuple[int, int] | None:
    """A resume's new size: what the query gives, the session's own for what it leaves out; None for neither."""
    if "cols" not in request.query and "rows" not in request.query:
        return None
    return (cols if "cols" in request.query else session.cols, rows if "rows" in request.query else session.rows)


async def _relay_input(ws: WebSocket, session: Session) -> None:
    """The client's frames to the session until it closes (a task of its own: the session may end it first)."""
    try:
        while (message := await ws.receive()) is not None:  # None: closed (a protocol error closes it too)
            if message.binary:
                await session.write(ws, message.data)
            else:
                try:
                    session.resize(ws, *parse_control_frame(message.data))
                except ProtocolError as exc:
                    await ws.send_json(_error_frame(exc))
    except ConnectionError:
        pass  # the client went away: it only detaches


async def _serve(ws: WebSocket, session: Session, resumed: bool, size, offset: int | None = None) -> asyncio.Future:
    """Attach and relay until the client closes or the session lets go of it; the farewell (maybe still unset)."""
    farewell = asyncio.get_running_loop().create_future()
    if not await session.attach(ws, farewell, resumed, size, offset):
        farewell.set_result(_error_frame(ProtocolError("session_not_found")))
        return farewell
    relay = asyncio.ensure_future(_relay_input(ws, session))
    try:
        await asyncio.wait({relay, farewell}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        relay.cancel()
        # awaited before any close: the close handshake's answer must not be taken for input
        await asyncio.wait({relay})
    if not relay.cancelled():
        relay.result()  # re-raises a failure of the relay
    return farewell


def _error_frame(error: ProtocolError) -> dict:
    return {"type": "error", "code": error.code, "message": error.message}


async def open_pty(request: Request) -> StreamResponse:
    no_query(request, _QUERY)
    query = parse_pty_query(dict(request.query))
    from flarebox_supervisor.websocket import WebSocket  # websockets: loaded by the first terminal only

    ws = WebSocket(request, _CLOSE_SECONDS)
    if not ws.ok():
        raise ProtocolError("websocket_required")
    terminals: Terminals = terminals_of(request.app)
    if query.session is None:
        session, size = await terminals.open(query.cols, query.rows), None
    else:
        session = terminals.get(query.session)
        if session is None:
            raise ProtocolError("session_not_found")
        size = _requested_size(request, query.cols, query.rows, session)
    await ws.prepare()  # from here on a failure is a frame, no longer an HTTP answer
    try:
        farewell = await _serve(ws, session, query.session is not None, size, query.offset)
    except ConnectionError:
        return ws  # the client went away while attaching: it only detaches
    finally:
        session.detach(ws)
    if farewell.done():
        seconds = _SHUTDOWN_CLOSE_SECONDS if terminals.shutting_down else _CLOSE_SECONDS
        await _last_words(ws, request.transport, farewell.result(), seconds)
    return ws


def terminals_of(app: Application) -> Terminals:
    """The workspace's terminal sessions, made by the first terminal (this module loads then, not at the
    supervisor's start), with the shutdown hook that ends them."""
    terminals = app.get("terminals")
    if terminals is None:
        settings = app["settings"]
        terminals = app["terminals"] = Terminals(app["identity"], settings, settings.pty_linger_seconds)

        async def end_sessions(app: Application) -> None:
            await terminals.end_all()

        app.on_shutdown.append(end_sessions)
    return terminals
