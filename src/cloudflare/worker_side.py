"""The Worker's side of the glue: the edge's request and response types over JS requests, and the workspace
directory whose stubs are Durable Object stubs (`env.WORKSPACE.getByName("<namespace>/<workspace>")`)."""

from typing import Any

import js

from cloudflare import wire
from cloudflare.jsutil import headers_dict, is_null, jsobj, to_bytes, uint8
from durable.ports import Response
from protocol.errors import ProtocolError
from worker.request import EdgeRequest


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


def _split_url(url: str) -> tuple[str, str]:
    """(raw path, raw query) of an absolute URL, without decoding anything."""
    rest = url.split("://", 1)[-1]
    slash = rest.find("/")
    target = rest[slash:] if slash >= 0 else "/"
    target = target.split("#", 1)[0]
    path, _, query = target.partition("?")
    return path, query


def edge_request(js_request: Any) -> EdgeRequest:
    path, query = _split_url(str(js_request.url))
    return EdgeRequest(
        method=str(js_request.method).upper(),
        path=path,
        query=query,
        headers=headers_dict(js_request.headers),
        body=JsRequestBody(js_request.body),
    )


def js_response(resp: Response) -> Any:
    """A ports.Response as a JS Response; a stream body passes through untouched."""
    body = resp.body
    if isinstance(body, bytes | bytearray):
        body = uint8(bytes(body)) if body else None
    elif is_null(body):
        body = None
    return js.Response.new(body, jsobj({"status": resp.status, "headers": dict(resp.headers)}))


class DurableObjectStub:
    """ports.WorkspaceStub: one workspace's Durable Object."""

    def __init__(self, namespace_binding: Any, namespace: str, workspace: str):
        self._key = f"{namespace}/{workspace}"
        self._binding = namespace_binding
        self._stub: Any = None

    async def call(self, op: str, args: Any, body: Any = None) -> Response:
        if self._stub is None:
            self._stub = self._binding.getByName(self._key)
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
        return Response(
            status=int(js_resp.status),
            body=b"" if is_null(js_resp.body) else js_resp.body,
            headers=headers_dict(js_resp.headers),
        )


class DurableObjectDirectory:
    """ports.WorkspaceDirectory over the WORKSPACE Durable Object namespace."""

    def __init__(self, namespace_binding: Any):
        self._binding = namespace_binding

    def get(self, namespace: str, workspace: str) -> DurableObjectStub:
        return DurableObjectStub(self._binding, namespace, workspace)
