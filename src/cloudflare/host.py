"""The Durable Object's side of the glue: one `durable.Workspace` per object, over the Cloudflare adapters.

The object learns which workspace it is from the first call (the Worker names it in a header) and keeps that in
its own SQLite, so an alarm that wakes a fresh instance (after an eviction) still knows.
"""

import logging
from typing import Any

from cloudflare import wire
from cloudflare.alarm import DurableAlarm
from cloudflare.backups import R2BackupStore
from cloudflare.cipher import WebCryptoCipher
from cloudflare.clock import JsClock
from cloudflare.container import CloudflareContainer
from cloudflare.jsutil import is_null
from cloudflare.settings import env_var, settings_from_env
from cloudflare.sockets import JsSocket, SocketResponse, is_upgrade, socket_pair
from cloudflare.storage import DurableStorage
from cloudflare.streams import JsStreams
from cloudflare.worker_side import JsRequestBody
from durable import operations as ops
from durable.ports import Response
from durable.workspace import Workspace
from protocol import limits
from protocol.errors import ProtocolError

log = logging.getLogger("flarebox.cloudflare.host")

_IDENTITY_TABLE = "CREATE TABLE IF NOT EXISTS cf_identity (key TEXT PRIMARY KEY, namespace TEXT, name TEXT)"


class WorkspaceHost:
    def __init__(self, ctx: Any, env: Any):
        self._settings = settings_from_env(env)
        self._storage = DurableStorage(ctx.storage)
        self._alarm = DurableAlarm(ctx.storage)
        self._clock = JsClock(ctx)
        self._container = CloudflareContainer(ctx, self._storage, self._clock, self._settings.idle_seconds)
        self._streams = JsStreams()
        self._cipher = WebCryptoCipher(env_var(env, "SECRETS_KEY"))  # a secret (wrangler secret put), not a var
        # the BACKUPS R2 bucket binding (wrangler.jsonc r2_buckets); absent: backups_unavailable
        self._backups = R2BackupStore(getattr(env, "BACKUPS", None))
        self._storage.sql(_IDENTITY_TABLE)
        self._workspace: Workspace | None = None
        rows = self._storage.sql("SELECT namespace, name FROM cf_identity WHERE key = 'self'")
        if rows:
            self._build(rows[0]["namespace"], rows[0]["name"])

    def _build(self, namespace: str, name: str) -> Workspace:
        self._workspace = Workspace(
            namespace=namespace,
            name=name,
            settings=self._settings,
            storage=self._storage,
            alarm=self._alarm,
            clock=self._clock,
            container=self._container,
            streams=self._streams,
            cipher=self._cipher,
            backups=self._backups,
        )
        return self._workspace

    def _workspace_for(self, key: str | None) -> Workspace:
        if self._workspace is not None:
            return self._workspace
        if is_null(key) or "/" not in str(key):
            raise ProtocolError("internal_error", "the call did not name its workspace")
        namespace, name = str(key).split("/", 1)
        self._storage.sql(
            "INSERT OR REPLACE INTO cf_identity (key, namespace, name) VALUES ('self', ?, ?)", namespace, name
        )
        return self._build(namespace, name)

    async def fetch(self, js_request: Any) -> Response:
        try:
            path = str(js_request.url).split("://", 1)[-1]
            op = wire.op_from_path(path[path.find("/") :])
            if not op:
                raise ProtocolError("not_found")
            workspace = self._workspace_for(js_request.headers.get(wire.WORKSPACE_HEADER))
            raw_args = js_request.headers.get(wire.ARGS_HEADER)
            operation = ops.OPERATIONS.get(op)
            if operation is not None and operation.socket:
                return await self._upgrade(workspace, op, raw_args, js_request)
            if not is_null(raw_args):
                args, body = wire.decode_args(op, str(raw_args)), js_request.body
            else:
                raw = await JsRequestBody(js_request.body).read(limits.MAX_BODY_BYTES * 2)
                args, body = wire.decode_args(op, raw), None
            return await workspace.call(op, args, body)
        except ProtocolError as err:
            return Response.error(err)
        except Exception:
            log.exception("workspace call failed")
            return Response.error(ProtocolError("internal_error"))

    async def _upgrade(self, workspace: Workspace, op: str, raw_args: Any, js_request: Any) -> Response:
        """A WebSocket operation (the terminal): the workspace gets a pair's server end as the client's socket; once
        it accepted it (101), the answer carries the client end, which the Worker hands the client. A refusal
        before that is an ordinary error answer, and the pair is dropped unused."""
        if not is_upgrade(js_request.headers):
            raise ProtocolError("websocket_required")
        if is_null(raw_args):
            raise ProtocolError("internal_error", "the upgrade did not carry its args")
        args = wire.decode_args(op, str(raw_args))
        client, server = socket_pair()
        socket = JsSocket(server)
        try:
            response = await workspace.call(op, args, socket)
        except BaseException:
            await socket.close(1011)  # if it was accepted, nothing may be left listening
            raise
        if response.status == 101:
            return SocketResponse(status=101, body=None, socket=client)
        await socket.close(1011)
        return response

    async def alarm(self) -> None:
        if self._workspace is None:
            log.warning("alarm for a workspace object that never received a call; clearing it")
            await self._alarm.clear()
            return
        await self._workspace.alarm()
