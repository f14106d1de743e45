"""A terminal session between a client's WebSocket and the supervisor's (GET …/pty, docs/protocol.md §6.30).

The client's socket is accepted first, so a boot or restore reports its progress in the terminal itself: the same
`status` and `started` events exec streams, as text frames. Then the supervisor's /pty is connected and frames
pass both ways untouched — binary frames are terminal bytes, text frames control (the supervisor checks the
client's). Whichever side closes first closes the other: a client that leaves detaches (the session lingers in the
supervisor, which keeps its scrollback for a resume), a shell that exits ends the client's socket after its `exit`
frame. An error before the supervisor's socket is open is an `error` frame, then a close.
"""

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable

from durable.boot import BootOutcome, Listener
from durable.ports import ContainerGone, Socket
from protocol.errors import ProtocolError
from protocol.events import error_event, started_event

log = logging.getLogger("flarebox.terminal")

# WebSocket close codes (RFC 6455 7.4.1)
NORMAL = 1000
GOING_AWAY = 1001
POLICY = 1008  # the request was refused (an error frame says why)
SERVER_ERROR = 1011


def frame(event: dict) -> str:
    return json.dumps(event, ensure_ascii=False, separators=(",", ":"))


async def run(
    client: Socket,
    boot: Callable[[Listener], Awaitable[BootOutcome]],
    connect: Callable[[], Awaitable[Socket]],
) -> None:
    """Boot (progress as frames), connect to the supervisor, relay until either side closes."""

    async def progress(event: dict) -> None:
        with contextlib.suppress(ConnectionError):  # a client gone mid-boot: the boot still finishes
            await client.send(frame(event))

    try:
        outcome = await boot(progress)
        snapshot = outcome.snapshot.to_wire() if outcome.snapshot is not None else None
        backup = outcome.backup.to_wire() if outcome.backup is not None else None
        await progress(started_event(None, outcome.container, snapshot, backup))
        upstream = await connect()
    except ProtocolError as err:
        await _refuse(client, err)
        return
    except ContainerGone as gone:
        await _refuse(client, ProtocolError("container_exited", str(gone) or None))
        return
    except Exception:
        log.exception("a terminal session could not start")
        await _refuse(client, ProtocolError("internal_error"))
        return
    await relay(client, upstream)


async def _refuse(client: Socket, err: ProtocolError) -> None:
    with contextlib.suppress(ConnectionError):
        await client.send(frame(error_event(err.code, err.message)))
    code = SERVER_ERROR if err.status >= 500 else POLICY
    with contextlib.suppress(ConnectionError):
        await client.close(code, err.code)


async def relay(client: Socket, upstream: Socket) -> None:
    """Pass frames both ways until one side closes; then close the other (GOING_AWAY for the supervisor's: the
    client left, so its session is detached, not ended)."""
    to_upstream = asyncio.ensure_future(_pump(client, upstream))
    to_client = asyncio.ensure_future(_pump(upstream, client))
    try:
        done, _ = await asyncio.wait({to_upstream, to_client}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (to_upstream, to_client):
            task.cancel()
        await asyncio.gather(to_upstream, to_client, return_exceptions=True)
        with contextlib.suppress(Exception):
            await upstream.close(GOING_AWAY)
        with contextlib.suppress(Exception):
            await client.close(NORMAL)


async def _pump(source: Socket, sink: Socket) -> None:
    try:
        while (data := await source.receive()) is not None:
            await sink.send(data)
    except (ConnectionError, ContainerGone):
        pass  # either side gone: the relay ends and closes the other
    except Exception:
        log.debug("a terminal relay ended early", exc_info=True)
