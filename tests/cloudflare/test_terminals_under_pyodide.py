"""Terminal sessions (GET W/pty as a WebSocket) through the real src/entry.py under Pyodide behind the binding
harness: the client's upgrade reaches the Worker, which forwards it through the Durable Object stub; the object
answers it with a WebSocketPair (cloudflare/host.py) and connects to the real supervisor with
`getTcpPort(8080).fetch(…, Upgrade: websocket)` (cloudflare/container.py), frames relayed both ways by
durable/terminal.py. The harness keeps workerd's WebSocket rules (accept() before use, binary messages as Blobs
unless binaryType says otherwise, sockets returned only unaccepted, an upgrade through a stub arriving as a GET
without a body); the behaviour is the standalone runtime's (tests/standalone/test_e2e_terminal.py)."""

import asyncio
import base64
import json
import shutil

import pytest
from e2e import TerminalSession, put_workspace, wait_until, ws_url
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from protocol import limits

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]

NS = "term"
OPEN_SECONDS = 30
_ACCEPT_FIRST = (
    "TypeError: You must call one of accept() or state.acceptWebSocket() on this WebSocket before sending messages."
)
_SENT_CLOSE = "TypeError: Can't call WebSocket send() after close()."
# What workerd 2026-11-17 (the node_modules binary, compatibility date 2026-11-17) answered to the cases of the
# harness's /__harness/wsprobe, run in a Worker: the rules the fake WebSocketPair and Response keep.
WORKERD_WEBSOCKET_RULES = {
    "status101NoWs": (
        "RangeError: Responses may only be constructed with status codes in the range 200 to 599, inclusive."
    ),
    "ws200": "RangeError: Responses with a WebSocket must have status code 101.",
    "ws101Body": "TypeError: Response with null body status (101, 204, 205, or 304) cannot have a body.",
    "sendBeforeAccept": _ACCEPT_FIRST,
    "closeBeforeAccept": _ACCEPT_FIRST,
    "close1006": "InvalidAccessError: Invalid WebSocket close code: 1006.",
    "closeReasonNoCode": "InvalidAccessError: If you specify a WebSocket close reason, you must also specify a code.",
    "closeLongReason": "SyntaxError: WebSocket close reason must not be longer than 123 bytes when UTF-8 encoded.",
    "sendAfterClose": _SENT_CLOSE,
    "doubleClose": "ok",
    "binaryTypeBad": "blob",  # an unknown binaryType is ignored; "blob" is the default
    "pairKeys": "0,1",
    "pair": "str | Blob | Blob | close 4001 r true",  # binary messages are Blobs unless binaryType says otherwise
    "sendAfterPeerClose": _SENT_CLOSE,  # the peer's close is answered at once
    "closeAfterPeerClose": "ok",
    "arraybuffer": "ArrayBuffer",
}


def pty_url(harness, ws: str, **query) -> str:
    q = "&".join(f"{k}={v}" for k, v in query.items())
    return harness.base.replace("http", "ws", 1) + ws_url(NS, ws, "pty") + (f"?{q}" if q else "")


def auth(harness, token: str | None = None) -> dict:
    return {"Authorization": f"Bearer {harness.token if token is None else token}"}


def terminal(harness, ws: str, headers: dict | None = None, **options):
    """A WebSocket client on W/pty (the deployment token as the header unless `headers` or subprotocols say else)."""
    query = options.pop("query", {})
    if headers is None and "subprotocols" not in options:
        headers = auth(harness)
    return connect(pty_url(harness, ws, **query), additional_headers=headers, open_timeout=OPEN_SECONDS, **options)


def create(harness, name: str) -> None:
    with harness.client() as client:
        assert put_workspace(client, NS, name).status_code in (200, 201)


@pytest.fixture(scope="module")
def workspace(harness):
    create(harness, "shell")
    return "shell"


def object_name(ws: str) -> str:
    return f"{NS}/{ws}"


def settled(harness, ws: str) -> bool:
    """Nothing of a terminal left in flight: the object's request (its socket) and the container's connection."""
    state = harness.container(object_name(ws))
    return state["object"]["inflight"] == 0 and state["inflight"] == 0


async def test_a_fresh_workspace_boots_in_the_terminal_then_runs_a_shell_on_a_tty(harness):
    create(harness, "fresh")
    async with terminal(harness, "fresh", query={"cols": 100, "rows": 30}) as conn:
        s = TerminalSession(conn, timeout=90)
        await s.until(lambda s: s.frame("session") is not None)
        kinds = [f["type"] for f in s.frames]
        assert kinds.index("status") < kinds.index("started") < kinds.index("session"), kinds
        assert s.frame("started")["container"] == "fresh"
        session = s.frame("session")
        assert session["resumed"] is False and (session["cols"], session["rows"]) == (100, 30)
        await s.type("tty; stty size; echo hi-$((6*7))\r")
        await s.until(lambda s: b"hi-42" in s.screen)
        assert b"/dev/pts/" in s.screen and b"30 100" in s.screen
        assert conn.subprotocol is None  # none offered, none selected
    # the way it went: the object was asked for an upgrade (a GET, args in the header), the container's supervisor
    # was reached with one, and both sockets are gone once the client left
    fetches = harness.calls(object_name("fresh"), "object.fetch")
    upgrade = next(c for c in fetches if c["path"] == "/call/pty")
    assert upgrade.get("upgrade") is True and upgrade["bodyLength"] == 0
    ports = harness.calls(object_name("fresh"), "container.getTcpPort.fetch")
    assert any(c["path"] == "/pty" and c.get("upgrade") for c in ports), ports
    assert harness.calls(object_name("fresh"), "container.websocket.open")
    wait_until(lambda: settled(harness, "fresh"), 20, what="the terminal's sockets to close")
    assert harness.calls(object_name("fresh"), "container.websocket.closed")
    assert harness.calls(object_name("fresh"), "object.websocket.closed")


async def test_a_resumed_session_replays_its_output_and_its_exit_code_ends_it(harness, workspace):
    async with terminal(harness, workspace) as conn:
        s = TerminalSession(conn, timeout=90)
        await s.until(lambda s: s.frame("session") is not None)
        session = s.frame("session")["session"]
        await s.type("MARK=kept-$((6*7)); echo before-drop\r")
        await s.until(lambda s: b"before-drop" in s.screen.replace(b"echo before-drop", b""))
    async with terminal(harness, workspace, query={"session": session}) as conn:
        s = TerminalSession(conn, timeout=90)
        await s.until(lambda s: s.frame("session") is not None and b"before-drop" in s.screen)
        assert s.frame("session") == {**s.frame("session"), "session": session, "resumed": True}
        await s.type("echo $MARK; exit 3\r")
        await s.until(lambda s: s.frame("exit") is not None)
        assert b"kept-42" in s.screen and s.frame("exit")["exit_code"] == 3
        await conn.wait_closed()
        assert conn.close_code == 1000
    wait_until(lambda: settled(harness, workspace), 20, what="the terminal's sockets to close")


async def test_resuming_a_session_that_is_gone_says_so_in_the_socket(harness, workspace):
    # well-formed but unknown: the upgrade is answered first (a boot reports its progress in the terminal), so the
    # supervisor's refusal (HTTP 404 to the object's upgrade) comes as an error frame, then a policy close
    async with terminal(harness, workspace, query={"session": "0" * 32}) as conn:
        s = TerminalSession(conn, timeout=90)
        await s.until(lambda s: s.frame("error") is not None)
        assert s.frame("error")["code"] == "session_not_found" and s.frame("session") is None
        await conn.wait_closed()
        assert conn.close_code == 1008 and conn.close_reason == "session_not_found"
    refused = harness.calls(object_name(workspace), "container.websocket.refused")
    assert refused and refused[-1]["status"] == 404


async def test_a_browser_sends_its_credential_as_a_subprotocol_and_it_is_never_echoed(harness, workspace):
    encoded = base64.urlsafe_b64encode(harness.token.encode()).decode().rstrip("=")
    async with terminal(harness, workspace, subprotocols=["flarebox", f"flarebox.bearer.{encoded}"]) as conn:
        assert conn.subprotocol == "flarebox"
        assert conn.response.headers["sec-websocket-protocol"] == "flarebox"
        s = TerminalSession(conn, timeout=90)
        await s.until(lambda s: s.frame("session") is not None)
        await s.type("exit 0\r")
        await s.until(lambda s: s.frame("exit") is not None)
        assert s.frame("exit")["exit_code"] == 0
    upgrades = harness.calls(None, "worker.websocket")
    assert upgrades[-1]["protocol"] == "flarebox" and encoded in upgrades[-1]["offered"]


@pytest.mark.parametrize(
    "headers, query, status, code",
    [
        ({"Authorization": "Bearer wrong-" + "x" * 40}, {}, 401, "unauthorized"),
        ({}, {}, 401, "unauthorized"),
        (None, {"cols": "0"}, 400, "invalid_query"),
        (None, {"session": "not-hex"}, 400, "invalid_query"),
    ],
)
async def test_refusals_are_http_answers_before_the_upgrade(harness, workspace, headers, query, status, code):
    with pytest.raises(InvalidStatus) as refused:
        async with terminal(harness, workspace, headers, query=query):
            pass
    assert refused.value.response.status_code == status
    assert json.loads(refused.value.response.body)["error"]["code"] == code


async def test_an_unknown_workspace_is_refused_by_its_object_before_the_upgrade(harness):
    # the Worker forwards the upgrade; the object answers 404 instead of 101, and that passes through as it is
    with pytest.raises(InvalidStatus) as refused:
        async with terminal(harness, "never-made"):
            pass
    assert refused.value.response.status_code == 404
    assert json.loads(refused.value.response.body)["error"]["code"] == "workspace_not_found"
    assert harness.calls(object_name("never-made"), "object.fetch")[-1].get("upgrade") is True
    assert not harness.calls(object_name("never-made"), "object.websocket")


async def test_a_connected_terminal_keeps_its_object_in_memory_until_a_deploy_cuts_it(harness, workspace):
    # an accepted WebSocket is a request in flight: time passing evicts no object under it; a deploy resets the
    # object and cuts the socket (1006), and the session, which lives in the container, is resumed from the new one
    name = object_name(workspace)
    async with terminal(harness, workspace) as conn:
        s = TerminalSession(conn, timeout=90)
        await s.until(lambda s: s.frame("session") is not None)
        session = s.frame("session")["session"]
        generation = harness.container(name)["object"]["generation"]
        harness.advance(120)  # past the platform's idle eviction
        assert harness.container(name)["object"]["generation"] == generation
        await s.type("echo still-$((2+3))\r")
        await s.until(lambda s: b"still-5" in s.screen)
        harness.deploy(grace_seconds=0.2)
        await asyncio.wait_for(conn.wait_closed(), 30)
        assert conn.close_code == 1006
    assert harness.container(name)["object"]["generation"] == generation + 1
    async with terminal(harness, workspace, query={"session": session}) as conn:
        s = TerminalSession(conn, timeout=90)
        await s.until(lambda s: s.frame("session") is not None and b"still-5" in s.screen)
        assert s.frame("session")["resumed"] is True
        await s.type("exit 0\r")
        await s.until(lambda s: s.frame("exit") is not None)
    wait_until(lambda: settled(harness, workspace), 20, what="the terminal's sockets to close")


def test_the_harness_keeps_the_websocket_rules_of_workerd(harness):
    assert harness.admin.get("/__harness/wsprobe").json() == WORKERD_WEBSOCKET_RULES
    # a resumed session's scrollback comes in one frame: it fits what the runtime takes from the container
    assert limits.PTY_SCROLLBACK_BYTES < harness.platform()["webSocketMaxMessageBytes"]


def test_a_plain_get_is_told_to_upgrade(harness, workspace):
    with harness.client() as client:
        answer = client.get(ws_url(NS, workspace, "pty"))
    assert answer.status_code == 426 and answer.json()["error"]["code"] == "websocket_required"
