"""The supervisor's HTTP routes (docs/protocol.md, "Supervisor API")."""

import asyncio
import logging
import os
import stat

from aiohttp import web

from flarebox_supervisor import __version__, port_sockets, services
from flarebox_supervisor.files import get_file, put_file
from flarebox_supervisor.httpio import no_query, read_json, stream_journal
from flarebox_supervisor.identity import Identity
from flarebox_supervisor.registry import Registry
from flarebox_supervisor.settings import Settings
from protocol.errors import ERRORS, ProtocolError, error_body
from protocol.limits import MAX_BODY_BYTES
from protocol.validate import parse_exec_request, validate_offset, validate_request_id

log = logging.getLogger("flarebox_supervisor")

_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large", 431: "headers_too_large"}


def _error_response(code: str, message: str | None = None) -> web.Response:
    return web.json_response(error_body(code, message), status=ERRORS[code][0])


@web.middleware
async def errors_middleware(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ProtocolError as exc:
        return _error_response(exc.code, exc.message)
    except web.HTTPException as exc:
        if exc.status in _HTTP_CODES:
            return _error_response(_HTTP_CODES[exc.status])
        raise
    except (ConnectionError, OSError) as exc:
        if request.transport is None or request.transport.is_closing():
            raise  # the client went away mid-response; nothing left to answer
        log.exception("request failed: %s", exc)
        return _error_response("internal_error")


async def health(request: web.Request) -> web.Response:
    registry: Registry = request.app["registry"]
    identity: Identity = request.app["identity"]
    return web.json_response({"ok": True, "version": __version__, "running": registry.running(), "user": identity.name})


def _is_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


async def start_exec(request: web.Request) -> web.StreamResponse:
    no_query(request)
    exec_request = parse_exec_request(await read_json(request))
    settings: Settings = request.app["settings"]
    cwd = exec_request.cwd or settings.workdir
    if not _is_dir(cwd):
        raise ProtocolError("invalid_cwd", "cwd is not a directory")
    command = request.app["registry"].start(exec_request, cwd)
    return await stream_journal(request, command.journal, 0)


async def reattach(request: web.Request) -> web.StreamResponse:
    request_id = validate_request_id(request.match_info["request_id"])
    no_query(request, frozenset({"offset"}))
    offset = validate_offset(request.query.get("offset", "0"))
    command = request.app["registry"].get(request_id)
    if command is None:
        raise ProtocolError("request_not_found")
    return await stream_journal(request, command.journal, offset)


async def cancel(request: web.Request) -> web.Response:
    request_id = validate_request_id(request.match_info["request_id"])
    no_query(request)
    state = request.app["registry"].cancel(request_id)
    return web.json_response({"request_id": request_id, "state": state})


async def sync(request: web.Request) -> web.Response:
    no_query(request)
    await asyncio.to_thread(os.sync)
    return web.json_response({"ok": True})


def make_app(settings: Settings, identity: Identity, files) -> web.Application:
    app = web.Application(middlewares=[errors_middleware], client_max_size=MAX_BODY_BYTES)
    app["settings"] = settings
    app["identity"] = identity
    app["files"] = files
    app["registry"] = Registry(settings, identity)
    app.router.add_get("/health", health)
    app.router.add_post("/exec", start_exec)
    app.router.add_get("/exec/{request_id}", reattach)
    app.router.add_post("/exec/{request_id}/cancel", cancel)
    app.router.add_get("/files", get_file)
    app.router.add_put("/files", put_file)
    app.router.add_post("/sync", sync)
    services.add_routes(app)
    port_sockets.add_routes(app)

    async def on_shutdown(app: web.Application) -> None:
        app["registry"].kill_all()

    app.on_shutdown.append(on_shutdown)
    return app
