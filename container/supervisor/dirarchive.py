"""GET and PUT /files/archive: one directory's contents as a tar.zst stream, for `curl … | tar --zstd -x` and back.

The work is done by archive_tree.py's worker with the sandbox user's rights (what it reads, refuses and how it swaps
an upload into place is described there); these routes only move bytes between HTTP and the worker's pipes. A GET
reads the worker's first output before it answers, so a worker that fails at once (no such directory, not one,
unreadable) gives an error answer, and a failure later breaks the transfer (no terminating chunk) rather than end a
short archive as if it were whole. A PUT's worker answers one JSON line once it has the whole body, checked.
"""

import asyncio
import json
import logging
import os

from flarebox_supervisor import archive, archive_tree
from flarebox_supervisor.files import _widen_unix_send_buffer
from flarebox_supervisor.httpio import no_query
from flarebox_supervisor.httpserver import Request, Response, StreamResponse, json_response
from protocol.errors import ERRORS, ProtocolError
from protocol.validate import validate_abs_path

log = logging.getLogger("flarebox_supervisor")

_STDERR_KEPT = 4096


def _dir_path(request: Request) -> str:
    no_query(request, frozenset({"path"}))
    if "path" not in request.query:
        raise ProtocolError("invalid_query", "path is required")
    return validate_abs_path(request.query["path"])


class _Worker:
    """An archive_tree worker for one request, its stderr kept (the first bytes) for the answer and the log."""

    def __init__(self, proc):
        self.proc = proc
        self.errors = bytearray()
        self._stderr = asyncio.ensure_future(self._drain())

    @classmethod
    async def start(cls, request: Request, action: str, path: str, extra: list[str] = (), **pipes) -> "_Worker":
        argv = ["--dir", path, *extra]
        proc = await archive.start_worker(request.app["identity"], action, [], argv, archive_tree.MODULE, **pipes)
        return cls(proc)

    async def _drain(self) -> None:
        # always read to the end: a full stderr pipe would block the worker
        while chunk := await self.proc.stderr.read(65536):
            self.errors += chunk[: _STDERR_KEPT - len(self.errors)]

    async def stderr(self) -> str:
        """All the worker wrote on stderr (its first bytes), once it has ended."""
        await self.proc.wait()
        async with asyncio.timeout(5):
            await self._stderr
        return self.errors.decode("utf-8", "replace").strip()

    async def stop(self) -> None:
        await archive.stop_worker(self.proc)
        self._stderr.cancel()


def _early_error(stderr: str) -> ProtocolError:
    """The error an export worker reported before any data (one JSON line on stderr), else an internal error."""
    for line in reversed(stderr.splitlines()):
        try:
            report = json.loads(line)
        except ValueError:
            continue
        if isinstance(report, dict) and report.get("error") in ERRORS:
            return ProtocolError(report["error"], str(report.get("message", ""))[:2000])
    log.error("directory archive failed: %s", stderr)
    return ProtocolError("internal_error", "the archive failed: " + stderr[-500:])


async def get_archive(request: Request) -> StreamResponse:
    path = _dir_path(request)
    worker = await _Worker.start(request, "export", path, stdout=asyncio.subprocess.PIPE)
    try:
        stdout = worker.proc.stdout
        chunk = await stdout.read(archive.STREAM_CHUNK)
        if not chunk:
            raise _early_error(await worker.stderr())
        response = StreamResponse(headers={"Content-Type": "application/zstd", "Cache-Control": "no-store"})
        await response.prepare(request)
        if request.transport is not None:
            _widen_unix_send_buffer(request.transport)
        while chunk:
            await response.write(chunk)
            chunk = await stdout.read(archive.STREAM_CHUNK)
        status = await worker.proc.wait()
        note = await worker.stderr()
        if status != 0:
            log.error("directory archive of %s failed mid-stream (exit status %s): %s", path, status, note)
            # no terminating chunk: the client must see a broken transfer, never a short archive as a whole one
            if request.transport is not None:
                request.transport.close()
            return response
        if note:
            log.info("directory archive of %s: %s", path, note)
        await response.write_eof()
        return response
    finally:
        await worker.stop()


def _upload_path(path: str) -> str:
    """DIR without trailing slashes; one that ends in "." or ".." does not name the directory to replace."""
    path = path.rstrip("/") or "/"
    if os.path.basename(path) in (".", ".."):
        raise ProtocolError("invalid_path", "path must name the directory itself, not end in '.' or '..'")
    return path


async def put_archive(request: Request) -> Response:
    path = _dir_path(request)
    target = _upload_path(path)
    max_bytes, max_entries = request.app["import_limits"]
    length = request.content_length
    if length is not None and length > max_bytes:
        raise ProtocolError("payload_too_large", f"the archive has {length} bytes; the limit is {max_bytes}")
    # one upload or workspace import at a time: each clears the staging leftovers it finds as a killed one's
    async with request.app["import_lock"]:
        extra = ["--max-bytes", str(max_bytes), "--max-entries", str(max_entries)]
        pipes = {"stdin": asyncio.subprocess.PIPE, "stdout": asyncio.subprocess.PIPE}
        worker = await _Worker.start(request, "import", target, extra, **pipes)
        try:
            await send_body(request, worker.proc, max_bytes)
            answer = await worker.proc.stdout.readline()  # one JSON line, written once the worker is done
            if not answer:
                log.error("directory upload worker failed: %s", await worker.stderr())
            result = archive.check_import_result(answer, archive_tree.RESULT_FIELDS)
        finally:
            await worker.stop()
    return json_response({"path": path, **result})


async def send_body(request: Request, proc, max_bytes: int) -> None:
    """The request body into the worker's stdin, then its end. A client that goes away raises here, and the worker
    is stopped before it could commit."""
    received = 0
    while chunk := await request.readany():
        received += len(chunk)
        if received > max_bytes:
            raise ProtocolError("payload_too_large", f"the archive is larger than {max_bytes} bytes")
        try:
            proc.stdin.write(chunk)
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            break  # the worker stopped reading: it already has its answer (a refused archive)
    proc.stdin.close()  # the end of the archive: the worker checks the end and only then commits
