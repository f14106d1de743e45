"""`flarebox mcp`: a Model Context Protocol server on stdio that gives an MCP client one Flarebox workspace.

Tools: run_command, read_file, write_file, list_files, snapshot, list_snapshots — each a thin layer over the shared
protocol client (flarebox_hermes.client.Client), which is synchronous: calls run in worker threads, and an exec
stream is read by a daemon thread that hands its events to the request's task.

- The workspace is created with defaults on first use (as `flarebox exec` does); a scoped key without `manage`
  gets a clear error instead.
- run_command sends the command's output as MCP progress notifications while it runs (when the client gave a
  progress token; `progress` is the characters of output so far); the result carries the output, the exit code
  and the `container` state of the stream's `started` event. A dropped stream is reattached from its offset, never
  re-sent. When the client cancels the request (or goes away) the command is cancelled on the server too.
- Every failure is a tool error (an isError result) naming the protocol's error code and its advice; the server
  itself never crashes on one. The token (or key) in use is never part of a result, an error or a log line.
"""

import contextlib
import functools
import io
import logging
import math
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.server.fastmcp import Context, FastMCP
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import Field

from standalone.cli_support import ConfigError, credential_hint, ensure_workspace, say

MAX_TEXT_BYTES = 1024 * 1024  # read_file / write_file: text travels inside one JSON-RPC message
MAX_RESULT_CHARS = 100_000  # the most output one run_command result holds (its tail); progress carried it all
REATTACH_ATTEMPTS = 3
REATTACH_PAUSE = 1.0
LIST_TIMEOUT = 60
REDACTED = "[redacted]"
LIST_PATH_VAR = "FLAREBOX_LIST_PATH"
# The path travels in the environment, never in the command text: no quoting, no injection. Exit 3: nothing there.
LIST_COMMAND = (
    f'if [ ! -e "${LIST_PATH_VAR}" ] && [ ! -L "${LIST_PATH_VAR}" ]; then exit 3; fi; '
    f'exec ls -lAH --time-style=long-iso -- "${LIST_PATH_VAR}"'
)

KEPT = (
    "Files under /workspace and the home directory are kept: they are saved in snapshots (when the workspace idles "
    "or stops, or with the snapshot tool) and come back when the workspace is restored. Processes are not: after a "
    "restore or restart no earlier process (background jobs, servers) is running."
)
CONTAINER_NEWS = {
    "continuing": "files and background processes as the previous command left them",
    "fresh": "a new, empty workspace",
    "restored": "restored from a snapshot: files are as of that snapshot (later changes are gone), no earlier "
    "process is running",
    "restarted": "the sandbox was restarted: files are kept, no earlier process is running",
}

log = logging.getLogger("flarebox.mcp")


class ToolFailure(Exception):
    """A tool's answer is an error result with this text."""


class Workspace:
    """One workspace behind the tools: the client, the names, and whether the workspace is known to exist."""

    def __init__(self, client, token: str, namespace: str, workspace: str):
        self.client = client
        self.token = token
        self.ns = namespace
        self.ws = workspace
        self._ready = False
        self._lock = anyio.Lock()

    def clean(self, text: str) -> str:
        """The credential never leaves this process, even if a command printed it."""
        return text.replace(self.token, REDACTED) if self.token else text

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        await self.ensure()
        return await anyio.to_thread.run_sync(lambda: fn(self.ns, self.ws, *args, **kwargs))

    async def ensure(self) -> None:
        """Create the workspace with defaults the first time a tool needs it (GET, then PUT if missing)."""
        if self._ready:
            return
        async with self._lock:
            if not self._ready:
                await anyio.to_thread.run_sync(ensure_workspace, self.client, self.ns, self.ws)
                self._ready = True

    def describe(self, err: BaseException) -> str:
        """An error as the client is told it: the protocol's code and advice, never a credential."""
        from flarebox_hermes.client import ApiError, ProtocolViolation, TransportError

        endpoint = self.client.endpoint
        if isinstance(err, ApiError):
            if err.code == "workspace_not_found":
                self._ready = False  # deleted behind our back: the next call creates it again
            text = f"{err.code}: {err.message}{credential_hint(err, self.token)}"
        elif isinstance(err, TransportError) and not err.connected:
            from standalone.cli import LOCAL_ENDPOINT

            hint = " (is `flarebox serve` running?)" if endpoint == LOCAL_ENDPOINT else ""
            text = f"cannot reach the Flarebox server {endpoint}: {err.reason}{hint}"
        elif isinstance(err, TransportError | ProtocolViolation):
            text = f"the Flarebox server {endpoint}: {err}"
        elif isinstance(err, ToolFailure | ValueError):
            text = str(err)
        else:
            log.error("unexpected failure: %s: %s", type(err).__name__, self.clean(str(err)), exc_info=err)
            text = f"flarebox mcp failed unexpectedly ({type(err).__name__}); its log (stderr) has the details"
        return self.clean(text)


def _result(text: str, structured: dict | None = None, *, error: bool = False) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)], structuredContent=structured, isError=error)


def _guarded(ws: Workspace, fn: Callable[..., Awaitable[CallToolResult]]) -> Callable[..., Awaitable[CallToolResult]]:
    """Every failure becomes an error result; cancellation (and the server's own shutdown) passes through."""

    @functools.wraps(fn)
    async def tool(*args: Any, **kwargs: Any) -> CallToolResult:
        try:
            return await fn(*args, **kwargs)
        except Exception as err:  # a tool never crashes the server
            return _result(ws.describe(err), error=True)

    return tool


def _check_path(path: str) -> str:
    """The server's own rule (and words) for a path, checked here for list_files, whose path goes into an env var."""
    from protocol.errors import ProtocolError
    from protocol.validate import validate_abs_path

    try:
        return validate_abs_path(path)
    except ProtocolError as err:
        raise ToolFailure(f"{err.code}: {err.message}") from None


# --- run_command -------------------------------------------------------------------------------------------------


class _Run:
    """One exec request followed to its terminal event: a daemon thread reads the stream (reattaching once it
    drops) and hands each event to the task awaiting it; the task sends progress and builds the result."""

    def __init__(self, ws: Workspace, request: dict):
        self.ws = ws
        self.request = request
        self.request_id = request["request_id"]
        self.output: list[str] = []
        self.chars = 0
        self.started: dict | None = None
        self.end: dict | None = None
        self.settled = False  # known not to run (refused before its stream)

    def _pump(self, emit: Callable[[tuple[str, Any]], bool]) -> None:
        """In the thread: "event" items, then at most one "refused" (the exec was refused or never arrived: nothing
        ran) or "error" (the outcome was not seen) item."""
        from flarebox_hermes.client import ApiError, TransportError

        client, ns, ws = self.ws.client, self.ws.ns, self.ws.ws
        offset, attempts = 0, 0
        try:
            stream = client.exec(ns, ws, self.request)
            while True:
                try:
                    for event in stream:
                        if event["type"] == "output":
                            offset = event["offset"] + len(event["data"])
                        if not emit(("event", event)) or event["type"] in ("exit", "error"):
                            return
                    return  # not reached: the client raises when a stream ends without its terminal event
                except TransportError as err:
                    if attempts == 0 and not err.connected:  # no connection was made: the exec did not arrive
                        emit(("refused", err))
                        return
                    if attempts >= REATTACH_ATTEMPTS:
                        emit(("error", self._lost(err)))
                        return
                    attempts += 1  # never re-sent: reattached from the output already received
                    time.sleep(REATTACH_PAUSE)
                    stream = client.reattach(ns, ws, self.request_id, offset)
        except (ApiError, ValueError) as err:  # before the first stream: refused, nothing ran
            emit(("refused" if attempts == 0 else "error", err))
        except Exception as err:  # handed to the task, which turns it into a tool error
            emit(("error", err))

    def _lost(self, err) -> ToolFailure:
        return ToolFailure(
            f"the connection to the Flarebox server dropped ({err.reason}) and reattaching failed: the command "
            f"(request {self.request_id}) may still be running; its outcome was not seen"
        )

    async def run(self, ctx: Context | None) -> None:
        """Follow the command to its end; if this ends any other way (the client cancelled the request or went
        away, the stream was lost) while it may still run, cancel it on the server."""
        try:
            failure = await self._follow(ctx)
        except BaseException:
            await self._stop()
            raise
        if failure is not None:
            await self._stop()
            raise failure

    async def _follow(self, ctx: Context | None) -> Exception | None:
        # the failure is returned, not raised: the portal's task group would wrap it in an exception group
        send, receive = anyio.create_memory_object_stream[tuple[str, Any]](math.inf)
        async with anyio.from_thread.BlockingPortal() as portal:  # how the reading thread reaches this task

            def emit(item: tuple[str, Any]) -> bool:
                try:
                    portal.call(send.send_nowait, item)
                    return True
                except Exception:  # this task is gone (cancelled, finished) or the portal closed: stop reading
                    return False

            def pump() -> None:
                try:
                    self._pump(emit)
                finally:
                    with contextlib.suppress(Exception):
                        portal.call(send.close)

            threading.Thread(target=pump, name=f"flarebox-exec-{self.request_id[:8]}", daemon=True).start()
            try:
                async with receive:
                    async for kind, item in receive:
                        if kind == "refused":
                            self.settled = True
                        if kind != "event":
                            return item
                        await self._event(item, ctx)
                        if self.end is not None:
                            return None
                return ToolFailure(f"the exec stream of request {self.request_id} ended without its outcome")
            except Exception as err:  # e.g. a progress notification to a client that went away
                return err

    async def _stop(self) -> None:
        if self.end is None and not self.settled:
            with anyio.CancelScope(shield=True):
                await self._cancel()

    async def _cancel(self) -> None:
        client, ns, ws = self.ws.client, self.ws.ns, self.ws.ws
        try:
            answer = await anyio.to_thread.run_sync(client.cancel, ns, ws, self.request_id)
            log.info("request %s cancelled on the server: %s", self.request_id, answer.get("state"))
        except Exception as err:  # best effort; say why it failed
            log.warning("could not cancel request %s on the server: %s", self.request_id, self.ws.describe(err))

    async def _event(self, event: dict, ctx: Context | None) -> None:
        kind = event["type"]
        if kind == "output":
            data = self.ws.clean(event["data"])
            self.output.append(data)
            self.chars = event["offset"] + len(event["data"])
            if ctx is not None:
                await ctx.report_progress(self.chars, None, data)
        elif kind == "started":
            self.started = event
        elif kind in ("exit", "error"):
            self.end = event

    def result(self) -> CallToolResult:
        output = self.ws.clean("".join(self.output))
        omitted = max(0, len(output) - MAX_RESULT_CHARS)
        if omitted:
            output = output[omitted:]
        shown = (f"[… the first {omitted} characters of output are omitted …]\n" if omitted else "") + output
        if shown and not shown.endswith("\n"):
            shown += "\n"
        end = self.end or {}
        if end.get("type") == "error":
            text = f"{end['code']}: {self.ws.clean(end.get('message', ''))} (request {self.request_id})"
            return _result(text + (f"\noutput before it:\n{shown}" if shown else ""), error=True)
        container = self.started["container"] if self.started else None
        snapshot = self.started.get("snapshot") if self.started else None
        code, reason = end["exit_code"], end["reason"]
        what = {
            "exited": f"exit code {code}",
            "timeout": f"timed out and killed (exit code {code})",
            "cancelled": f"cancelled (exit code {code})",
            "signal": f"killed by a signal (exit code {code})",
        }[reason]
        news = CONTAINER_NEWS.get(container or "", "")
        if container == "restored" and snapshot:
            news += f" (snapshot {snapshot.get('id')} of {snapshot.get('created_at')})"
        footer = f"[flarebox: {what}; container: {container}" + (f" — {news}]" if container != "continuing" else "]")
        structured = {
            "exit_code": code,
            "reason": reason,
            "container": container,
            "snapshot": snapshot,
            "duration_ms": end.get("duration_ms"),
            "request_id": self.request_id,
            "output": output,
            "omitted_chars": omitted,
        }
        return _result(shown + footer, structured)


# --- the server ----------------------------------------------------------------------------------------------------


def build_server(ws: Workspace) -> FastMCP:
    where = f"{ws.ns}/{ws.ws}"
    server = FastMCP(
        name="flarebox",
        instructions=(
            f"Tools for the Flarebox workspace {where}: a remote Linux sandbox (bash, Python, Node.js) where commands "
            "run as an unprivileged user. Each command is a new `bash -c`: cd and export do not carry over (pass "
            f"cwd and env). {KEPT}"
        ),
        log_level="WARNING",
    )

    async def run_command(
        command: Annotated[str, Field(description="the command line, run by `bash -c` (at most 64 KiB)")],
        timeout: Annotated[
            float | None, Field(description="seconds, more than 0 and at most 900 (default 120); then it is killed")
        ] = None,
        cwd: Annotated[str | None, Field(description="absolute working directory (default /workspace)")] = None,
        env: Annotated[dict[str, str] | None, Field(description="extra environment variables")] = None,
        stdin: Annotated[
            str | None, Field(description="UTF-8 text written to the command's stdin, which is then closed")
        ] = None,
        ctx: Context = None,
    ) -> CallToolResult:
        await ws.ensure()
        request: dict[str, Any] = {"request_id": uuid.uuid4().hex, "command": command, "env": env or {}}
        for name, value in (("timeout", timeout), ("cwd", cwd), ("stdin", stdin)):
            if value is not None:
                request[name] = value
        run = _Run(ws, request)
        await run.run(ctx)
        return run.result()

    async def read_file(
        path: Annotated[str, Field(description="absolute path, e.g. /workspace/notes.md")],
    ) -> CallToolResult:
        from flarebox_hermes.client import ApiError

        buffer = io.BytesIO()
        try:
            await ws.call(ws.client.read_file, path, buffer, MAX_TEXT_BYTES)
        except ApiError as err:
            if err.code != "file_too_large":
                raise
            raise ToolFailure(
                f"file_too_large: {err.message}: read part of it with run_command (head, tail, sed -n '1,200p')"
            ) from None
        try:
            text = buffer.getvalue().decode("utf-8")
        except UnicodeDecodeError:
            raise ToolFailure(
                f"{path} is not UTF-8 text: inspect it with run_command (file, xxd | head, base64)"
            ) from None
        return _result(ws.clean(text))

    async def write_file(
        path: Annotated[str, Field(description="absolute path; missing parent directories are created")],
        content: Annotated[str, Field(description="the file's whole new content (UTF-8 text, at most 1 MiB)")],
        mode: Annotated[str | None, Field(description="octal permissions, e.g. 0755 (default 0644)")] = None,
    ) -> CallToolResult:
        data = content.encode("utf-8")
        if len(data) > MAX_TEXT_BYTES:
            raise ToolFailure(
                f"file_too_large: the content is {len(data)} bytes of UTF-8, over this tool's {MAX_TEXT_BYTES}-byte "
                "limit: write it in parts (append with run_command) or copy it with `flarebox cp`"
            )
        answer = await ws.call(ws.client.write_file, path, data, mode)
        return _result(f"wrote {answer['size']} bytes to {answer['path']}", answer)

    async def list_files(
        path: Annotated[str, Field(description="absolute path of a directory (or a file)")] = "/workspace",
    ) -> CallToolResult:
        _check_path(path)
        await ws.ensure()
        request = {
            "request_id": uuid.uuid4().hex,
            "command": LIST_COMMAND,
            "env": {LIST_PATH_VAR: path},
            "timeout": LIST_TIMEOUT,
            "cwd": "/",
        }
        run = _Run(ws, request)
        await run.run(None)
        end = run.end or {}
        output = "".join(run.output)
        if end.get("type") == "exit" and end["exit_code"] == 3:
            raise ToolFailure(f"file_not_found: nothing at {path}")
        if end.get("type") != "exit" or end["exit_code"] != 0:
            if end.get("type") == "error":
                return run.result()
            return _result(ws.clean(f"list_files: ls exited with {end['exit_code']}: {output.strip()}"), error=True)
        if len(output) > MAX_RESULT_CHARS:
            output = output[:MAX_RESULT_CHARS] + "\n[… the listing is cut here: list a subdirectory …]\n"
        return _result(output or "(empty)\n")

    async def snapshot() -> CallToolResult:
        answer = await ws.call(ws.client.snapshot)
        return _result(
            f"snapshot {answer['id']} of {answer['created_at']} ({answer['size']} bytes): the files of /workspace "
            "and the home directory as of now; no process is in it",
            answer,
        )

    async def list_snapshots() -> CallToolResult:
        snapshots = await ws.call(ws.client.snapshots)
        lines = [f"{s['id']}  {s['created_at']}  {s['size']} bytes" for s in snapshots]
        return _result("\n".join(lines) if lines else "no snapshots yet", {"snapshots": snapshots})

    tools = [
        (
            run_command,
            f"Run a shell command in the workspace {where} and return its output (stdout and stderr merged), its "
            "exit code and the container state. The workspace is created with defaults on first use and booted or "
            "restored on demand. While the command runs its output is sent as progress notifications (when the "
            f"request has a progress token); the result holds at most the last {MAX_RESULT_CHARS} characters "
            "(redirect big output to a file and read parts of it; over 2,000,000 characters kills the command). "
            "After `timeout` seconds the command is killed (exit code 124); cancelling the request stops it on the "
            "server (exit code 130). `container` says what survived since the previous command: continuing (files "
            "and background processes as left), restored (files as of the snapshot named: later changes and every "
            "process are gone), restarted (files kept, processes gone) or fresh (a new, empty workspace). " + KEPT,
            ToolAnnotations(title="Run a command", destructiveHint=True, openWorldHint=True),
        ),
        (
            read_file,
            f"Read a UTF-8 text file of the workspace {where} (absolute path), at most {MAX_TEXT_BYTES} bytes (1 MiB). "
            "For a larger or a binary file use run_command (head, tail, sed -n, base64) or `flarebox cp`.",
            ToolAnnotations(title="Read a file", readOnlyHint=True),
        ),
        (
            write_file,
            f"Write UTF-8 text to a file of the workspace {where} (absolute path), replacing it atomically; missing "
            f"parent directories are created. At most {MAX_TEXT_BYTES} bytes (1 MiB) of UTF-8 per call (the server "
            "may allow less). " + KEPT,
            ToolAnnotations(title="Write a file", destructiveHint=True, idempotentHint=True),
        ),
        (
            list_files,
            f"List a directory of the workspace {where} (absolute path, default /workspace) as `ls -lA` does: type "
            "and permissions, owner, size, modification time and name of each entry (a file lists itself).",
            ToolAnnotations(title="List a directory", readOnlyHint=True),
        ),
        (
            snapshot,
            f"Save a snapshot of the workspace {where} now; it keeps running. A snapshot holds files only (everything "
            "under /workspace and the home directory), never processes: after a restore the files are as of the "
            "snapshot and no earlier process is running. Snapshots are also taken when the workspace idles or stops.",
            ToolAnnotations(title="Save a snapshot", destructiveHint=False),
        ),
        (
            list_snapshots,
            f"List the snapshots of the workspace {where}, newest first (id, created_at, size in bytes). When a "
            "stopped workspace is used again it is restored from the newest one: its files come back, its processes "
            "do not.",
            ToolAnnotations(title="List snapshots", readOnlyHint=True),
        ),
    ]
    for fn, description, annotations in tools:
        server.add_tool(_guarded(ws, fn), name=fn.__name__, description=description, annotations=annotations)
    return server


def main(args) -> int:
    """Run the MCP server on stdin/stdout until the client closes it (args: the parsed `flarebox mcp` options)."""
    from flarebox_hermes.client import Client, check_name
    from standalone import redact
    from standalone.cli import ERROR_EXIT, resolve_target

    try:
        check_name(args.namespace, "namespace")
        check_name(args.workspace, "workspace")
        endpoint, token, _ = resolve_target(args)
        client = Client(endpoint, token)
    except (ConfigError, ValueError) as err:
        say(str(err))
        return ERROR_EXIT
    with client:
        ws = Workspace(client, token, args.namespace, args.workspace)
        # plain lines on stderr, the MCP client's log (FastMCP would otherwise set up rich's boxed console output),
        # with the credential redacted from every line; our own notes at INFO, the SDK's from WARNING on
        logging.basicConfig(level=logging.WARNING, format="flarebox: %(message)s", stream=sys.stderr)
        logging.getLogger("flarebox").setLevel(logging.INFO)
        redact.install(token, ("",))
        server = build_server(ws)
        say(f"MCP server for {args.namespace}/{args.workspace} at {endpoint} on stdio")
        anyio.run(server.run_stdio_async)
    return 0
