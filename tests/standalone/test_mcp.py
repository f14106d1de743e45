"""`flarebox mcp` as an MCP client sees it: the official SDK's client over stdio, driving a real `flarebox mcp`
subprocess against a real `flarebox serve`. Everything the client receives (every JSON-RPC message) and everything
the server logs on stderr is recorded, and the credential must appear in none of it."""

import shutil
import subprocess
import uuid
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from cli_helpers import clean_env, client_env
from e2e import Made, flarebox_command, wait_until
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import McpError

pytestmark = [pytest.mark.timeout(180), pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap")]

TOOLS = {"run_command", "read_file", "write_file", "list_files", "snapshot", "list_snapshots"}
NS = "mcpns"


def unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


class Received:
    """Every message the client received, as JSON text, and the server's stderr."""

    def __init__(self, errlog: Path):
        self.messages: list[str] = []
        self.errlog = errlog

    def everything(self) -> str:
        return "\n".join(self.messages) + "\n" + self.errlog.read_text(errors="replace")

    def assert_no_secret(self, *secrets: str) -> None:
        seen = self.everything()
        assert self.messages, "nothing was received"
        for number, secret in enumerate(secrets):
            leaked = secret in seen  # not asserted directly: a failure would print the secret
            assert not leaked, f"secret #{number} was sent to the client or logged"


def _open_log(path: Path):
    return open(path, "w")  # stdio_client hands it to the subprocess as its stderr: a real file


@asynccontextmanager
async def mcp_session(
    server,
    tmp_path: Path,
    workspace: str,
    *,
    token: str | None = None,
    env: dict | None = None,
    args: list | None = None,
):
    """`flarebox mcp -n NS --workspace WS` (or `args`) aimed at `server` the documented way (FLAREBOX_ENDPOINT and
    FLAREBOX_TOKEN, or `env`), with a recording tap between its stdout and the client session. The SDK's stdio_client
    ends the process (closing its stdin, then terminate/kill) when the block exits, also on failure."""
    if env is None:
        env = client_env(server) if token is None else dict(client_env(server), FLAREBOX_TOKEN=token)
    command = flarebox_command()
    params = StdioServerParameters(
        command=command[0],
        args=command[1:] + (args or ["mcp", "-n", NS, "--workspace", workspace]),
        env=env,
        cwd=str(tmp_path),  # FastMCP reads a .env of its working directory: none here
    )
    errlog_path = tmp_path / f"mcp-{workspace}.stderr"
    received = Received(errlog_path)
    with _open_log(errlog_path) as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            tap_send, tap_receive = anyio.create_memory_object_stream(100)

            async def tap() -> None:
                async with tap_send:
                    async for item in read:
                        received.messages.append(
                            item.message.model_dump_json() if hasattr(item, "message") else repr(item)
                        )
                        await tap_send.send(item)

            async with anyio.create_task_group() as tg:
                tg.start_soon(tap)
                async with ClientSession(tap_receive, write) as session:
                    await session.initialize()
                    yield session, received
                tg.cancel_scope.cancel()


def text_of(result: types.CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, types.TextContent))


@pytest.fixture
def admin(server):
    made = Made(server)
    try:
        yield made
    finally:
        made.close()


async def test_tools_are_listed_with_what_survives_a_restore(server, tmp_path, admin):
    ws = unique("list")
    admin.workspaces.append((NS, ws))
    async with mcp_session(server, tmp_path, ws) as (session, received):
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        assert set(tools) == TOOLS
        run = tools["run_command"]
        assert set(run.inputSchema["properties"]) == {"command", "timeout", "cwd", "env", "stdin"}
        assert run.inputSchema["required"] == ["command"]
        for name in ("run_command", "snapshot"):
            description = tools[name].description
            assert "/workspace" in description and "home directory" in description and "process" in description
        assert "1 MiB" in tools["write_file"].description and "1 MiB" in tools["read_file"].description
        assert tools["read_file"].annotations.readOnlyHint is True
    received.assert_no_secret(server.token)


async def test_run_command_streams_progress_and_returns_exit_code_and_container(server, tmp_path, admin):
    ws = unique("run")
    admin.workspaces.append((NS, ws))
    async with mcp_session(server, tmp_path, ws) as (session, received):
        progress: list[tuple[float, float | None, str | None]] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append((value, total, message))

        command = "for i in 1 2 3; do echo tick $i; sleep 0.4; done; echo to-stderr >&2; exit 3"
        result = await session.call_tool("run_command", {"command": command}, progress_callback=on_progress)
        assert not result.isError, text_of(result)
        assert result.structuredContent["exit_code"] == 3
        assert result.structuredContent["reason"] == "exited"
        assert result.structuredContent["container"] == "fresh"  # the workspace was created on first use
        assert result.structuredContent["output"] == "tick 1\ntick 2\ntick 3\nto-stderr\n"
        assert text_of(result).startswith("tick 1\ntick 2\ntick 3\nto-stderr\n")
        assert "exit code 3" in text_of(result) and "container: fresh" in text_of(result)
        # the output came while it ran, as progress: in several notifications, counting the characters so far
        assert "".join(message for _, _, message in progress) == "tick 1\ntick 2\ntick 3\nto-stderr\n"
        assert len(progress) >= 3
        values = [value for value, _, _ in progress]
        assert values == sorted(values) and values[-1] == len("tick 1\ntick 2\ntick 3\nto-stderr\n")
        assert admin.client.get_workspace(NS, ws)["config"]["persistent"] is True

        # stdin, env and cwd reach the command; the container carries on
        result = await session.call_tool(
            "run_command",
            {
                "command": 'cat; echo " $GREETING $(pwd)"',
                "stdin": "from-stdin",
                "env": {"GREETING": "hi"},
                "cwd": "/usr",
            },
        )
        assert not result.isError, text_of(result)
        assert result.structuredContent["output"] == "from-stdin hi /usr\n"
        assert result.structuredContent["container"] == "continuing"

        # a timeout is honoured: the command is killed, and the result says so
        result = await session.call_tool("run_command", {"command": "sleep 30", "timeout": 1})
        assert not result.isError, text_of(result)
        assert (result.structuredContent["exit_code"], result.structuredContent["reason"]) == (124, "timeout")
        assert "timed out" in text_of(result)
    received.assert_no_secret(server.token)


async def assert_cancelled_on_server(admin, ws: str) -> None:
    """The workspace's one command was cancelled on the server (its audit log holds the cancel) and ended with the
    cancelled exit: reattaching to it replays its end."""

    def cancel_record():
        records = admin.client.list_audit(NS, ws)["records"]
        return next((r for r in records if r["operation"] == "cancel"), None)

    record = await anyio.to_thread.run_sync(lambda: wait_until(cancel_record, 30, what="a cancel record"))
    events = await anyio.to_thread.run_sync(lambda: list(admin.client.reattach(NS, ws, record["request_id"])))
    assert events[-1]["type"] == "exit", events
    assert (events[-1]["exit_code"], events[-1]["reason"]) == (130, "cancelled")
    assert "not-cancelled" not in "".join(e.get("data", "") for e in events)
    assert admin.client.get_workspace(NS, ws)["busy"] is False


async def test_cancelling_the_request_cancels_the_command_on_the_server(server, tmp_path, admin):
    ws = unique("cancel")
    admin.workspaces.append((NS, ws))
    async with mcp_session(server, tmp_path, ws) as (session, received):
        going, answered = anyio.Event(), anyio.Event()
        outcome: list = []

        async def on_progress(value, total, message) -> None:
            if message and "going" in message:
                going.set()

        # The SDK's client never sends notifications/cancelled itself (cancelling the awaiting task only stops the
        # wait), so the test sends it, with the JSON-RPC id of the request: the id the session gives the next one.
        request_id = session._request_id

        async def call() -> None:
            try:
                outcome.append(
                    await session.call_tool(
                        "run_command",
                        {"command": "echo going; sleep 60; echo not-cancelled"},
                        progress_callback=on_progress,
                    )
                )
            except McpError as err:
                outcome.append(err)
            answered.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            with anyio.fail_after(60):
                await going.wait()
            params = types.CancelledNotificationParams(requestId=request_id, reason="the test gave up")
            await session.send_notification(types.ClientNotification(types.CancelledNotification(params=params)))
            with anyio.fail_after(30):
                await answered.wait()
        assert isinstance(outcome[0], McpError), outcome  # the SDK answers a cancelled request with an error
        assert outcome[0].error.message == "Request cancelled"

        # the remote command really stopped
        await assert_cancelled_on_server(admin, ws)

        # and the server still serves
        result = await session.call_tool("run_command", {"command": "echo still-here"})
        assert result.structuredContent["output"] == "still-here\n"
    received.assert_no_secret(server.token)


async def test_a_client_that_goes_away_does_not_leave_its_command_running(server, tmp_path, admin):
    ws = unique("gone")
    admin.workspaces.append((NS, ws))
    env = clean_env(HERMES_CF_ENDPOINT=server.url, HERMES_CF_TOKEN=server.token)  # the Hermes plugin's names work too
    async with mcp_session(server, tmp_path, ws, env=env) as (session, received):
        going = anyio.Event()

        async def on_progress(value, total, message) -> None:
            if message and "going" in message:
                going.set()

        async with anyio.create_task_group() as tg:
            command = {"command": "echo going; sleep 60; echo not-cancelled"}
            tg.start_soon(lambda: session.call_tool("run_command", command, progress_callback=on_progress))
            with anyio.fail_after(60):
                await going.wait()
            tg.cancel_scope.cancel()  # stop waiting; leaving the session closes the server's stdin
    await assert_cancelled_on_server(admin, ws)
    received.assert_no_secret(server.token)


async def test_write_read_and_list_files(server, tmp_path, admin):
    ws = unique("files")
    admin.workspaces.append((NS, ws))
    async with mcp_session(server, tmp_path, ws) as (session, received):
        written = await session.call_tool(
            "write_file", {"path": "/workspace/notes/hello.txt", "content": "héllo ✓\nsecond line\n"}
        )
        assert not written.isError, text_of(written)
        assert written.structuredContent == {"path": "/workspace/notes/hello.txt", "size": 23}  # bytes of UTF-8
        read = await session.call_tool("read_file", {"path": "/workspace/notes/hello.txt"})
        assert not read.isError and text_of(read) == "héllo ✓\nsecond line\n"
        script = await session.call_tool(
            "write_file", {"path": "/workspace/notes/run.sh", "content": "echo ran\n", "mode": "0755"}
        )
        assert not script.isError, text_of(script)
        ran = await session.call_tool("run_command", {"command": "/workspace/notes/run.sh"})
        assert ran.structuredContent["output"] == "ran\n"

        listing = await session.call_tool("list_files", {"path": "/workspace/notes"})
        assert not listing.isError, text_of(listing)
        lines = text_of(listing).splitlines()
        assert any(line.startswith("-rw-r--r--") and line.endswith(" hello.txt") for line in lines), lines
        assert any(line.startswith("-rwxr-xr-x") and line.endswith(" run.sh") for line in lines), lines

        # the path reaches ls as data, never as shell text: were it interpolated, the echoes would run
        name = "odd dir; echo INJECTED1 $(echo INJECTED2) `echo INJECTED3` '"
        assert not (await session.call_tool("write_file", {"path": f"/workspace/{name}/x", "content": ""})).isError
        listing = await session.call_tool("list_files", {"path": f"/workspace/{name}"})
        assert not listing.isError, text_of(listing)
        lines = text_of(listing).splitlines()
        assert len(lines) == 2 and lines[0].startswith("total") and lines[1].endswith(" x"), lines
        top = text_of(await session.call_tool("list_files", {})).splitlines()  # default: /workspace
        assert any(line.endswith(" notes") for line in top) and any(line.endswith(" " + name) for line in top), top
        assert not any(line.startswith("INJECTED") for line in top)
        missing = await session.call_tool("list_files", {"path": "/workspace/nope"})
        assert missing.isError and text_of(missing).startswith("file_not_found")
    received.assert_no_secret(server.token)


async def test_snapshot_and_list_snapshots(server, tmp_path, admin):
    ws = unique("snap")
    admin.workspaces.append((NS, ws))
    async with mcp_session(server, tmp_path, ws) as (session, received):
        listed = await session.call_tool("list_snapshots", {})
        assert not listed.isError and listed.structuredContent == {"snapshots": []}
        assert not (await session.call_tool("write_file", {"path": "/workspace/kept", "content": "v1"})).isError
        snap = await session.call_tool("snapshot", {})
        assert not snap.isError, text_of(snap)
        snap_id = snap.structuredContent["id"]
        assert snap_id in text_of(snap) and snap.structuredContent["size"] > 0
        listed = await session.call_tool("list_snapshots", {})
        assert [s["id"] for s in listed.structuredContent["snapshots"]] == [snap_id]
        assert snap_id in text_of(listed)
        # stopped (which saves a newer one; retention keeps one per 5-minute slot), then used again: restored from
        # the newest, and the result says what survived
        await anyio.to_thread.run_sync(admin.client.stop, NS, ws)
        listed = await session.call_tool("list_snapshots", {})
        newest = [s["id"] for s in listed.structuredContent["snapshots"]]
        assert newest and newest[0] != snap_id
        back = await session.call_tool("run_command", {"command": "cat /workspace/kept"})
        assert back.structuredContent["output"] == "v1"
        assert back.structuredContent["container"] == "restored"
        assert back.structuredContent["snapshot"]["id"] == newest[0]
        assert newest[0] in text_of(back)
        assert "no earlier process is running" in text_of(back)
    received.assert_no_secret(server.token)


async def test_errors_are_tool_errors_with_the_protocol_code(server, tmp_path, admin):
    ws = unique("err")
    admin.workspaces.append((NS, ws))
    async with mcp_session(server, tmp_path, ws) as (session, received):
        for tool, arguments in (
            ("read_file", {"path": "relative.txt"}),
            ("write_file", {"path": "relative.txt", "content": "x"}),
            ("list_files", {"path": "relative"}),
        ):
            result = await session.call_tool(tool, arguments)
            assert result.isError, (tool, result)
            assert text_of(result).startswith("invalid_path: path must be an absolute path"), (tool, text_of(result))
        result = await session.call_tool("read_file", {"path": "/workspace/missing"})
        assert result.isError and text_of(result).startswith("file_not_found:")
        result = await session.call_tool("run_command", {"command": "true", "timeout": 5000})
        assert result.isError and text_of(result).startswith("invalid_timeout:")
        result = await session.call_tool("run_command", {"command": "true", "cwd": "/no/such/dir"})
        assert result.isError and text_of(result).startswith("invalid_cwd:")
        result = await session.call_tool("write_file", {"path": "/workspace/x", "content": "x" * (1024 * 1024 + 1)})
        assert result.isError and "file_too_large" in text_of(result) and "1048576" in text_of(result)
        # none of it took the server down
        result = await session.call_tool("run_command", {"command": "echo alive"})
        assert not result.isError and result.structuredContent["output"] == "alive\n"
    received.assert_no_secret(server.token)


async def test_a_key_without_manage_gets_a_clear_error_and_its_secret_is_never_shown(server, tmp_path, admin):
    ws = unique("key")
    minted = admin.client.mint_key(NS, ["exec", "files"], workspace=ws, label="mcp test")
    admin.keys.append(minted["id"])
    secret = minted["key"]
    async with mcp_session(server, tmp_path, ws, token=secret) as (session, received):
        result = await session.call_tool("run_command", {"command": "true"})
        assert result.isError
        text = text_of(result)
        assert text.startswith("forbidden:") and "manage" in text and minted["id"] in text
        # once the workspace exists, the key does what its scopes allow, and no more
        admin.client.put_workspace(NS, ws, {"persistent": True})
        admin.workspaces.append((NS, ws))
        result = await session.call_tool("run_command", {"command": "echo by-key"})
        assert not result.isError and result.structuredContent["output"] == "by-key\n"
        result = await session.call_tool("snapshot", {})
        assert result.isError and text_of(result).startswith("forbidden:")
    received.assert_no_secret(secret, secret[len("fbk_") + 17 :], server.token)  # the key, its secret part


async def test_endpoint_token_file_and_namespace_options_before_or_after_the_command(server, tmp_path, admin):
    ws = unique("flags")
    admin.workspaces.append(("mcpflags", ws))
    token_file = tmp_path / "token"
    token_file.write_text(server.token + "\n")
    args = ["--endpoint", server.url, "mcp", "--token-file", str(token_file), "--namespace", "mcpflags", "-w", ws]
    async with mcp_session(server, tmp_path, ws, env=clean_env(), args=args) as (session, received):
        result = await session.call_tool("run_command", {"command": "hostname"})
        assert not result.isError, text_of(result)
        assert result.structuredContent["output"] == ws + "\n"
    assert admin.client.get_workspace("mcpflags", ws)["state"] == "running"
    received.assert_no_secret(server.token)


def test_no_token_for_another_endpoint_is_a_clear_startup_error(tmp_path):
    env = clean_env(FLAREBOX_ENDPOINT="https://flarebox.example.invalid")
    done = subprocess.run(
        flarebox_command() + ["mcp", "--workspace", "w"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 125 and "no token for https://flarebox.example.invalid" in done.stderr
    assert done.stdout == ""  # stdout is the MCP channel: nothing else goes there
    bad = subprocess.run(
        flarebox_command() + ["mcp", "--workspace", "Not A Name"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert bad.returncode == 125 and "workspace must match" in bad.stderr
