"""The edge (the Worker's logic): auth, routing, request validation and limits, then one call to the workspace.

Order per request: auth → route → query → body limits → body parse → workspace call. Nothing before auth reads
the body or touches a workspace, and every validation error is answered before the workspace is called. The
workspace's Response (often a stream) is returned untouched.
"""

import logging
import traceback
from typing import Any

from durable.ports import Response, WorkspaceDirectory
from durable.settings import Settings
from protocol import PROTOCOL_VERSION, limits
from protocol.errors import ProtocolError
from protocol.validate import (
    parse_exec_request,
    parse_file_mode,
    parse_json_object,
    parse_workspace_config,
    validate_abs_path,
    validate_offset,
)
from worker.auth import TokenCheck
from worker.query import parse_query
from worker.request import EdgeRequest
from worker.routes import MethodNotAllowed, Route, match

log = logging.getLogger("flarebox.edge")

_NO_PARAMS: frozenset[str] = frozenset()


def _content_length(req: EdgeRequest) -> int | None:
    """The declared body length; None when absent. Raises ValueError when malformed."""
    raw = req.headers.get("content-length")
    if raw is None:
        return None
    raw = raw.strip()
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18:
        raise ValueError("malformed Content-Length")
    return int(raw)


def _is_json(content_type: str | None) -> bool:
    return content_type is not None and content_type.split(";", 1)[0].strip().lower() == "application/json"


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
            if route.op == "health":
                parse_query(req.query, _NO_PARAMS)
                return Response.json(200, {"ok": True, "protocol": PROTOCOL_VERSION, "version": self._version})
            args, body = await self._prepare(route, req)
            stub = self._directory.get(route.namespace, route.workspace)
            return await stub.call(route.op, args, body)
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

    async def _prepare(self, route: Route, req: EdgeRequest) -> tuple[dict[str, Any], Any]:
        """Validate the request for `route.op` and build the workspace call's (args, body)."""
        op = route.op
        if op in ("get", "snapshots", "snapshot", "stop", "cancel", "exec", "put_config"):
            parse_query(req.query, _NO_PARAMS)
        if op in ("get", "snapshots", "snapshot", "stop"):
            return {}, None
        if op == "delete":
            params = parse_query(req.query, frozenset({"confirm"}))
            if params.get("confirm") != "true":
                raise ProtocolError("confirm_required")
            return {}, None
        if op == "cancel":
            return {"request_id": route.request_id}, None
        if op == "reattach":
            params = parse_query(req.query, frozenset({"offset"}))
            offset = validate_offset(params["offset"]) if "offset" in params else 0
            return {"request_id": route.request_id, "offset": offset}, None
        if op == "exec":
            obj = await self._read_json(req, empty_ok=False)
            return {"request": parse_exec_request(obj).to_json()}, None
        if op == "put_config":
            obj = await self._read_json(req, empty_ok=True)
            return {"config": self._normalize_config(obj)}, None
        if op == "read_file":
            params = parse_query(req.query, frozenset({"path"}))
            return {"path": self._path_param(params)}, None
        if op == "write_file":
            params = parse_query(req.query, frozenset({"path", "mode"}))
            path = self._path_param(params)
            mode = parse_file_mode(params.get("mode"))
            length = self._upload_length(req)
            return {"path": path, "mode": mode, "length": length}, req.body.stream if req.body is not None else None
        raise ProtocolError("not_found")  # a route without a handler is a bug; answer as unknown

    @staticmethod
    def _path_param(params: dict[str, str]) -> str:
        if "path" not in params:
            raise ProtocolError("invalid_query", "the path parameter is required")
        return validate_abs_path(params["path"])

    def _upload_length(self, req: EdgeRequest) -> int:
        try:
            length = _content_length(req)
        except ValueError:
            length = None
        if length is None:
            raise ProtocolError("length_required")
        if length > self._settings.max_file_write_bytes:
            raise ProtocolError("file_too_large", f"uploads are limited to {self._settings.max_file_write_bytes} bytes")
        return length

    async def _read_json(self, req: EdgeRequest, *, empty_ok: bool) -> dict:
        is_json = _is_json(req.headers.get("content-type"))
        if not is_json and not empty_ok:
            raise ProtocolError("unsupported_media_type")
        try:
            length = _content_length(req)
        except ValueError:
            raise ProtocolError("invalid_json", "malformed Content-Length") from None
        if length is not None and length > limits.MAX_BODY_BYTES:
            raise ProtocolError("payload_too_large", f"JSON bodies are limited to {limits.MAX_BODY_BYTES} bytes")
        data = await req.body.read(limits.MAX_BODY_BYTES) if req.body is not None else b""
        if not is_json:
            # `curl -X PUT` without a body means "all defaults"; a body of another type is refused.
            if data.strip():
                raise ProtocolError("unsupported_media_type")
            return {}
        return parse_json_object(data)

    def _normalize_config(self, obj: dict) -> dict:
        config = parse_workspace_config(obj)
        if config.image not in self._settings.images:
            raise ProtocolError("image_not_found", f"images defined here: {', '.join(self._settings.images)}")
        instance = config.instance or self._settings.default_instance_type
        if instance not in self._settings.allowed_instance_types:
            raise ProtocolError(
                "instance_not_allowed", f"allowed instance types: {', '.join(self._settings.allowed_instance_types)}"
            )
        return {**config.to_json(), "instance": instance}
