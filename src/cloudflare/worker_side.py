"""The Worker's side of the glue: the edge's request and response types over JS requests, the workspaces whose
stubs are Durable Object stubs (`env.WORKSPACE.getByName("<namespace>/<workspace>")`), and the stub of the one
directory object (`env.DIRECTORY.getByName("directory")`)."""

import json
from typing import Any

import js
from pyodide.ffi import JsProxy

from cloudflare import wire
from cloudflare.jsutil import header_pairs, headers_dict, is_null, jsobj, to_bytes, uint8
from cloudflare.sockets import ClientUpgrade, SocketResponse
from durable import operations as ops
from durable.ports import JSON_TYPE, Response
from protocol.errors import ERRORS, ProtocolError, http_status
from worker.request import EdgeRequest

# A workspace's JSON answers (status objects, snapshot lists, errors) are small; past this one is a bug, not data.
WORKSPACE_JSON_BYTES = 1024 * 1024
# The directory is our own object, so this only keeps a runaway answer from taking the isolate down. Its largest
# legitimate answer is a page of audit records, each holding a command's text.
DIRECTORY_ANSWER_BYTES = 32 * 1024 * 1024
# Statuses whose Response may not have a body (the Response constructor throws on one)
NULL_BODY_STATUSES = frozenset((101, 204, 205, 304))


class JsRequestBody:
    """ports.RequestBody over a JS request body (ReadableStream)."""

    def __init__(self, js_body: Any):
        self._body = None if is_null(js_body) else js_body

    async def read(self, limit: int) -> bytes:
        if self._body is None:
            return b""
        reader = self._body.getReader()
        chunks: list[bytes] = []
        size = 0
        while True:
            result = await reader.read()
            if result.done:
                break
            chunk = to_bytes(result.value)
            size += len(chunk)
            if size > limit:
                await reader.cancel()
                raise ProtocolError("payload_too_large", f"the body is limited to {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    @property
    def stream(self) -> Any:
        return self._body

    def stream_at_most(self, limit: int) -> Any:
        # Cloudflare refuses a request body over the plan's limit (413) before the Worker runs: 100 MB on Free and
        # Pro, limits.MAX_PROXY_BODY_BYTES. Business and Enterprise allow more, so there a proxied body may be
        # larger than the standalone runtime would let through.
        return self._body


def _split_url(url: str) -> tuple[str, str]:
    """(raw path, raw query) of an absolute URL, without decoding anything."""
    rest = url.split("://", 1)[-1]
    slash = rest.find("/")
    target = rest[slash:] if slash >= 0 else "/"
    target = target.split("#", 1)[0]
    path, _, query = target.partition("?")
    return path, query


def edge_request(js_request: Any) -> EdgeRequest:
    url = str(js_request.url)
    path, query = _split_url(url)
    headers = headers_dict(js_request.headers)
    return EdgeRequest(
        method=str(js_request.method).upper(),
        path=path,
        query=query,
        headers=headers,
        body=JsRequestBody(js_request.body),
        socket=ClientUpgrade.of(headers),  # a WebSocket upgrade: routed by the edge, answered by the object
        # Cloudflare sets CF-Connecting-IP to the client's address, replacing one the client sent
        client_ip=headers.get("cf-connecting-ip", ""),
        scheme=url.split("://", 1)[0].lower(),
    )


def js_response(resp: Response) -> Any:
    """A ports.Response as a JS Response; a stream body passes through untouched. `header_pairs` come after
    `headers`, appended one by one so that several Set-Cookie stay several. A SocketResponse is the 101 that
    hands the runtime its WebSocket."""
    socket = resp.socket if isinstance(resp, SocketResponse) else None
    body = resp.body
    if resp.status in NULL_BODY_STATUSES:
        if isinstance(body, JsProxy):
            body.cancel()  # a relayed 204/304 has nothing to send: its stream (the relay's, empty) is let go
        body = None
    elif isinstance(body, bytes | bytearray):
        body = uint8(bytes(body)) if body else None
    elif is_null(body):
        body = None
    headers = js.Headers.new(jsobj(dict(resp.headers)))
    for name, value in resp.header_pairs:
        headers.append(name, value)
    init = jsobj({"status": resp.status})
    init.headers = headers
    if socket is not None:
        init.status = 101
        init.webSocket = socket
        body = None
    return js.Response.new(body, init)


class DurableObjectStub:
    """ports.WorkspaceStub: one workspace's Durable Object."""

    def __init__(self, namespace_binding: Any, namespace: str, workspace: str):
        self._key = f"{namespace}/{workspace}"
        self._binding = namespace_binding
        self._stub: Any = None

    async def call(self, op: str, args: Any, body: Any = None) -> Response:
        if self._stub is None:
            self._stub = self._binding.getByName(self._key)
        operation = ops.OPERATIONS.get(op)
        if operation is not None and operation.socket:
            return await self._upgrade(op, args, body)
        headers = {wire.WORKSPACE_HEADER: self._key}
        if body is None:
            headers["content-type"] = "application/json"
            payload = uint8(wire.args_body(args))
        else:
            headers[wire.ARGS_HEADER] = wire.args_header(args)
            payload = body
        init = jsobj({"method": "POST", "headers": headers})
        init.body = payload
        if body is not None:
            init.duplex = "half"  # a streamed request body (required by the fetch standard; ignored where moot)
        # The SDK's stub wrapper fetches a JS Request as is; passing the body inside a Request (rather than as
        # fetch options next to it) keeps a stream from being locked by two Request constructions.
        request = js.Request.new(wire.call_url(op), init)
        try:
            js_resp = (await self._stub.fetch(request)).js_object
        except Exception as exc:  # the SDK raises its own error types for a failed fetch
            raise ProtocolError("internal_error", "the workspace object did not answer") from exc
        return await self._answer(op, js_resp)

    async def _upgrade(self, op: str, args: Any, upgrade: ClientUpgrade | None) -> Response:
        """A WebSocket operation: the client's upgrade, forwarded. The runtime passes a WebSocket through a stub
        only on a GET with `Upgrade: websocket` (any other method arrives as a GET, a body is dropped), so the args
        go in their header. The object's 101 carries its pair's client end, returned as is in the Worker's own 101
        (the runtime couples it to the client); any other answer is the object's refusal, passed on as usual."""
        if upgrade is None:
            raise ProtocolError("websocket_required")
        headers = {wire.WORKSPACE_HEADER: self._key, wire.ARGS_HEADER: wire.args_header(args), "upgrade": "websocket"}
        request = js.Request.new(wire.call_url(op), jsobj({"method": "GET", "headers": headers}))
        try:
            js_resp = (await self._stub.fetch(request)).js_object
        except Exception as exc:
            raise ProtocolError("internal_error", "the workspace object did not answer") from exc
        socket = getattr(js_resp, "webSocket", None)
        if int(js_resp.status) != 101:
            return await self._answer(op, js_resp)
        if is_null(socket):
            raise ProtocolError("internal_error", "the workspace object answered the upgrade without a WebSocket")
        selected = {"sec-websocket-protocol": upgrade.subprotocol} if upgrade.subprotocol else {}
        return SocketResponse(status=101, body=None, headers=selected, socket=socket)

    async def _answer(self, op: str, js_resp: Any) -> Response:
        if op == ops.PROXY.name:
            # a proxied answer, relayed as it is: never read (a service's JSON may be large), every header kept
            body = None if is_null(js_resp.body) else js_resp.body
            return Response(status=int(js_resp.status), body=body, header_pairs=header_pairs(js_resp.headers))
        headers = headers_dict(js_resp.headers)
        if is_null(js_resp.body):
            body: Any = b""
        elif _is_json(headers):
            # as bytes, so the edge can read them (error codes for the audit log, {"deleted": true} for the index,
            # listed status objects); streams (exec output, downloads) pass through untouched
            body = await _read_json_answer(js_resp.body)
        else:
            body = js_resp.body
        return Response(status=int(js_resp.status), body=body, headers=headers)


def _is_json(headers: dict[str, str]) -> bool:
    return headers.get("content-type", "").split(";", 1)[0].strip().lower() == JSON_TYPE


async def _read_json_answer(js_body: Any) -> bytes:
    try:
        return await JsRequestBody(js_body).read(WORKSPACE_JSON_BYTES)
    except ProtocolError as err:
        raise ProtocolError("internal_error", "the workspace object's answer is over its limit") from err
    except Exception as exc:
        raise ProtocolError("internal_error", "the workspace object's answer broke off") from exc


class DurableObjectWorkspaces:
    """ports.Workspaces over the WORKSPACE Durable Object namespace."""

    def __init__(self, namespace_binding: Any):
        self._binding = namespace_binding

    def get(self, namespace: str, workspace: str) -> DurableObjectStub:
        return DurableObjectStub(self._binding, namespace, workspace)


class DirectoryObjectStub:
    """ports.DirectoryStub over the DIRECTORY Durable Object namespace: one POST per call (cloudflare/wire.py).

    A refusal the directory answered comes back as its ProtocolError; anything else (a failed fetch, a broken or
    unexpected answer, the directory's own internal_error) is a RuntimeError, which the edge answers 503
    directory_unavailable — the same as an in-process directory raising something other than a ProtocolError."""

    def __init__(self, namespace_binding: Any):
        self._binding = namespace_binding
        self._stub: Any = None

    async def call(self, op: str, args: dict[str, Any]) -> Any:
        if self._stub is None:
            self._stub = self._binding.getByName(wire.DIRECTORY_NAME)
        init = jsobj({"method": "POST", "headers": {"content-type": JSON_TYPE}})
        init.body = uint8(wire.json_bytes(args))
        request = js.Request.new(wire.directory_url(op), init)
        try:
            js_resp = (await self._stub.fetch(request)).js_object
            raw = await JsRequestBody(js_resp.body).read(DIRECTORY_ANSWER_BYTES)
        except Exception as exc:  # the SDK's error types for a failed fetch, a broken or oversized body
            raise RuntimeError(f"the directory object did not answer {op}") from exc
        status = int(js_resp.status)
        try:
            answer = json.loads(raw)
        except ValueError:
            raise RuntimeError(f"the directory object's answer to {op} is not JSON ({status})") from None
        if status == 200:
            return answer
        raise _refusal(op, status, answer)


def _refusal(op: str, status: int, answer: Any) -> Exception:
    """The ProtocolError of a directory's error answer, when it is one the directory may give."""
    error = answer.get("error") if isinstance(answer, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if (
        isinstance(code, str)
        and code in ERRORS
        and code != "internal_error"  # the directory failed: unavailable, not the request's fault
        and http_status(code) == status
        and isinstance(message, str)
    ):
        return ProtocolError(code, message)
    return RuntimeError(f"the directory object answered {op} with {status} ({str(code)[:64]!r})")
