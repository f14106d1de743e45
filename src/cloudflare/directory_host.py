"""The directory Durable Object's side of the glue: the deployment's one `directory.Directory` (keys, the workspace
index, the audit log) over the object's SQLite, answering the calls of `worker_side.DirectoryObjectStub`.

    POST https://directory/call/<op>   body: the op's args as JSON   →   200 JSON result, or a protocol error
"""

import logging
from typing import Any

from cloudflare import wire
from cloudflare.clock import JsClock
from cloudflare.settings import settings_from_env
from cloudflare.storage import DurableStorage
from cloudflare.worker_side import JsRequestBody
from directory.directory import Directory
from durable.ports import Response
from protocol import limits
from protocol.errors import ProtocolError

log = logging.getLogger("flarebox.cloudflare.directory_host")


class DirectoryHost:
    def __init__(self, ctx: Any, env: Any):
        self._directory = Directory(DurableStorage(ctx.storage), JsClock(ctx), settings_from_env(env))

    async def fetch(self, js_request: Any) -> Response:
        try:
            op = wire.op_from_url(str(js_request.url))
            if not op:
                raise ProtocolError("not_found")
            # args are at most a JSON request body's worth (an audit record holds a command of at most 64 KiB)
            raw = await JsRequestBody(js_request.body).read(limits.MAX_BODY_BYTES * 2)
            return Response.json(200, await self._directory.call(op, wire.decode_directory_args(raw)))
        except ProtocolError as err:
            return Response.error(err)
        except Exception:
            log.exception("directory call failed")
            return Response.error(ProtocolError("internal_error"))
