"""GET /pty against the real supervisor: a login shell on a pty (as the sandbox user), relayed over a WebSocket.

Output is matched by markers the shell computes (`echo M''7E` prints M7E; the typed line echoes M''7E), so a test
never confuses the terminal's echo of its input with the command's output. Every shell a test learns of is killed
at teardown, and the supervisor's shutdown ends the rest.
"""

import asyncio
import base64
import json
import os
import re
import secrets
import time
from pathlib import Path

import aiohttp
import pytest

from .harness import kill_group, needs_root

pytestmark = pytest.mark.timeout(30)

WS_HEADERS = {
    "Connection": "Upgrade",
    "Upgrade": "websocket",
    "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": base64.b64encode(secrets.token_bytes(16)).decode(),
}
FULL_SCREEN = b"\x1b[?1049h\x1b[2J\x1b[H\xe2\x94\x80\xff\x00\x1b[?1049l"


def proc_stat(pid: int) -> dict | None:
    """state, pgrp, session and tty of a process (None once it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    return {"state": fields[0].decode(), "pgrp": int(fields[2]), "session": int(fields[3]), "tty": int(fields[4])}


def session_commands(sid: int) -> list[str]:
    """The live (non-zombie) processes of a session, by command name."""
    names = []
    for name in os.listdir("/proc"):
        stat = proc_stat(int(name)) if name.isdigit() else None
        if stat is not None and stat["session"] == sid and stat["state"] not in ("Z", "X"):
            try:
                names.append(Path(f"/proc/{name}/comm").read_text().strip())
            except OSError:
                pass
    return names


async def eventually(predicate, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


class Term:
    """One client of a session: the control frames and the concatenated output it received."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, shells: list[int]):
        self.ws = ws
        self.frames: list[tuple[str, object]] = []  # ("text", dict) | ("binary", bytes), in arrival order
        self.output = bytearray()
        self.closed = False
        self._pos = 0
        self._marks = 0
        self._shells = shells

    def controls(self, kind: str) -> list[dict]:
        return [data for t, data in self.frames if t == "text" and data["type"] == kind]

    async def until(self, predicate, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            left = deadline - time.monotonic()
            assert left > 0 and not self.closed, f"not seen; frames {self.controls_summary()}, tail {self.tail()!r}"
            try:
                msg = await self.ws.receive(timeout=left)
            except TimeoutError:
                continue
            if msg.type is aiohttp.WSMsgType.BINARY:
                self.frames.append(("binary", msg.data))
                self.output += msg.data
            elif msg.type is aiohttp.WSMsgType.TEXT:
                self.frames.append(("text", json.loads(msg.data)))
            else:
                self.closed = True

    def controls_summary(self) -> list[dict]:
        return [data for t, data in self.frames if t == "text"]

    def tail(self) -> bytes:
        return bytes(self.output[-1500:])

    async def session(self) -> dict:
        await self.until(lambda: self.controls("session"))
        return self.controls("session")[0]

    async def expect(self, needle: bytes) -> bytes:
        """Wait for `needle` past what was matched before; the output in between."""
        await self.until(lambda: self.output.find(needle, self._pos) >= 0)
        at = self.output.find(needle, self._pos)
        before, self._pos = bytes(self.output[self._pos : at]), at + len(needle)
        return before

    async def type(self, text: str | bytes) -> None:
        await self.ws.send_bytes(text.encode() if isinstance(text, str) else text)

    async def run(self, command: str) -> bytes:
        """Type `command` and a marker; the output up to the marker's."""
        self._marks += 1
        await self.type(f"{command}; echo M''{self._marks}E\r")
        return await self.expect(f"M{self._marks}E".encode())

    async def shell_pid(self) -> int:
        pid = int(re.findall(rb"P(\d+)P", await self.run("echo P$$P"))[-1])
        self._shells.append(pid)
        return pid

    async def resumed(self) -> tuple[dict, bytes]:
        """A resuming client's first two frames: the session frame and the scrollback; later matches skip the
        scrollback (it holds earlier markers)."""
        await self.until(lambda: len(self.frames) >= 2)
        (kind, session), (kind2, scrollback) = self.frames[:2]
        assert (kind, kind2) == ("text", "binary"), self.frames[:2]
        self._pos = len(self.output)
        return session, scrollback

    async def until_closed(self) -> None:
        await self.until(lambda: self.closed)


@pytest.fixture
async def terms():
    """open(sup, query) → a connected Term; every client closed and every known shell killed at teardown."""
    clients: list[aiohttp.ClientSession] = []
    shells: list[int] = []

    async def open_term(sup, query: str = "") -> Term:
        client = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sup.socket)))
        clients.append(client)
        ws = await client.ws_connect("http://sv/pty" + query, timeout=aiohttp.ClientWSTimeout(ws_close=5))
        return Term(ws, shells)

    yield open_term
    for client in clients:
        await client.close()
    for pid in shells:
        stat = proc_stat(pid)
        if stat is not None and stat["session"] == pid:  # still that shell (not a reused pid)
            kill_group(pid)


def handshake(sup, query: str = ""):
    """A WebSocket upgrade request by plain HTTP: an error is answered before the upgrade, as JSON."""
    return sup.client.get("/pty" + query, headers=WS_HEADERS)


def assert_error(response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code


async def test_a_login_shell_on_a_pty_of_the_asked_size(supervisor, terms):
    term = await terms(supervisor, "?cols=132&rows=41")
    session = await term.session()
    assert session["resumed"] is False and (session["cols"], session["rows"]) == (132, 41)
    assert len(session["session"]) == 32
    assert b"/dev/pts/" in await term.run("tty")
    assert b"41 132\r\n" in await term.run("stty size")
    assert str(supervisor.workspace).encode() in await term.run("pwd")
    assert b"xterm-256color" in await term.run("echo $TERM")
    pid = await term.shell_pid()
    stat = proc_stat(pid)
    # the shell leads its own session and process group, with the pty as its controlling terminal
    assert stat["session"] == pid and stat["pgrp"] == pid and stat["tty"] != 0

    await term.ws.send_str(json.dumps({"type": "resize", "cols": 100, "rows": 30}))
    assert b"30 100\r\n" in await term.run("stty size")


async def test_ctrl_c_interrupts_the_foreground_job(supervisor, terms):
    term = await terms(supervisor, "?cols=200")
    await term.session()
    pid = await term.shell_pid()
    await term.type("sleep 100\r")
    await eventually(lambda: "sleep" in session_commands(pid))
    await term.type(b"\x03")
    await term.run("echo back")  # the prompt is back: a typed-ahead line would wait for the sleep otherwise
    assert "sleep" not in session_commands(pid)
    assert "bash" in session_commands(pid)


async def test_full_screen_bytes_pass_untouched(supervisor, terms):
    term = await terms(supervisor, "?cols=200")
    await term.session()
    await term.run(r"printf '\x1b[?1049h\x1b[2J\x1b[H\xe2\x94\x80\xff\x00\x1b[?1049l'")
    assert FULL_SCREEN in term.output
    assert all(kind == "binary" for kind, _ in term.frames[1:])  # output never arrives as text frames


async def test_a_resumed_session_replays_its_scrollback_and_keeps_its_state(supervisor, terms):
    first = await terms(supervisor, "?cols=200")
    session_id = (await first.session())["session"]
    await first.run("KEPT=still-here; echo before-the-break")
    await first.ws.close()

    again = await terms(supervisor, f"?session={session_id}")
    session, scrollback = await again.resumed()
    assert session == {
        "type": "session",
        "session": session_id,
        "resumed": True,
        "cols": 200,
        "rows": 24,
        "offset": 0,  # nothing was trimmed yet: the replay is everything from the start
    }
    assert b"before-the-break" in scrollback
    assert b"still-here" in await again.run("echo ${KEPT}")


async def test_a_resume_with_an_offset_replays_only_what_came_after_it(supervisor, terms):
    first = await terms(supervisor, "?cols=200")
    session_id = (await first.session())["session"]
    await first.run("echo seen-$((1+1))")
    await first.until(lambda: len(first.output) > 0)
    shown = len(first.output)  # every byte this client has: the session frame said offset 0
    await first.ws.close()
    again = await terms(supervisor, f"?session={session_id}&offset={shown}")
    await again.until(lambda: len(again.frames) >= 1)
    assert again.frames[0][1]["offset"] == shown
    await again.run("echo after-$((2+2))")
    assert b"seen-2" not in again.output and b"after-4" in again.output
    # an offset past the end is the end (a prompt may still have come after what `again` read)
    later = await terms(supervisor, f"?session={session_id}&offset=999999999")
    await later.until(lambda: len(later.frames) >= 1)
    assert shown + len(again.output) <= later.frames[0][1]["offset"] < 999999999


async def test_output_is_read_while_detached_and_the_scrollback_keeps_the_newest(supervisor, terms):
    first = await terms(supervisor, "?cols=200")
    session_id = (await first.session())["session"]
    # far more than a pty buffer holds: the command only finishes if the supervisor reads on without a client
    await first.type("sleep 0.3; seq 1 100000; touch finished; echo F''IN\r")
    await first.ws.close()
    await eventually(lambda: (supervisor.workspace / "finished").exists())

    again = await terms(supervisor, f"?session={session_id}")
    await again.until(lambda: len(again.frames) >= 2)
    _, scrollback = again.frames[1]
    assert len(scrollback) == 256 * 1024  # PTY_SCROLLBACK_BYTES, the newest: the last numbers, not the first
    assert b"\r\n99999\r\n100000\r\nFIN\r\n" in scrollback and b"\r\n2\r\n" not in scrollback


async def test_a_resume_applies_the_new_size(supervisor, terms):
    first = await terms(supervisor, "?cols=90&rows=20")
    session_id = (await first.session())["session"]
    await first.ws.close()
    again = await terms(supervisor, f"?session={session_id}&rows=33")
    session = await again.session()
    assert (session["cols"], session["rows"]) == (90, 33)
    assert b"33 90\r\n" in await again.run("stty size")


async def test_exit_ends_the_session(supervisor, terms):
    term = await terms(supervisor)
    session_id = (await term.session())["session"]
    pid = await term.shell_pid()
    await term.type("exit 7\r")
    await term.until_closed()
    assert term.controls("exit") == [{"type": "exit", "exit_code": 7}]
    assert term.ws.close_code == 1000
    await eventually(lambda: proc_stat(pid) is None)  # reaped, not a zombie
    assert_error(handshake(supervisor, f"?session={session_id}"), 404, "session_not_found")


async def test_a_signal_death_is_128_plus_the_signal(supervisor, terms):
    term = await terms(supervisor)
    await term.session()
    await term.type("kill -KILL $$\r")
    await term.until_closed()
    assert term.controls("exit") == [{"type": "exit", "exit_code": 137}]


async def test_shutdown_ends_every_session(supervisor, terms):
    attached, detached = await terms(supervisor), await terms(supervisor)
    await attached.session()
    await detached.session()
    pids = [await attached.shell_pid(), await detached.shell_pid()]
    await detached.ws.close()
    supervisor.process.terminate()
    await attached.until_closed()
    assert attached.controls("exit") == [{"type": "exit", "exit_code": 129}]  # SIGHUP
    assert attached.ws.close_code == 1000
    await eventually(lambda: all(proc_stat(pid) is None for pid in pids))
    assert supervisor.process.wait(10) == 0


@pytest.mark.parametrize(
    "query",
    ["?cols=0", "?cols=abc", "?rows=1001", "?color=1", "?session=not-hex", "?cols=80&cols=81"],
)
def test_a_bad_query_is_refused_before_the_upgrade(supervisor, query):
    assert_error(handshake(supervisor, query), 400, "invalid_query")


def test_an_unknown_session_is_not_found(supervisor):
    assert_error(handshake(supervisor, f"?session={secrets.token_hex(16)}"), 404, "session_not_found")


def test_a_plain_request_needs_a_websocket(supervisor):
    assert_error(supervisor.client.get("/pty"), 426, "websocket_required")


async def test_sessions_are_limited(supervisor, terms):
    for _ in range(16):
        await (await terms(supervisor)).session()
    assert_error(handshake(supervisor), 409, "too_many_sessions")


async def test_a_detached_session_ends_after_the_linger(supervisor_factory, terms):
    sup = supervisor_factory({"FLAREBOX_PTY_LINGER_SECONDS": "1"})
    term = await terms(sup)
    session_id = (await term.session())["session"]
    pid = await term.shell_pid()
    await term.ws.close()
    detached_at = time.monotonic()
    await eventually(lambda: proc_stat(pid) is None, timeout=10)
    assert time.monotonic() - detached_at >= 0.9
    assert_error(handshake(sup, f"?session={session_id}"), 404, "session_not_found")


async def test_an_attached_session_does_not_linger(supervisor_factory, terms):
    sup = supervisor_factory({"FLAREBOX_PTY_LINGER_SECONDS": "0.5"})
    term = await terms(sup)
    await term.session()
    pid = await term.shell_pid()
    await asyncio.sleep(1.5)
    assert proc_stat(pid) is not None
    await term.run("echo alive")


async def test_a_bad_control_frame_is_answered_and_the_session_goes_on(supervisor, terms):
    term = await terms(supervisor)
    await term.session()
    await term.ws.send_str("not json")
    await term.until(lambda: term.controls("error"))
    await term.ws.send_str(json.dumps({"type": "resize", "cols": 0, "rows": 10}))
    await term.until(lambda: len(term.controls("error")) == 2)
    assert [e["code"] for e in term.controls("error")] == ["invalid_json", "invalid_field"]
    assert all(e["message"] for e in term.controls("error"))
    assert b"24 80\r\n" in await term.run("stty size")


async def test_a_second_client_detaches_the_first(supervisor, terms):
    first = await terms(supervisor)
    session_id = (await first.session())["session"]
    await first.run("echo one")
    second = await terms(supervisor, f"?session={session_id}")
    session, scrollback = await second.resumed()
    assert session["resumed"] is True and b"one" in scrollback
    await first.until_closed()
    assert first.controls("detached") == [{"type": "detached", "reason": "another client resumed this session"}]
    assert first.ws.close_code == 1000
    assert b"two" in await second.run("echo t''wo")


@needs_root
async def test_the_shell_runs_as_the_sandbox_user(supervisor, terms):
    term = await terms(supervisor)
    await term.session()
    assert f"U{supervisor.uid}U".encode() in await term.run("echo U$(id -u)U")
    # the user owns its terminal, as after a login, so programs that open it by name can
    assert f"U{supervisor.uid}U".encode() in await term.run('echo U$(stat -c %u "$(tty)")U')
