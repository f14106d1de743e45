"""The supervisor's HTTP routes (docs/protocol.md, "Supervisor API")."""

import asyncio
import importlib
import logging
import os
import stat

from flarebox_supervisor import __version__, filetree, processes
from flarebox_supervisor.files import _widen_unix_send_buffer, get_file, put_file
from flarebox_supervisor.httpio import no_query, read_json, stream_journal
from flarebox_supervisor.httpserver import Application, Request, Response, StreamResponse, json_response
from flarebox_supervisor.identity import Identity
from flarebox_supervisor.registry import Registry
from flarebox_supervisor.settings import Settings
from protocol import limits
from protocol.errors import ProtocolError
from protocol.validate import parse_exec_request, validate_offset, validate_request_id

log = logging.getLogger("flarebox_supervisor")


async def health(request: Request) -> Response:
    registry: Registry = request.app["registry"]
    identity: Identity = request.app["identity"]
    return json_response({"ok": True, "version": __version__, "running": registry.running(), "user": identity.name})


def _is_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


async def start_exec(request: Request) -> StreamResponse:
    no_query(request)
    exec_request = parse_exec_request(await read_json(request))
    settings: Settings = request.app["settings"]
    cwd = exec_request.cwd or settings.workdir
    if not _is_dir(cwd):
        raise ProtocolError("invalid_cwd", "cwd is not a directory")
    command = request.app["registry"].start(exec_request, cwd)
    return await stream_journal(request, command.journal, 0)


async def reattach(request: Request) -> StreamResponse:
    request_id = validate_request_id(request.match_info["request_id"])
    no_query(request, frozenset({"offset"}))
    offset = validate_offset(request.query.get("offset", "0"))
    command = request.app["registry"].get(request_id)
    if command is None:
        raise ProtocolError("request_not_found")
    return await stream_journal(request, command.journal, offset)


async def cancel(request: Request) -> Response:
    request_id = validate_request_id(request.match_info["request_id"])
    no_query(request)
    state = request.app["registry"].cancel(request_id)
    return json_response({"request_id": request_id, "state": state})


async def sync(request: Request) -> Response:
    no_query(request)
    await asyncio.to_thread(os.sync)
    return json_response({"ok": True})


# --- export / import archives (archive.py does the work in a worker with the sandbox user's rights) ---------------
# archive.py and dirarchive.py (tarfile, hashing, the tree walker) are imported on the first request that needs them,
# not at start: most sandboxes never export or import, and every start and every idle sandbox would pay for them.

_RESULT_MAX = 64 * 1024
_IMPORT_LIMIT_VARS = ("FLAREBOX_MAX_IMPORT_BYTES", "FLAREBOX_MAX_IMPORT_ENTRIES")


def _module(name: str):
    return importlib.import_module(f"flarebox_supervisor.{name}")


def _lazy(module: str, name: str):
    """A route handler that imports its module on its first request."""

    async def handler(request: Request) -> StreamResponse:
        return await getattr(_module(module), name)(request)

    return handler


def _import_limits() -> tuple[int, int]:
    """archive.import_limits(), read at start so a bad operator value still stops the supervisor there; without
    either variable they are the protocol's, and archive.py need not be loaded to say so."""
    if any(os.environ.get(name) for name in _IMPORT_LIMIT_VARS):
        return _module("archive").import_limits()
    return limits.MAX_IMPORT_BYTES, limits.MAX_IMPORT_ENTRIES


def _archive_roots(app: Application) -> list[tuple[str, str]]:
    archive = _module("archive")
    return archive.archive_roots(app["settings"].workdir, archive.home_dir(app["identity"].home))


async def _drain_stderr(proc, keep: bytearray) -> None:
    """Keep the first bytes of a worker's stderr for the log, discard the rest (it must never block the worker)."""
    while chunk := await proc.stderr.read(65536):
        if len(keep) < 4096:
            keep += chunk[: 4096 - len(keep)]


async def _finish_worker(proc, stderr_task) -> None:
    await _module("archive").stop_worker(proc)
    stderr_task.cancel()


async def export_archive(request: Request) -> StreamResponse:
    no_query(request)
    archive = _module("archive")
    proc = await archive.start_worker(
        request.app["identity"], "export", _archive_roots(request.app), stdout=asyncio.subprocess.PIPE
    )
    errors = bytearray()
    stderr_task = asyncio.ensure_future(_drain_stderr(proc, errors))
    try:
        # the first chunk before the head: a worker that fails at once gets an error answer, not a broken 200
        chunk = await proc.stdout.read(archive.STREAM_CHUNK)
        if not chunk:
            await proc.wait()
            async with asyncio.timeout(5):
                await stderr_task
            log.error("export failed: %s", errors.decode("utf-8", "replace").strip())
            raise ProtocolError("internal_error", "the export failed: " + errors.decode("utf-8", "replace")[-500:])
        response = StreamResponse(headers={"Content-Type": "application/zstd", "Cache-Control": "no-store"})
        await response.prepare(request)
        if request.transport is not None:
            _widen_unix_send_buffer(request.transport)
        while chunk:
            await response.write(chunk)
            chunk = await proc.stdout.read(archive.STREAM_CHUNK)
        if await proc.wait() != 0:
            async with asyncio.timeout(5):
                await stderr_task
            log.error("export failed mid-stream: %s", errors.decode("utf-8", "replace").strip())
            # no terminating chunk: the client must see a broken transfer, never a short archive as a whole one
            if request.transport is not None:
                request.transport.close()
            return response
        await response.write_eof()
        return response
    finally:
        await _finish_worker(proc, stderr_task)


async def import_archive(request: Request) -> Response:
    no_query(request)
    max_bytes, max_entries = request.app["import_limits"]
    length = request.content_length
    if length is not None and length > max_bytes:
        raise ProtocolError("payload_too_large", f"the archive has {length} bytes; the limit is {max_bytes}")
    # one import at a time: a second one would clear the first one's staging directories as leftovers
    async with request.app["import_lock"]:
        return await _import(request, max_bytes, max_entries)


async def _import(request: Request, max_bytes: int, max_entries: int) -> Response:
    extra = ["--max-bytes", str(max_bytes), "--max-entries", str(max_entries)]
    archive = _module("archive")
    proc = await archive.start_worker(
        request.app["identity"],
        "import",
        _archive_roots(request.app),
        extra,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    errors = bytearray()
    stderr_task = asyncio.ensure_future(_drain_stderr(proc, errors))
    try:
        # the worker is stopped (finally) if the client leaves
        await _module("dirarchive").send_body(request, proc, max_bytes)
        answer = b""
        while len(answer) <= _RESULT_MAX and (part := await proc.stdout.read(_RESULT_MAX)):
            answer += part
        async with asyncio.timeout(30):
            await proc.wait()
        if not answer:
            async with asyncio.timeout(5):
                await stderr_task
            log.error("import worker failed: %s", errors.decode("utf-8", "replace").strip())
        return json_response(archive.check_import_result(answer))
    finally:
        await _finish_worker(proc, stderr_task)


# Routes whose module the first request loads: a sandbox that runs no service, terminal, proxied port or directory
# archive never imports them: its imports and routes took 107 ms instead of 112 ms (p50 of 30, alternating) here.
_LOADED_ON_FIRST_USE = (
    ("PUT", "/services", "services", "put_services"),
    ("GET", "/services", "services", "list_services"),
    ("PUT", "/services/{name}", "services", "put_service"),
    ("DELETE", "/services/{name}", "services", "delete_service"),
    ("GET", "/services/{name}/logs", "services", "service_logs"),
    ("GET", "/services/{name}/ready", "services", "service_ready"),
    ("GET", "/pty", "terminals", "open_pty"),
    ("POST", "/port-sockets/{port}", "port_sockets", "hand_over"),
    ("GET", "/files/archive", "dirarchive", "get_archive"),
    ("PUT", "/files/archive", "dirarchive", "put_archive"),
)


def make_app(settings: Settings, identity: Identity, files) -> Application:
    app = Application()
    app["settings"] = settings
    app["identity"] = identity
    app["files"] = files
    app["registry"] = Registry(settings, identity)
    app["import_limits"] = _import_limits()
    app["import_lock"] = asyncio.Lock()
    app.add_route("GET", "/health", health)
    app.add_route("POST", "/exec", start_exec)
    app.add_route("GET", "/exec/{request_id}", reattach)
    app.add_route("POST", "/exec/{request_id}/cancel", cancel)
    app.add_route("GET", "/files", get_file)
    app.add_route("PUT", "/files", put_file)
    app.add_route("POST", "/sync", sync)
    app.add_route("GET", "/export", export_archive)
    app.add_route("PUT", "/import", import_archive)
    filetree.add_routes(app)
    processes.add_routes(app)
    for method, path, module, name in _LOADED_ON_FIRST_USE:
        app.add_route(method, path, _lazy(module, name))

    async def on_shutdown(app: Application) -> None:
        app["registry"].kill_all()

    app.on_shutdown.append(on_shutdown)
    return app
