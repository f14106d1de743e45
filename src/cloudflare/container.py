"""ports.Container over `ctx.container`, the Durable Object's Cloudflare Container.

`ctx.container` is a raw JS object (the SDK converts nothing for it): options go in as plain JS objects (`jsobj`).
Snapshots are Cloudflare container snapshots; their handles (`{id, size, name}`) live in this object's SQLite so
a restore can pass the whole handle back to `start({containerSnapshot})`.
"""

import asyncio
import json
import logging
from typing import Any

import js
from pyodide.ffi import JsException

from cloudflare.jsutil import headers_dict, is_null, jsobj, to_bytes, uint8
from durable.ports import ContainerGone, SnapshotInfo, StartSpec
from protocol.errors import ProtocolError
from protocol.limits import CONTROL_BODY_BYTES

log = logging.getLogger("flarebox.cloudflare.container")

SUPERVISOR_PORT = 8080
SUPERVISOR_ORIGIN = "http://container"
# setInactivityTimeout is only a last resort (a container the idle alarm failed to stop must not run for ever): it
# fires this long after the idle alarm should have snapshotted and stopped the container.
INACTIVITY_MARGIN_SECONDS = 1800

_HANDLES_TABLE = """CREATE TABLE IF NOT EXISTS cf_container_snapshots (
  id TEXT PRIMARY KEY, handle TEXT NOT NULL, created_at_ms INTEGER NOT NULL)"""


class JsContainerResponse:
    """ports.ContainerResponse over a JS Response from the container's port."""

    def __init__(self, js_response: Any):
        self._js = js_response
        self.status = int(js_response.status)
        self.headers = headers_dict(js_response.headers)
        self.body = None if is_null(js_response.body) else js_response.body

    async def read(self, limit: int = CONTROL_BODY_BYTES) -> bytes:
        """Chunk by chunk, never arrayBuffer(): a hostile sandbox's endless answer must not fill the isolate."""
        if self.body is None:
            return b""
        try:
            reader = self.body.getReader()
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
            js_options.containerSnapshot = jsobj(handle)
        else:
            js_options.image = self._image_ref(spec.image)
        try:
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
        if not self.running():
            raise ContainerGone("the container is not running")
        init: dict[str, Any] = {"method": method, "headers": dict(headers or {})}
        js_init = jsobj(init)
        if body is not None:
            if isinstance(body, bytes | bytearray):
                js_init.body = uint8(bytes(body))
            else:
                js_init.body = body
                js_init.duplex = "half"  # a streamed request body (the fetch standard asks for it)
        if timeout is not None:
            js_init.signal = js.AbortSignal.timeout(int(timeout * 1000))
        try:
            port = self._container.getTcpPort(SUPERVISOR_PORT)
            return JsContainerResponse(await port.fetch(SUPERVISOR_ORIGIN + path, js_init))
        except JsException as exc:
            log.debug("container fetch %s %s failed: %s", method, path.split("?", 1)[0], exc)
            raise ContainerGone("the container did not answer") from exc

    async def snapshot(self) -> SnapshotInfo:
        name = f"flarebox-{self._clock.now_ms()}"
        try:
            js_handle = await self._container.snapshotContainer(jsobj({"name": name}))
        except JsException as exc:
            log.error("snapshotContainer failed: %s", exc)
            raise ProtocolError("snapshot_failed") from exc
        handle = json.loads(str(js.JSON.stringify(js_handle)))
        info = SnapshotInfo(id=str(handle["id"]), size=int(handle.get("size") or 0), created_at_ms=self._clock.now_ms())
        self._storage.sql(
            "INSERT OR REPLACE INTO cf_container_snapshots (id, handle, created_at_ms) VALUES (?, ?, ?)",
            info.id,
            json.dumps(handle),
            info.created_at_ms,
        )
        return info

    async def delete_snapshot(self, snapshot_id: str) -> None:
        # Cloudflare expires snapshots on its own (an implicit TTL); forgetting the handle is all there is to do.
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
