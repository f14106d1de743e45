"""Workspace calls between the worker processes of `flarebox serve --workers N` (standalone/workers.py).

Every worker runs the whole edge (credentials, routing, authorization, audit) for the requests it accepts; only the
workspace object lives in one place, its owner (standalone/placement.py). `ShardedWorkspaces` is the edge's
ports.Workspaces: a workspace this worker owns is called in process (the registry's stub, as with one worker); any
other is called through a `RemoteStub`, which carries the call to the owner's `CallServer` over a private unix
socket — the standalone counterpart of a Durable Object stub (cloudflare/wire.py does the same over fetch). So the
edge's calls to workspaces other than the path's (a fork's source, the listing's status reads, /v1/proxy's target,
which the key names) reach their owners too, and the audit record and the port proxy's X-Forwarded-For are made
from the real connection by the worker that accepted it: nothing on the internal socket comes from a client.

A call runs on one connection, in frames of (type byte, 4-byte length, payload) both ways; a connection whose call
ended cleanly (the owner says so in its END) carries the next call, so the hop costs no connect or peer check:

    caller → owner   CALL {namespace, workspace, op, args (operations.to_json), body: none|stream|socket}
                     then for a stream: DATA* and END, or ABORT {code, message} / {reset} when the body broke off;
                     for a socket: ACCEPTED / REFUSED (the answer to ACCEPT), then TEXT / BYTES frames, CLOSE
    owner → caller   (a socket: ACCEPT, when the workspace accepts the client's upgrade) HEAD {kind, status, headers,
                     pairs} — kind `raise` carries the exception the call raised (a ProtocolError's code and message),
                     `bytes` and `stream` are followed by DATA* and END (FAIL: the stream raised), `socket` (101) by
                     TEXT / BYTES frames and CLOSE {code, reason}

The caller closing the connection is the client going away: the owner stops the stream (and closes its producer)
as it does when a client of its own leaves. A call the owner cannot finish cleanly (a body not read to its end, a
stream that broke off, a terminal) ends its connection. Both ends check the other with SO_PEERCRED: same uid, and
a child of the same parent process (a sibling worker), beside the socket living in the server's private (0700)
runtime dir.
"""

import asyncio
import contextlib
import json
import logging
import os
import socket
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from durable import operations
from durable.ports import Response
from protocol.errors import ProtocolError
from standalone.peer import parent_pid, peer_credentials
from standalone.placement import owner
from standalone.streams import close_body

log = logging.getLogger("flarebox.shards")

_FRAME = struct.Struct("!BI")
MAX_FRAME = 16 * 1024 * 1024  # a frame's payload; chunks are far smaller (the ASGI server's reads)
QUEUE_FRAMES = 8  # inbound frames buffered per call before the sender is held back (a file upload's backpressure)
STREAM_LIMIT = 1024 * 1024  # the StreamReader's buffer

CALL, HEAD, DATA, END, ABORT, FAIL, ACCEPT, ACCEPTED, REFUSED, TEXT, BYTES, CLOSE = range(1, 13)
KEEP = b"k"  # an answer's END (or a raise head's "keep"): the connection carries the next call


def socket_path(runtime_dir: Path, index: int) -> Path:
    return Path(runtime_dir) / f"worker-{index}.sock"


def _frame(kind: int, payload: bytes = b"") -> bytes:
    return _FRAME.pack(kind, len(payload)) + payload


def _send(writer: asyncio.StreamWriter, kind: int, payload: bytes = b"") -> None:
    if len(payload) > 65536:
        writer.write(_FRAME.pack(kind, len(payload)))
        writer.write(payload)
    else:
        writer.write(_frame(kind, payload))


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


async def read_frame(reader: asyncio.StreamReader) -> tuple[int, bytes] | None:
    """The next frame; None at the end of the connection (or a broken one)."""
    try:
        kind, size = _FRAME.unpack(await reader.readexactly(_FRAME.size))
        if size > MAX_FRAME:
            raise ValueError(f"a frame of {size} bytes")
        return kind, await reader.readexactly(size) if size else b""
    except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError):
        return None


def is_sibling(sock: socket.socket) -> bool:
    """The other end runs as us and is a child of our parent: another worker of this server."""
    try:
        pid, uid, _ = peer_credentials(sock)
        return uid == os.geteuid() and pid != os.getpid() and parent_pid(pid) == os.getppid()
    except (OSError, ValueError, IndexError):
        return False


def _error_head(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, ProtocolError):
        return {"kind": "raise", "code": exc.code, "message": exc.message}
    if isinstance(exc, ConnectionResetError):
        return {"kind": "raise", "reset": str(exc)}
    return {"kind": "raise", "internal": type(exc).__name__}


def _raise_from(head: dict[str, Any]) -> None:
    if "code" in head:
        raise ProtocolError(head["code"], head.get("message"))
    if "reset" in head:
        raise ConnectionResetError(head["reset"])
    raise RuntimeError(f"the workspace's worker failed the call ({head.get('internal', 'unknown')})")


# --- the edge's side ------------------------------------------------------------------------------------------


class ShardedWorkspaces:
    """ports.Workspaces of one worker: its own workspaces in process, every other one at its owner."""

    def __init__(self, local: Any, index: int, workers: int, runtime_dir: Path):
        self._local = local
        self.index = index
        self.workers = workers
        paths = [socket_path(runtime_dir, i) for i in range(workers)]
        self._pools = [_Pool(path) for path in paths]
        self._relays: set[asyncio.Task] = set()  # terminal sessions relayed to their owner
        self.calls = CallServer(local, self.owns, paths[index])  # the calls to this worker's workspaces

    async def start(self) -> None:
        """Take calls from the other workers (before any of them accepts a client)."""
        await self.calls.start()

    def owns(self, namespace: str, workspace: str) -> bool:
        return owner(namespace, workspace, self.workers) == self.index

    def get(self, namespace: str, workspace: str) -> Any:
        where = owner(namespace, workspace, self.workers)
        if where == self.index:
            return self._local.get(namespace, workspace)
        return RemoteStub(self._pools[where], namespace, workspace, self._relays)

    async def close(self) -> None:
        """Server shutdown: stop taking calls, end the calls running here and the terminals relayed from here."""
        await self.calls.close()
        for pool in self._pools:
            pool.close()
        for task in list(self._relays):
            task.cancel()
        await asyncio.gather(*self._relays, return_exceptions=True)


class _Pool:
    """Connections to one sibling's worker socket, kept between calls (a call that ended cleanly, as the owner
    confirms in its END, gives its connection back). Peer-checked once, when made."""

    MAX_IDLE = 32

    def __init__(self, path: Path):
        self.path = path
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def take(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        while self._idle:
            reader, writer = self._idle.pop()
            if not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        try:
            reader, writer = await asyncio.open_unix_connection(str(self.path), limit=STREAM_LIMIT)
        except OSError as err:
            raise ProtocolError("container_unavailable", "the workspace's worker process is not answering") from err
        if not is_sibling(writer.get_extra_info("socket")):
            writer.close()
            raise ProtocolError("container_unavailable", "the workspace's worker socket is answered by a stranger")
        return reader, writer

    def give(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._idle) < self.MAX_IDLE and not reader.at_eof() and not writer.is_closing():
            self._idle.append((reader, writer))
        else:
            writer.close()

    def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


class RemoteStub:
    """ports.WorkspaceStub of a workspace another worker owns."""

    def __init__(self, pool: _Pool, namespace: str, workspace: str, relays: set[asyncio.Task]):
        self._pool = pool
        self._namespace = namespace
        self._workspace = workspace
        self._relays = relays

    async def call(self, op: str, args: Any, body: Any = None) -> Response:
        operation = operations.OPERATIONS.get(op)
        is_socket = operation is not None and operation.socket
        if is_socket and body is None:
            raise ProtocolError("websocket_required")
        kind = "socket" if is_socket else ("none" if body is None else "stream")
        reader, writer = await self._pool.take()
        sender: asyncio.Task | None = None
        handed_over = False
        reusable = False
        try:
            call = {
                "namespace": self._namespace,
                "workspace": self._workspace,
                "op": op,
                "args": operations.to_json(args),
                "body": kind,
            }
            _send(writer, CALL, _json(call))
            if kind == "stream":
                sender = asyncio.ensure_future(_send_body(body, writer))
            else:
                await writer.drain()
            while True:
                frame = await read_frame(reader)
                if frame is None:
                    raise ProtocolError("container_unavailable", "the workspace's worker process went away")
                if frame[0] == ACCEPT and is_socket:
                    try:
                        await body.accept()
                    except ConnectionError:
                        _send(writer, REFUSED)
                    else:
                        _send(writer, ACCEPTED)
                    await writer.drain()
                    continue
                if frame[0] != HEAD:
                    raise RuntimeError(f"the workspace's worker answered frame {frame[0]} before its head")
                break
            head = json.loads(frame[1])
            if head["kind"] == "raise":
                reusable = bool(head.get("keep")) and (sender is None or sender.done())
                _raise_from(head)
            headers = head.get("headers") or {}
            pairs = [tuple(p) for p in head.get("pairs") or []]
            if head["kind"] == "stream":
                handed_over = True
                return Response(head["status"], RemoteStream(reader, writer, sender, self._pool), headers, pairs)
            if head["kind"] == "socket":
                handed_over = True
                task = asyncio.ensure_future(_relay_socket(body, reader, writer))
                self._relays.add(task)
                task.add_done_callback(self._relays.discard)
                return Response(head["status"], None, headers, pairs)
            parts = []
            while True:
                frame = await read_frame(reader)
                if frame is None or frame[0] == FAIL:
                    raise ProtocolError("internal_error", "the workspace's answer broke off")
                if frame[0] == END:
                    reusable = frame[1] == KEEP and (sender is None or sender.done())
                    break
                parts.append(frame[1])
            return Response(head["status"], b"".join(parts), headers, pairs)
        finally:
            if not handed_over:
                if sender is not None:
                    sender.cancel()
                if reusable:
                    self._pool.give(reader, writer)
                else:
                    writer.close()


async def _send_body(body: Any, writer: asyncio.StreamWriter) -> None:
    """A request body to the owner, as it arrives; how it ends (complete, too large, the client gone) goes too."""
    try:
        try:
            async for chunk in body:
                if chunk:
                    _send(writer, DATA, bytes(chunk))
                    await writer.drain()
        except ProtocolError as err:
            _send(writer, ABORT, _json({"code": err.code, "message": err.message}))
        except ConnectionResetError as err:
            _send(writer, ABORT, _json({"reset": str(err)}))
        else:
            _send(writer, END)
        await writer.drain()
    except (ConnectionError, OSError):
        pass  # the owner closed the call: it needs no more of the body


class RemoteStream:
    """A streamed answer from the owner (exec events, a download), read as it comes. aclose() before its end is
    the client going away: the connection closes and the owner stops its producer. Read to its end, the
    connection goes back to the pool."""

    def __init__(self, reader, writer, sender: asyncio.Task | None, pool: "_Pool"):
        self._reader = reader
        self._writer = writer
        self._sender = sender
        self._pool = pool
        self._done = False
        self._released = False

    def __aiter__(self) -> "RemoteStream":
        return self

    async def __anext__(self) -> bytes:
        if self._done:
            raise StopAsyncIteration
        frame = await read_frame(self._reader)
        if frame is not None and frame[0] == DATA:
            return frame[1]
        self._done = True
        if frame is not None and frame[0] == END:
            if frame[1] == KEEP and (self._sender is None or self._sender.done()) and not self._released:
                self._released = True
                self._pool.give(self._reader, self._writer)
            else:
                await self.aclose()
            raise StopAsyncIteration
        await self.aclose()
        raise ConnectionError("the workspace's stream broke off")

    async def aclose(self) -> None:
        self._done = True
        if self._released:
            return
        self._released = True
        if self._sender is not None:
            self._sender.cancel()
        self._writer.close()


async def _relay_socket(client: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A terminal's frames between the client's socket (here) and the workspace's session (at the owner)."""

    async def upstream() -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while True:
                frame = await client.receive()
                if frame is None:
                    break
                _send(
                    writer,
                    BYTES if isinstance(frame, bytes) else TEXT,
                    frame if isinstance(frame, bytes) else frame.encode(),
                )
                await writer.drain()
            _send(writer, CLOSE, _json({"code": 1000, "reason": ""}))  # the client left
            await writer.drain()

    async def downstream() -> None:
        code, reason = 1011, ""
        with contextlib.suppress(ConnectionError, OSError):
            while True:
                frame = await read_frame(reader)
                if frame is None:
                    break
                kind, payload = frame
                if kind == TEXT:
                    await client.send(payload.decode("utf-8"))
                elif kind == BYTES:
                    await client.send(payload)
                elif kind == CLOSE:
                    closing = json.loads(payload)
                    code, reason = closing.get("code", 1000), closing.get("reason", "")
                    break
        await client.close(code, reason)

    up = asyncio.ensure_future(upstream())
    try:
        await downstream()
        # the session ended at the owner (or its connection did): the client's socket is closed by now
        up.cancel()
        await asyncio.gather(up, return_exceptions=True)
    finally:
        up.cancel()
        writer.close()
        with contextlib.suppress(Exception):  # cancelled (shutdown): the client is not left waiting
            await client.close(1001, "")


# --- the owner's side -----------------------------------------------------------------------------------------


class _Inbound:
    """The caller's frames on one connection, read by one task: CALL frames (one call after another), a call's
    body DATA (held back past QUEUE_FRAMES), the answer to ACCEPT, a socket's frames; `gone` once the caller
    closed the connection."""

    def __init__(self, reader: asyncio.StreamReader):
        self._reader = reader
        self._calls: asyncio.Queue = asyncio.Queue()
        self._queue: asyncio.Queue = asyncio.Queue()
        self._room = asyncio.Event()
        self._room.set()
        self.gone = asyncio.Event()
        self.accepted: asyncio.Future = asyncio.get_running_loop().create_future()
        self.body_ended = False  # the current call's body came to its END (or ABORT)
        self.task = asyncio.ensure_future(self._run())

    def next_call_state(self) -> None:
        self.accepted = asyncio.get_running_loop().create_future()
        self.body_ended = False

    async def _run(self) -> None:
        try:
            while True:
                frame = await read_frame(self._reader)
                if frame is None:
                    return
                if frame[0] == CALL:
                    self._calls.put_nowait(frame[1])
                    continue
                if frame[0] in (ACCEPTED, REFUSED):
                    if not self.accepted.done():
                        self.accepted.set_result(frame[0] == ACCEPTED)
                    continue
                self._queue.put_nowait(frame)
                if self._queue.qsize() >= QUEUE_FRAMES:
                    self._room.clear()
                    await self._room.wait()
        finally:
            self.gone.set()
            self._queue.put_nowait(None)
            self._calls.put_nowait(None)
            if not self.accepted.done():
                self.accepted.set_result(False)

    async def next_call(self) -> bytes | None:
        return await self._calls.get()

    async def get(self) -> tuple[int, bytes] | None:
        item = await self._queue.get()
        if item is None:
            self._queue.put_nowait(None)  # the end stays the end
        if self._queue.qsize() < QUEUE_FRAMES:
            self._room.set()
        return item

    def close(self) -> None:
        self.task.cancel()


async def _request_body(inbound: _Inbound):
    while True:
        item = await inbound.get()
        if item is None:
            raise ConnectionResetError("the client disconnected while sending the body")
        kind, payload = item
        if kind == DATA:
            if payload:
                yield payload
        elif kind == END:
            inbound.body_ended = True
            return
        elif kind == ABORT:
            inbound.body_ended = True
            reason = json.loads(payload)
            if "code" in reason:
                raise ProtocolError(reason["code"], reason.get("message"))
            raise ConnectionResetError(reason.get("reset") or "the client disconnected while sending the body")


class RelaySocket:
    """ports.Socket at the owner: the client's WebSocket, which the accepting worker holds."""

    def __init__(self, inbound: _Inbound, writer: asyncio.StreamWriter):
        self._inbound = inbound
        self._writer = writer
        self.accepted = False
        self.closed = asyncio.Event()

    async def accept(self) -> None:
        _send(self._writer, ACCEPT)
        try:
            await self._writer.drain()
        except (ConnectionError, OSError):
            pass
        if not await self._inbound.accepted:
            self.closed.set()
            raise ConnectionError("the client left before its upgrade was answered")
        self.accepted = True

    async def receive(self) -> bytes | str | None:
        while not self.closed.is_set():
            item = await self._inbound.get()
            if item is None or item[0] == CLOSE:
                self.closed.set()
                return None
            if item[0] == TEXT:
                return item[1].decode("utf-8")
            if item[0] == BYTES:
                return item[1]
        return None

    async def send(self, frame: bytes | str) -> None:
        if self.closed.is_set():
            raise ConnectionError("the client's socket is closed")
        try:
            if isinstance(frame, bytes):
                _send(self._writer, BYTES, frame)
            else:
                _send(self._writer, TEXT, frame.encode("utf-8"))
            await self._writer.drain()
        except (ConnectionError, OSError, RuntimeError) as exc:
            self.closed.set()
            raise ConnectionError("the client's socket is closed") from exc

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            _send(self._writer, CLOSE, _json({"code": code, "reason": reason[:120]}))
            await self._writer.drain()


class CallServer:
    """The owner's end: workspace calls from sibling workers, run on this worker's registry."""

    def __init__(self, local: Any, owns: Callable[[str, str], bool], path: Path):
        self._local = local
        self._owns = owns
        self.path = Path(path)
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        self.path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(self._accept, path=str(self.path), limit=STREAM_LIMIT)
        os.chmod(self.path, 0o600)

    async def close(self) -> None:
        """Stop taking calls and end the ones in progress (server shutdown: their clients are being closed too)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.path.unlink(missing_ok=True)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # the connection's work runs in a task of its own, which close() cancels: asyncio's stream server logs a
        # cancelled connection callback as an error
        task = asyncio.ensure_future(self._connection(reader, writer))
        self._tasks.add(task)
        try:
            await task
        except asyncio.CancelledError:
            if not task.cancelled():
                raise
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if not is_sibling(writer.get_extra_info("socket")):
                log.warning("refused a call on the worker socket from a process that is not a sibling worker")
                return
            await self._serve(reader, writer)
        except (ConnectionError, OSError):
            pass
        except Exception:
            log.exception("a call from a sibling worker failed")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Calls one after another on this connection, as long as each ends cleanly."""
        inbound = _Inbound(reader)
        try:
            while True:
                raw = await inbound.next_call()
                if raw is None:
                    return
                inbound.next_call_state()
                if not await self._call(json.loads(raw), inbound, writer):
                    return
        finally:
            inbound.close()

    async def _call(self, call: dict, inbound: _Inbound, writer: asyncio.StreamWriter) -> bool:
        """One call; True when the connection can carry the next one (the body, if any, read to its end and the
        answer sent whole)."""
        body: Any = None
        try:
            namespace, workspace, op = call["namespace"], call["workspace"], call["op"]
            if not self._owns(namespace, workspace):
                raise ProtocolError("internal_error", "a workspace call reached a worker that does not own it")
            args = operations.from_json(op, call["args"])
            if call["body"] == "stream":
                body = _request_body(inbound)
            elif call["body"] == "socket":
                body = RelaySocket(inbound, writer)
            response = await self._local.get(namespace, workspace).call(op, args, body)
        except Exception as exc:
            if not isinstance(exc, (ProtocolError, ConnectionResetError)):
                log.exception("workspace call %s failed", call.get("op"))
            keep = self._clean(call, inbound)
            _send(writer, HEAD, _json({**_error_head(exc), "keep": keep}))
            await writer.drain()
            return keep
        head = {"status": response.status, "headers": dict(response.headers), "pairs": list(response.header_pairs)}
        payload = response.body
        if isinstance(body, RelaySocket) and response.status == 101 and body.accepted:
            _send(writer, HEAD, _json({**head, "kind": "socket"}))
            await writer.drain()
            await body.closed.wait()  # the session runs on (the workspace spawned it) until a side closes
            return False
        if payload is None or isinstance(payload, (bytes, bytearray, memoryview)):
            keep = self._clean(call, inbound)
            data = bytes(payload or b"")
            answer = _frame(HEAD, _json({**head, "kind": "bytes"}))
            if len(data) <= 65536:  # the whole answer in one write
                writer.write(answer + (_frame(DATA, data) if data else b"") + _frame(END, KEEP if keep else b""))
            else:
                writer.write(answer)
                _send(writer, DATA, data)
                _send(writer, END, KEEP if keep else b"")
            await writer.drain()
            return keep
        _send(writer, HEAD, _json({**head, "kind": "stream"}))
        return await self._stream(payload, call, inbound, writer)

    @staticmethod
    def _clean(call: dict, inbound: _Inbound) -> bool:
        if inbound.gone.is_set() or call.get("body") == "socket":
            return False
        return call.get("body") == "none" or inbound.body_ended

    async def _stream(self, payload: Any, call: dict, inbound: _Inbound, writer: asyncio.StreamWriter) -> bool:
        """Like server.py's _stream: the producer is stopped (and closed) when the caller goes away."""
        finished = False

        async def pump() -> None:
            nonlocal finished
            async for chunk in payload:
                if chunk:
                    _send(writer, DATA, bytes(chunk))
                    await writer.drain()
            finished = True
            _send(writer, END, KEEP if self._clean(call, inbound) else b"")
            await writer.drain()

        pumping = asyncio.ensure_future(pump())
        watch = asyncio.ensure_future(inbound.gone.wait())
        try:
            done, _ = await asyncio.wait({pumping, watch}, return_when=asyncio.FIRST_COMPLETED)
            if pumping in done and pumping.exception() is not None:
                finished = False
                exc = pumping.exception()
                if not isinstance(exc, (ConnectionError, OSError)):
                    log.warning("a relayed response stream failed: %r", exc)
                    with contextlib.suppress(ConnectionError, OSError, RuntimeError):
                        _send(writer, FAIL)
                        await writer.drain()
        finally:
            for task in (pumping, watch):
                task.cancel()
            await asyncio.gather(pumping, watch, return_exceptions=True)
            await close_body(payload)
        return finished and self._clean(call, inbound)
