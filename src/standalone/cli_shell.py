"""`flarebox shell WS`: an interactive terminal in a workspace, like `ssh` or `docker exec -it`.

The local terminal goes into raw mode (every key, Ctrl-C included, goes to the remote shell) and is restored on every
way out: the remote shell's exit, an error, a signal. Window resizes are followed (SIGWINCH → a resize frame). The
remote shell's exit code becomes this command's. A dropped connection prints one clear line and resumes the same
session for up to RECONNECT_SECONDS, asking for the output from the byte offset this terminal has shown: what the
shell printed meanwhile comes, nothing twice.

The protocol is the PTY WebSocket (docs/protocol.md §6.30): binary frames are terminal bytes, text frames JSON
control. Progress while the workspace boots and flarebox's own lines go to stderr as `[flarebox] …`.
"""

import asyncio
import contextlib
import json
import os
import signal
import sys
import termios
import tty
from urllib.parse import urlencode

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from standalone.cli_support import ensure_workspace

ERROR_EXIT = 125  # as cli.ERROR_EXIT: flarebox itself failed
RECONNECT_SECONDS = 60
_BACKOFF = (0.25, 0.5, 1, 2, 4)
_MAX_FRAME = 1024 * 1024  # the largest frame the server sends (a resumed session's scrollback)
_STDIN_READ = 64 * 1024


class _Refused(Exception):
    """The server refused the session (an `error` frame or an HTTP answer): not worth a reconnect."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code


class _Terminal:
    """The local terminal: raw mode while the session runs, the saved settings back on every exit path."""

    def __init__(self) -> None:
        self.fd = sys.stdin.fileno()
        self.interactive = os.isatty(self.fd)
        self._saved = termios.tcgetattr(self.fd) if self.interactive else None

    def __enter__(self) -> "_Terminal":
        if self._saved is not None:
            tty.setraw(self.fd, termios.TCSANOW)
        return self

    def __exit__(self, *exc) -> None:
        if self._saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)

    @staticmethod
    def size() -> tuple[int, int]:
        try:
            cols, rows = os.get_terminal_size(sys.stdout.fileno())
            return max(cols, 1), max(rows, 1)
        except OSError:
            return 80, 24


def _notice(text: str) -> None:
    """A line of flarebox's own, readable in raw mode (which does not turn \\n into \\r\\n)."""
    sys.stderr.write(f"\r\n[flarebox] {text}\r\n")
    sys.stderr.flush()


def _write_out(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(sys.stdout.fileno(), view) :]


def _ws_url(endpoint: str, ns: str, ws: str, query: dict) -> str:
    base = "ws" + endpoint[len("http") :] if endpoint.startswith("http") else endpoint
    return f"{base}/v1/workspaces/{ns}/{ws}/pty?{urlencode(query)}"


def run(client, endpoint: str, token: str, args) -> int:
    ensure_workspace(client, args.namespace, args.workspace)
    with _Terminal() as term:
        try:
            return asyncio.run(_shell(endpoint, token, args.namespace, args.workspace, term))
        except _Refused as err:
            _notice(str(err))
            return ERROR_EXIT
        except KeyboardInterrupt:  # only outside raw mode (stdin no terminal)
            return 130


async def _shell(endpoint: str, token: str, ns: str, ws: str, term: _Terminal) -> int:
    session: dict = {}
    lost_at: float | None = None
    attempt = 0
    loop = asyncio.get_running_loop()
    while True:
        try:
            code = await _attach(endpoint, token, ns, ws, term, session)
            if code is not None:
                return code
        except InvalidStatus as refused:  # an HTTP answer instead of the upgrade (401, 404 session_not_found, …)
            raise _refusal(refused) from None
        except (TimeoutError, ConnectionClosed, OSError, WebSocketException) as exc:
            if "id" not in session:
                _notice(f"cannot open a terminal at {endpoint}: {exc.__class__.__name__}")
                return ERROR_EXIT
        # gone without an exit: resume the same session
        now = loop.time()
        if session.pop("connected", False) or lost_at is None:  # a working connection dropped: a new outage
            lost_at, attempt = now, 0
            _notice(f"connection lost; reconnecting to session {session['id']}…")
        elif now - lost_at > RECONNECT_SECONDS:
            _notice(f"could not reconnect for {RECONNECT_SECONDS} s; session {session['id']} may still be resumed")
            return ERROR_EXIT
        await asyncio.sleep(_BACKOFF[min(attempt, len(_BACKOFF) - 1)])
        attempt += 1


def _refusal(exc: InvalidStatus) -> _Refused:
    try:
        err = json.loads(exc.response.body or b"")["error"]
        return _Refused(err["code"], err["message"])
    except (ValueError, KeyError, TypeError):
        return _Refused("http_error", f"the server answered HTTP {exc.response.status_code}")


async def _attach(endpoint: str, token: str, ns: str, ws: str, term: _Terminal, session: dict) -> int | None:
    """One connection: returns the remote exit code, or None when the connection dropped without one."""
    cols, rows = term.size()
    query: dict = {"cols": cols, "rows": rows}
    if "id" in session:  # a resume: only what this terminal has not shown yet is replayed
        query.update(session=session["id"], offset=session["offset"])
    async with connect(
        _ws_url(endpoint, ns, ws, query),
        additional_headers={"Authorization": f"Bearer {token}"},
        subprotocols=["flarebox"],
        max_size=_MAX_FRAME,
        open_timeout=30,
        ping_interval=10,  # a dead connection is noticed within ~20 s, then resumed
        ping_timeout=10,
    ) as conn:
        loop = asyncio.get_running_loop()
        pending: asyncio.Queue[bytes | None] = asyncio.Queue()
        loop.add_reader(term.fd, _read_stdin, term.fd, pending, loop)
        if term.interactive:
            loop.add_signal_handler(signal.SIGWINCH, lambda: pending.put_nowait(b""))
        sender = asyncio.ensure_future(_send_input(conn, pending, term))
        try:
            return await _receive(conn, session)
        finally:
            loop.remove_reader(term.fd)
            if term.interactive:
                loop.remove_signal_handler(signal.SIGWINCH)
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                await sender


def _read_stdin(fd: int, pending: asyncio.Queue, loop) -> None:
    try:
        data = os.read(fd, _STDIN_READ)
    except OSError:
        data = b""
    if not data:  # EOF (a pipe): stop reading; the remote shell goes on until it exits
        loop.remove_reader(fd)
        return
    pending.put_nowait(data)


async def _send_input(conn, pending: asyncio.Queue, term: _Terminal) -> None:
    while True:
        data = await pending.get()
        if data == b"":  # a resize
            cols, rows = term.size()
            await conn.send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))
        else:
            await conn.send(data)


async def _receive(conn, session: dict) -> int | None:
    try:
        async for message in conn:
            if isinstance(message, bytes):
                _write_out(message)
                session["offset"] = session.get("offset", 0) + len(message)
                continue
            frame = json.loads(message)
            kind = frame.get("type")
            if kind == "session":
                if frame.get("resumed") and "id" in session:
                    _notice("reconnected")
                session["id"], session["connected"], session["offset"] = frame["session"], True, frame["offset"]
            elif kind == "status":
                _notice(frame.get("message") or frame.get("phase", ""))
            elif kind == "exit":
                return int(frame.get("exit_code") or 0)
            elif kind == "error":
                raise _Refused(frame.get("code", "error"), frame.get("message", ""))
            elif kind == "detached":
                raise _Refused("detached", frame.get("reason", "another client took this session"))
    except ConnectionClosed:
        pass
    return None
