"""The edge (the Worker's logic): auth, routing, request validation and limits, then one call to the workspace.

Order per request: auth → route → query → body limits → body parse → workspace call. Nothing before auth reads
the body or touches a workspace, and every validation error is answered before the workspace is called. The
workspace's Response (often a stream) is returned untouched.
"""

import logging
import traceback

from durable.ports import Response, WorkspaceDirectory
from durable.settings import Settings
from protocol import PROTOCOL_VERSION
from protocol.errors import ProtocolError
from worker.auth import TokenCheck
from worker.prepare import NO_PARAMS
from worker.query import parse_query
from worker.request import EdgeRequest
from worker.routes import MethodNotAllowed, match

log = logging.getLogger("flarebox.edge")


class Edge:
    def __init__(self, *, token: str | None, settings: Settings, directory: WorkspaceDirectory, version: str):
        self._auth = TokenCheck(token)
        self._token = token
        self._settings = settings
        self._directory = directory
        self._version = version

    async def handle(self, req: EdgeRequest) -> Response:
        try:
            self._auth.check(req.headers.get("authorization"))
            route = match(req.method, req.path)
            endpoint = route.endpoint
            if endpoint is None:
                parse_query(req.query, NO_PARAMS)
                return Response.json(200, {"ok": True, "protocol": PROTOCOL_VERSION, "version": self._version})
            args = await endpoint.prepare(req, route.request_id, self._settings)
            body = req.body.stream if endpoint.operation.streams_body and req.body is not None else None
            stub = self._directory.get(route.namespace, route.workspace)
            return await stub.call(endpoint.operation.name, args, body)
        except MethodNotAllowed as err:
            response = Response.error(err)
            response.headers["allow"] = err.allow
            return response
        except ProtocolError as err:
            return Response.error(self._redacted(err))
        except Exception as exc:  # never leak exception text to the client
            self._log_unexpected(req, exc)
            return Response.error(ProtocolError("internal_error"))

    def _redacted(self, err: ProtocolError) -> ProtocolError:
        """Messages may quote what the client sent (an unknown field or query key): never quote the token back."""
        if self._token and self._token in err.message:
            return ProtocolError(err.code, err.message.replace(self._token, "[redacted]"))
        return err

    def _log_unexpected(self, req: EdgeRequest, exc: Exception) -> None:
        text = "".join(traceback.format_exception(exc))
        if self._token:
            text = text.replace(self._token, "[redacted]")  # belt and braces: the token never reaches a log
        log.error("internal error on %s %s\n%s", req.method, req.path[:200], text)
