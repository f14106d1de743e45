"""Terminal sessions through a real server and sandbox (issue 14): GET W/pty as a WebSocket — the boot's progress in
the terminal, a real tty as the sandbox user, a resumed session's scrollback, the exit code, the credential as a
header or as the subprotocol a browser sends, and HTTP refusals before the upgrade."""

import asyncio
import base64
import json
import shutil

import pytest
from e2e import TerminalSession, put_workspace, run_ok, ws_url
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

pytestmark = [pytest.mark.timeout(180), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]

NS = "term"


def pty_url(server, ws: str, **query) -> str:
    q = "&".join(f"{k}={v}" for k, v in query.items())
    return server.url.replace("http", "ws", 1) + ws_url(NS, ws, "pty") + (f"?{q}" if q else "")


def auth(server) -> dict:
    return {"Authorization": f"Bearer {server.token}"}


@pytest.fixture(scope="module")
def workspace(server):
    with server.client() as client:
        assert put_workspace(client, NS, "shell").status_code in (200, 201)
    return "shell"


async def test_a_fresh_workspace_boots_in_the_terminal_then_runs_a_shell_on_a_tty(server):
    with server.client() as client:
        assert put_workspace(client, NS, "fresh").status_code in (200, 201)
    async with connect(pty_url(server, "fresh", cols=100, rows=30), additional_headers=auth(server)) as conn:
        s = TerminalSession(conn)
        await s.until(lambda s: s.frame("session") is not None)
        kinds = [f["type"] for f in s.frames]
        assert kinds.index("status") < kinds.index("started") < kinds.index("session"), kinds
        assert s.frame("started")["container"] == "fresh"
        assert s.frame("session")["resumed"] is False and (s.frame("session")["cols"], s.frame("session")["rows"]) == (
            100,
            30,
        )
        await s.type("tty; stty size; id -un; echo done-$((40+2))\r")
        await s.until(lambda s: b"done-42" in s.screen)
        assert b"/dev/pts/" in s.screen and b"30 100" in s.screen and b"sandbox" in s.screen


async def test_a_resumed_session_replays_its_output_and_keeps_its_shell(server, workspace):
    async with connect(pty_url(server, workspace), additional_headers=auth(server)) as conn:
        s = TerminalSession(conn)
        await s.until(lambda s: s.frame("session") is not None)
        session = s.frame("session")["session"]
        await s.type("MARK=kept-$((6*7)); echo before-drop\r")
        await s.until(lambda s: b"before-drop" in s.screen.replace(b"echo before-drop", b""))
    async with connect(pty_url(server, workspace, session=session), additional_headers=auth(server)) as conn:
        s = TerminalSession(conn)
        await s.until(lambda s: s.frame("session") is not None and b"before-drop" in s.screen)
        assert s.frame("session") == {**s.frame("session"), "session": session, "resumed": True}
        await s.type("echo $MARK; exit 7\r")
        await s.until(lambda s: s.frame("exit") is not None)
        assert b"kept-42" in s.screen and s.frame("exit")["exit_code"] == 7
    # the shell exited: the session is gone — said in the socket (the upgrade was answered before the boot)
    async with connect(pty_url(server, workspace, session=session), additional_headers=auth(server)) as conn:
        s = TerminalSession(conn)
        await s.until(lambda s: s.frame("error") is not None)
        assert s.frame("error")["code"] == "session_not_found" and s.frame("session") is None
        await conn.wait_closed()
        assert conn.close_code == 1008


async def test_a_browser_sends_its_credential_as_a_subprotocol_and_it_is_never_echoed(server, workspace):
    encoded = base64.urlsafe_b64encode(server.token.encode()).decode().rstrip("=")
    async with connect(pty_url(server, workspace), subprotocols=["flarebox", f"flarebox.bearer.{encoded}"]) as conn:
        assert conn.subprotocol == "flarebox"
        s = TerminalSession(conn)
        await s.until(lambda s: s.frame("session") is not None)
        await s.type("exit 0\r")
        await s.until(lambda s: s.frame("exit") is not None)


@pytest.mark.parametrize(
    "headers, query, status, code",
    [
        ({}, {}, 401, "unauthorized"),
        ({"Authorization": "Bearer wrong-" + "x" * 40}, {}, 401, "unauthorized"),
        (None, {"cols": "0"}, 400, "invalid_query"),
        (None, {"session": "not-hex"}, 400, "invalid_query"),
        (None, {"colour": "1"}, 400, "invalid_query"),
    ],
)
async def test_refusals_are_http_answers_before_the_upgrade(server, workspace, headers, query, status, code):
    with pytest.raises(InvalidStatus) as refused:
        async with connect(
            pty_url(server, workspace, **query), additional_headers=auth(server) if headers is None else headers
        ):
            pass
    assert refused.value.response.status_code == status
    assert json.loads(refused.value.response.body)["error"]["code"] == code


def test_a_plain_get_is_told_to_upgrade(server, workspace):
    with server.client() as client:
        answer = client.get(ws_url(NS, workspace, "pty"))
    assert answer.status_code == 426 and answer.json()["error"]["code"] == "websocket_required"


async def test_an_unknown_workspace_is_refused_before_the_upgrade(server):
    with pytest.raises(InvalidStatus) as refused:
        async with connect(pty_url(server, "never-made"), additional_headers=auth(server)):
            pass
    assert refused.value.response.status_code == 404
    assert json.loads(refused.value.response.body)["error"]["code"] == "workspace_not_found"


async def test_ctrl_c_reaches_the_remote_command_and_the_shell_goes_on(server, workspace):
    async with connect(pty_url(server, workspace), additional_headers=auth(server)) as conn:
        s = TerminalSession(conn)
        await s.until(lambda s: s.frame("session") is not None)
        await s.type("sleep 100; echo slept\r")
        await asyncio.sleep(0.5)
        await conn.send(b"\x03")  # Ctrl-C: SIGINT to the foreground group on the remote tty
        await s.type("echo after-$((1+1))\r")
        await s.until(lambda s: b"after-2" in s.screen)
        assert b"slept" not in s.screen.replace(b"echo slept", b"")
    with server.client() as client:
        out = run_ok(client, NS, workspace, "pgrep -x sleep || echo none")[0]
    assert "none" in out
