"""The supervisor's file tree routes: GET /files/list, GET /files/stat, DELETE /files, POST /files/move, POST
/files/mkdir.

Requests are checked here (protocol/files.py, the same checks as the edge's); the work runs through
app["files"] (treeops.py), with the sandbox user's rights. Every path is normalized lexically first ("." and ".."
segments, repeated and trailing slashes), so "/workspace/sub/.." is "/workspace" for every check and for the kernel
alike, and answers carry the normalized path.
"""

import asyncio
import json
import os

from flarebox_supervisor.files import _path, _query
from flarebox_supervisor.httpio import no_query, read_json
from flarebox_supervisor.httpserver import Application, Request, Response, json_response
from protocol.errors import ProtocolError
from protocol.files import parse_list_query, parse_mkdir_request, parse_move_request, parse_recursive


def normalize(path: str) -> str:
    # normpath keeps a leading "//" (POSIX leaves it to the system; Linux reads it as "/")
    return "/" + os.path.normpath(path).lstrip("/")


def _protected(app: Application) -> list[str]:
    """What delete and move refuse (with every directory holding one of them): see treeops."""
    return sorted({"/", *(normalize(path) for path in (app["settings"].workdir, app["identity"].home) if path)})


def _page_body(path: str, fd: int | None, cursor: str | None) -> bytes:
    """The listing's answer around the page the agent wrote into a memfd (parsed, so the answer is always JSON)."""
    if fd is None:
        raise ProtocolError("internal_error", "the file agent sent no listing")
    with os.fdopen(fd, "rb") as page:
        page.seek(0)
        entries = json.loads(page.read())
    if not isinstance(entries, list):
        raise ProtocolError("internal_error", "the file agent sent a malformed listing")
    return json.dumps({"path": path, "entries": entries, "cursor": cursor}).encode()


async def list_files(request: Request) -> Response:
    listing = parse_list_query(_query(request, {"path", "depth", "limit", "cursor"}))
    path = normalize(listing.path)
    result, fd = await request.app["files"].call(
        "tree_list", path=path, depth=listing.depth, limit=listing.limit, cursor=listing.cursor
    )
    # up to 10,000 entries: parsed and encoded off the event loop
    body = await asyncio.to_thread(_page_body, path, fd, result["cursor"])
    return Response(body=body, content_type="application/json")


async def stat_file(request: Request) -> Response:
    path = normalize(_path(_query(request, {"path"})))
    result, _ = await request.app["files"].call("tree_stat", path=path)
    return json_response(result["entry"])


async def delete_file(request: Request) -> Response:
    query = _query(request, {"path", "recursive"})
    path = normalize(_path(query))
    recursive = parse_recursive(query.get("recursive"))
    await request.app["files"].call("tree_remove", path=path, recursive=recursive, protected=_protected(request.app))
    return json_response({"path": path, "deleted": True})


async def move_file(request: Request) -> Response:
    no_query(request)
    move = parse_move_request(await read_json(request))
    source, target = normalize(move.source), normalize(move.target)
    await request.app["files"].call(
        "tree_move", source=source, target=target, overwrite=move.overwrite, protected=_protected(request.app)
    )
    return json_response({"from": source, "to": target})


async def make_directory(request: Request) -> Response:
    no_query(request)
    mkdir = parse_mkdir_request(await read_json(request))
    path = normalize(mkdir.path)
    result, _ = await request.app["files"].call("tree_mkdir", path=path, parents=mkdir.parents, mode=mkdir.mode)
    created = result["created"]
    return json_response({"path": path, "created": created}, status=201 if created else 200)


def add_routes(app: Application) -> None:
    app.add_route("GET", "/files/list", list_files)
    app.add_route("GET", "/files/stat", stat_file)
    app.add_route("DELETE", "/files", delete_file)  # GET and PUT /files are server.py's
    app.add_route("POST", "/files/move", move_file)
    app.add_route("POST", "/files/mkdir", make_directory)
