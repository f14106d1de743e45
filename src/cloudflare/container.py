"""ports.Container over `ctx.container`, the Durable Object's Cloudflare Container.

`ctx.container` is a raw JS object (the SDK converts nothing for it): options go in as plain JS objects (`jsobj`).
Snapshots are Cloudflare container snapshots; their handles (`{id, size, name}`) live in this object's SQLite; a restore
passes its id back (`start({containerSnapshot: {id}})`). Cloudflare deletes a snapshot
SNAPSHOT_LIFETIME_DAYS after it was made or last restored, on its own: each SnapshotInfo carries that expiry, and the
workspace asks `snapshot_expiry` for the new one after each restore.
"""

import asyncio
import json
import logging
from typing import Any

import js
from pyodide.ffi import JsException, create_proxy

from cloudflare import streams
from cloudflare.jsutil import header_pairs, headers_dict, is_null, jsobj, to_bytes, uint8
from cloudflare.sockets import JsSocket
from durable.ports import ContainerGone, SnapshotInfo, StartSpec
from durable.supervisor_client import error_of
from protocol import limits
from protocol.errors import ProtocolError
from protocol.limits import CONTROL_BODY_BYTES

log = logging.getLogger("flarebox.cloudflare.container")

SUPERVISOR_PORT = 8080
SUPERVISOR_ORIGIN = "http://container"
# setInactivityTimeout is only a last resort (a container the idle alarm failed to stop must not run for ever): it
# fires this long after the idle alarm should have snapshotted and stopped the container.
INACTIVITY_MARGIN_SECONDS = 1800
# How long Cloudflare keeps a container snapshot after it was made or last restored; a restore after that fails.
# The platform's rule, not a setting.
SNAPSHOT_LIFETIME_DAYS = 30
SNAPSHOT_LIFETIME_MS = SNAPSHOT_LIFETIME_DAYS * 24 * 3600 * 1000
# How long the supervisor may take to answer a WebSocket upgrade (open the terminal, or refuse it), and to send the
# whole of a refusal: a local process that answers at once or is wedged.
CONNECT_SECONDS = 10

_HANDLES_TABLE = """CREATE TABLE IF NOT EXISTS cf_container_snapshots (
  id TEXT PRIMARY KEY, handle TEXT NOT NULL, created_at_ms INTEGER NOT NULL)"""


class JsContainerResponse:
    """ports.ContainerResponse over a JS Response from the container's port. `read_seconds` bounds a whole
    `read()` (a control answer): a drip of bytes must not hold a request for ever."""

    def __init__(self, js_response: Any, read_seconds: float | None = None):
        self._js = js_response
        self.status = int(js_response.status)
        self.headers = headers_dict(js_response.headers)
        self.header_pairs = header_pairs(js_response.headers)
        self.body = None if is_null(js_response.body) else js_response.body
        self._read_seconds = read_seconds

    async def read(self, limit: int = CONTROL_BODY_BYTES) -> bytes:
        """Chunk by chunk, never arrayBuffer(): a hostile sandbox's endless answer must not fill the isolate."""
        if self.body is None:
            return b""
        try:
            reader = self.body.getReader()
        except JsException as exc:
            raise ContainerGone("the container stopped while answering") from exc
        if self._read_seconds is None:
            return await self._read(reader, limit)
        try:
            return await asyncio.wait_for(self._read(reader, limit), self._read_seconds)
        except TimeoutError:
            reader.cancel().then(_IGNORE, _IGNORE)  # drops the connection, unread
            raise ContainerGone(f"the container did not finish a control answer in {self._read_seconds:g} s") from None

    async def _read(self, reader: Any, limit: int) -> bytes:
        try:
            chunks: list[bytes] = []
            size = 0
            while not (result := await reader.read()).done:
                chunk = to_bytes(result.value)
                size += len(chunk)
                if size > limit:
                    await reader.cancel()
                    raise ContainerGone(f"the container sent more than {limit} bytes for a control answer")
                chunks.append(chunk)
            return b"".join(chunks)
        except JsException as exc:
            raise ContainerGone("the container stopped while answering") from exc

    async def json(self) -> Any:
        return json.loads(await self.read())


class CloudflareContainer:
    def __init__(self, ctx: Any, storage: Any, clock: Any, idle_seconds: int):
        self._container = ctx.container
        self._storage = storage  # ports.Storage, for snapshot handles
        self._clock = clock
        self._inactivity_ms = (idle_seconds + INACTIVITY_MARGIN_SECONDS) * 1000
        self._monitor: asyncio.Future | None = None
        storage.sql(_HANDLES_TABLE)
        if self.running():
            # A new instance of this object (after an eviction or a deploy) finds its container still running:
            # watch it again and re-arm the last-resort stop.
            self._watch()

    def running(self) -> bool:
        return bool(self._container.running)

    def has_disk(self) -> bool:
        return False  # a Cloudflare container's disk dies with it; only a snapshot brings files back

    async def start(self, spec: StartSpec) -> None:
        if self.running():
            # The workspace starts only a container it considers gone; one still running here was left by a boot
            # an eviction interrupted. start() would throw on it, so it goes first.
            log.warning("a stale container is still running; destroying it before the start")
            await self.destroy()
        options: dict[str, Any] = {
            "instance": spec.instance,
            "env": dict(spec.env),
            "enableInternet": bool(spec.enable_internet),
        }
        if spec.snapshot_id is not None:
            rows = self._storage.sql("SELECT handle FROM cf_container_snapshots WHERE id = ?", spec.snapshot_id)
            if not rows:
                raise ProtocolError("snapshot_damaged", "the snapshot's handle is missing from this workspace")
            handle = json.loads(rows[0]["handle"])
        else:
            handle = None
        js_options = jsobj(options)
        if handle is not None:
            # ContainerSnapshotRestoreParams is {id} (workers-types; the runtime reads nothing else of it)
            js_options.containerSnapshot = jsobj({"id": str(handle["id"])})
        else:
            js_options.image = self._image_ref(spec.image)
        try:
            # start() returns at once: only a call the runtime refuses outright (a wrong option type, a container
            # already running) throws here. A start that fails later (no capacity, a bad image, a snapshot the
            # platform no longer has) shows as `running` turning false and monitor() rejecting, which
            # supervisor_client.wait_ready turns into container_unavailable.
            self._container.start(js_options)
        except JsException as exc:
            log.error("container start failed: %s", exc)
            raise ProtocolError("container_unavailable", "the container could not be started") from exc
        self._watch()

    def _image_ref(self, name: str) -> str:
        # Named images of the "durable_object" scheduling policy appear as ctx.container.images.<name>
        # (a digest-pinned reference); the name itself is passed when the runtime has no such map.
        images = getattr(self._container, "images", None)
        ref = None if is_null(images) else getattr(images, name, None)
        return name if is_null(ref) else str(ref)

    def _watch(self) -> None:
        """Follow the container's life with monitor() (which also keeps this object in memory while it runs) and
        arm the last-resort inactivity stop."""
        self._monitor = asyncio.ensure_future(self._await_exit(self._container.monitor()))
        self._clock.spawn(self._arm_inactivity_timeout())

    async def _await_exit(self, promise: Any) -> None:
        try:
            await promise
            log.info("container exited")
        except JsException as exc:
            log.info("container stopped: %s", exc)

    async def _arm_inactivity_timeout(self) -> None:
        try:
            await self._container.setInactivityTimeout(self._inactivity_ms)
        except JsException as exc:
            log.warning("setInactivityTimeout failed: %s", exc)

    async def fetch(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> JsContainerResponse:
        """A request to the supervisor. With `timeout`, the whole exchange is bounded by it; without, the silence
        guard applies (streams.SILENCE_SECONDS): the head must come that long after the request (and its body)
        went out, and a supervisor stream that goes silent that long is ended by the sink relaying it."""
        if not self.running():
            raise ContainerGone("the container is not running")
        js_init, upload = _request_init(method, body, headers)
        silence = streams.SILENCE_SECONDS
        controller = None
        if timeout is not None:
            js_init.signal = js.AbortSignal.timeout(int(timeout * 1000))
        else:
            # aborted only when no head came: aborting later would cut the body being relayed
            controller = js.AbortController.new()
            js_init.signal = controller.signal
        try:
            pending = self._container.getTcpPort(SUPERVISOR_PORT).fetch(SUPERVISOR_ORIGIN + path, js_init)
            if controller is None:
                js_response = await pending
            else:
                js_response = await _head(pending, upload, silence)
        except TimeoutError:
            controller.abort()
            log.warning("the supervisor sent no answer to %s %s in %g s", method, path.split("?", 1)[0], silence)
            raise ContainerGone(streams.silence_message(silence)) from None
        except JsException as exc:
            log.debug("container fetch %s %s failed: %s", method, path.split("?", 1)[0], exc)
            raise ContainerGone("the container did not answer") from exc
        response = JsContainerResponse(js_response, read_seconds=timeout if timeout is not None else silence)
        if response.body is not None and _is_ndjson(response.headers):
            streams.expect_heartbeats(response.body)  # exec, reattach and service-log streams heartbeat
        return response

    async def fetch_port(
        self,
        port: int,
        method: str,
        path: str,
        *,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> JsContainerResponse:
        if not self.running():
            raise ContainerGone("the container is not running")
        js_init, _upload = _request_init(method, body, headers)
        # Only the wait for the head is bounded: a signal timing out the whole fetch would also cut a long body
        # (an SSE stream). The controller is aborted only when no head came, to free the connection.
        controller = js.AbortController.new()
        js_init.signal = controller.signal
        try:
            pending = self._container.getTcpPort(port).fetch(f"http://127.0.0.1:{port}{path}", js_init)
            js_response = await asyncio.wait_for(_awaited(pending), limits.PROXY_HEAD_SECONDS)
        except TimeoutError:
            controller.abort()
            raise ProtocolError("upstream_timeout", f"port {port} sent no answer in time") from None
        except JsException as exc:
            if not self.running():
                raise ContainerGone("the container stopped during the request") from exc
            log.debug("port %d fetch %s failed: %s", port, method, exc)
            raise ProtocolError("upstream_unavailable", f"nothing answers on port {port}") from None
        return JsContainerResponse(js_response)

    async def connect(self, path: str) -> JsSocket:
        """A WebSocket to the supervisor: the port's fetch with `Upgrade: websocket` answers a 101 carrying
        `webSocket` (accepted here), or the supervisor's refusal of the upgrade — a plain HTTP error, read like a
        control answer (capped, timed) and raised as its ProtocolError."""
        if not self.running():
            raise ContainerGone("the container is not running")
        js_init = jsobj({"method": "GET", "headers": {"upgrade": "websocket"}})
        # aborted only when no answer came: a signal on the fetch could cut the socket later
        controller = js.AbortController.new()
        js_init.signal = controller.signal
        try:
            pending = self._container.getTcpPort(SUPERVISOR_PORT).fetch(SUPERVISOR_ORIGIN + path, js_init)
            js_response = await asyncio.wait_for(_awaited(pending), CONNECT_SECONDS)
        except TimeoutError:
            controller.abort()
            raise ContainerGone(f"the supervisor did not answer the upgrade in {CONNECT_SECONDS} s") from None
        except JsException as exc:
            log.debug("container upgrade %s failed: %s", path.split("?", 1)[0], exc)
            raise ContainerGone("the container did not answer") from exc
        ws = getattr(js_response, "webSocket", None)
        if int(js_response.status) != 101 or is_null(ws):
            refusal = JsContainerResponse(js_response, read_seconds=CONNECT_SECONDS)
            raise await error_of(refusal, fallback="internal_error")
        socket = JsSocket(ws)
        try:
            await socket.accept()
        except ConnectionError as exc:
            raise ContainerGone("the supervisor's socket could not be accepted") from exc
        return socket

    async def snapshot(self) -> SnapshotInfo:
        asked_ms = self._clock.now_ms()
        name = f"flarebox-{asked_ms}"
        try:
            js_handle = await self._container.snapshotContainer(jsobj({"name": name}))
        except JsException as exc:
            log.error("snapshotContainer failed: %s", exc)
            raise ProtocolError("snapshot_failed") from exc
        handle = json.loads(str(js.JSON.stringify(js_handle)))
        info = SnapshotInfo(
            id=str(handle["id"]),
            size=int(handle.get("size") or 0),
            created_at_ms=self._clock.now_ms(),
            # counted from before the call: the platform made it no earlier, so this never outlives the real one
            expires_at_ms=self.snapshot_expiry(asked_ms),
        )
        self._storage.sql(
            "INSERT OR REPLACE INTO cf_container_snapshots (id, handle, created_at_ms) VALUES (?, ?, ?)",
            info.id,
            json.dumps(handle),
            info.created_at_ms,
        )
        return info

    def snapshot_expiry(self, alive_from_ms: int) -> int | None:
        return alive_from_ms + SNAPSHOT_LIFETIME_MS

    async def snapshot_ref(self, snapshot_id: str) -> dict[str, Any]:
        rows = self._storage.sql("SELECT handle, created_at_ms FROM cf_container_snapshots WHERE id = ?", snapshot_id)
        if not rows:
            raise ProtocolError("snapshot_not_found")
        return {"handle": json.loads(rows[0]["handle"]), "created_at_ms": int(rows[0]["created_at_ms"])}

    async def adopt_snapshot(self, ref: dict[str, Any]) -> SnapshotInfo:
        """A fork records the source's handle: a container snapshot belongs to the application, not to one object,
        and Cloudflare has no delete, so the source forgetting its handle later takes nothing from the fork. Its
        life is the source's: counted from when it was made (a restore by either renews it on the platform)."""
        handle, created = ref["handle"], int(ref["created_at_ms"])
        info = SnapshotInfo(
            id=str(handle["id"]),
            size=int(handle.get("size") or 0),
            created_at_ms=created,
            expires_at_ms=self.snapshot_expiry(created),
        )
        self._storage.sql(
            "INSERT OR REPLACE INTO cf_container_snapshots (id, handle, created_at_ms) VALUES (?, ?, ?)",
            info.id,
            json.dumps(handle),
            created,
        )
        return info

    async def delete_snapshot(self, snapshot_id: str) -> None:
        # Cloudflare expires snapshots on its own (SNAPSHOT_LIFETIME_DAYS) and has no delete; forgetting the handle
        # is all there is to do.
        self._storage.sql("DELETE FROM cf_container_snapshots WHERE id = ?", snapshot_id)

    async def destroy(self) -> None:
        if not self.running():
            return
        try:
            await self._container.destroy()
        except JsException as exc:
            log.warning("container destroy: %s", exc)
        if self._monitor is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._monitor), 30)
            except TimeoutError:
                log.warning("container still running 30 s after destroy()")


def _request_init(method: str, body: Any, headers: dict[str, str] | None) -> tuple[Any, Any]:
    """The fetch init, and the promise of a streamed body's pipe into its FixedLengthStream (else None).

    A stream with a declared length (a file upload: content-length in `headers`) goes through
    FixedLengthStream(length): workerd sends a stream of unknown length chunked and drops an explicit
    content-length header (tests/workerd), and the supervisor refuses an upload without one (length_required).
    Through FixedLengthStream the body has that length whatever the Worker handed over; a body of another length
    fails the request instead of reaching the supervisor."""
    js_init = jsobj({"method": method, "headers": dict(headers or {})})
    upload = None
    if not is_null(body):
        if isinstance(body, bytes | bytearray):
            js_init.body = uint8(bytes(body))
        else:
            length = _declared_length(headers)
            if length == 0:
                body.cancel().then(_IGNORE, _IGNORE)  # nothing to send: an empty body of known length
                js_init.body = uint8(b"")
            else:
                if length is not None:
                    fixed = js.FixedLengthStream.new(length)
                    upload = body.pipeTo(fixed.writable)
                    upload.then(_IGNORE, _IGNORE)  # its failure shows as the fetch's; never an unhandled rejection
                    body = fixed.readable
                js_init.body = body
                js_init.duplex = "half"  # a streamed request body (the fetch standard asks for it)
    return js_init, upload


def _declared_length(headers: dict[str, str] | None) -> int | None:
    for name, value in (headers or {}).items():
        if name.lower() == "content-length":
            value = value.strip()
            return int(value) if value.isdigit() else None
    return None


def _is_ndjson(headers: dict[str, str]) -> bool:
    return headers.get("content-type", "").split(";", 1)[0].strip().lower() == "application/x-ndjson"


async def _head(pending: Any, upload: Any, seconds: float) -> Any:
    """The response head of `pending`, waited for at most `seconds` after the request body went out (TimeoutError
    past that). An upload's head comes only once its body is through, and a slow client is not the container's
    silence."""
    fetched = asyncio.ensure_future(_awaited(pending))
    if upload is not None:
        sent = asyncio.ensure_future(_awaited(upload))
        sent.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: the fetch reports it
        await asyncio.wait({fetched, sent}, return_when=asyncio.FIRST_COMPLETED)
    return await asyncio.wait_for(fetched, seconds)


async def _awaited(promise: Any) -> Any:
    """A JS promise as a coroutine, for asyncio.wait_for."""
    return await promise


# One handler for the rejections nobody awaits (created once: a proxy per call would leak)
_IGNORE = create_proxy(lambda *_args: None)
