"""Request and response helpers shared by the supervisor's routes: JSON bodies, query checks, NDJSON streams."""

from flarebox_supervisor.httpserver import Request, StreamResponse
from flarebox_supervisor.stream import Final, follow
from protocol import limits
from protocol.errors import ProtocolError
from protocol.validate import parse_json_object


def _check_json(request: Request, max_bytes: int) -> None:
    if request.content_type != "application/json":  # parameters such as charset are allowed, as on the public API
        raise ProtocolError("unsupported_media_type")
    if request.content_length is not None and request.content_length > max_bytes:
        raise ProtocolError("payload_too_large")


async def read_json(request: Request) -> dict:
    _check_json(request, limits.MAX_BODY_BYTES)
    return parse_json_object(await request.read(limits.MAX_BODY_BYTES))


async def read_large_json(request: Request, max_bytes: int) -> dict:
    """A JSON object body allowed to be larger than MAX_BODY_BYTES (services: their env carries secrets' values)."""
    _check_json(request, max_bytes)
    return parse_json_object(await request.read(max_bytes), max_bytes)


def no_query(request: Request, allowed: frozenset = frozenset()) -> None:
    for key in request.query:
        if key not in allowed or key in request.query.repeated:
            raise ProtocolError("invalid_query", f"unexpected query parameter {key!r}")


async def stream_journal(request: Request, journal, offset: int) -> StreamResponse:
    """Follow a journal (or a service's log) from `offset` as NDJSON until its terminal event.

    The head goes out at once (the client parses it while the command runs); the terminal event goes out with the
    end of the body, in one write."""
    response = StreamResponse(headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-store"})
    await response.prepare(request)
    try:
        async for chunk in follow(journal, offset, request.app["settings"].heartbeat_seconds):
            if isinstance(chunk, Final):
                await response.write_eof(chunk)
            else:
                await response.write(chunk)
        await response.write_eof()  # a no-op after the terminal event
    except ConnectionResetError:
        pass  # the client went away; what it followed keeps running and can be followed again from an offset
    return response
