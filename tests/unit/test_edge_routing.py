"""Routing and validation at the edge: every error code it produces is answered before the workspace is called,
and valid requests reach the workspace as exactly one (op, args, body) call whose Response passes through."""

import json

import pytest
from edge_doubles import Body, Workspaces, directory_object, error, send

from durable.ports import Response
from durable.settings import Settings
from protocol import limits
from protocol.errors import ProtocolError
from worker.edge import Edge

RID = "0123456789abcdef0123456789abcdef"
W = "/v1/workspaces/team/proj"
SETTINGS = Settings(
    allowed_instance_types=("lite", "standard-1"),
    default_instance_type="standard-1",
    images=("hermes", "python"),
    max_file_write_bytes=1000,
)
JSON = {"content-type": "application/json"}


def exec_body(**extra):
    return json.dumps({"request_id": RID, "command": "echo hi", **extra}).encode()


@pytest.fixture
def edge():
    workspaces = Workspaces()
    return Edge(
        token="t" * 40, settings=SETTINGS, workspaces=workspaces, directory=directory_object(), version="9.9"
    ), workspaces


# --- valid requests reach the workspace with the documented op and args ------------------------------------


@pytest.mark.parametrize(
    "method,path,query,op,args",
    [
        ("GET", W, "", "get", {}),
        ("DELETE", W, "confirm=true", "delete", {}),
        ("GET", W + f"/exec/{RID}", "", "reattach", {"request_id": RID, "offset": 0}),
        ("GET", W + f"/exec/{RID}", "offset=1234", "reattach", {"request_id": RID, "offset": 1234}),
        ("POST", W + f"/exec/{RID}/cancel", "", "cancel", {"request_id": RID}),
        ("GET", W + "/files", "path=/workspace/a%20b+c.txt", "read_file", {"path": "/workspace/a b c.txt"}),
        ("POST", W + "/snapshot", "", "snapshot", {"label": None, "keep": False}),
        ("GET", W + "/export", "", "export", {}),
        ("GET", W + "/backups", "", "backups", {}),
        ("POST", W + "/backup", "", "backup", {}),
        ("GET", W + "/snapshots", "", "snapshots", {}),
        ("POST", W + "/stop", "", "stop", {}),
    ],
)
async def test_routes_map_to_ops(edge, method, path, query, op, args):
    e, workspaces = edge
    resp = await send(e, method, path, query)
    assert resp is workspaces.response
    assert workspaces.calls == [("team", "proj", op, args, None)]


async def test_exec_passes_the_normalized_request(edge):
    e, workspaces = edge
    resp = await send(e, "POST", W + "/exec", headers=JSON, body=Body(exec_body(timeout=5, env={"A": "1"})))
    assert resp is workspaces.response
    (_, _, op, args, body) = workspaces.calls[0]
    assert op == "exec" and body is None
    assert args == {
        "request": {
            "request_id": RID,
            "command": "echo hi",
            "timeout": 5,
            "stdin": None,
            "login": False,
            "cwd": None,
            "env": {"A": "1"},
            "secrets": (),
        }
    }


async def test_json_content_type_with_charset_is_accepted(edge):
    e, workspaces = edge
    headers = {"content-type": "Application/JSON; charset=utf-8"}
    resp = await send(e, "POST", W + "/exec", headers=headers, body=Body(exec_body()))
    assert resp.status == 200 and workspaces.calls[0][2] == "exec"


async def test_put_config_is_normalized_with_the_default_instance(edge):
    e, workspaces = edge
    await send(e, "PUT", W, headers=JSON, body=Body(b'{"image":"python","persistent":false}'))
    assert workspaces.calls[0][2:4] == (
        "put_config",
        {
            "config": {"image": "python", "instance": "standard-1", "persistent": False, "cwd": "/workspace"},
            "source": None,
            "fork": None,
        },
    )


async def test_put_config_without_a_body_means_defaults(edge):
    e, workspaces = edge
    await send(e, "PUT", W, headers={"content-length": "0"})
    assert workspaces.calls[0][3] == {
        "source": None,
        "fork": None,
        "config": {"image": "hermes", "instance": "standard-1", "persistent": True, "cwd": "/workspace"},
    }


async def test_write_file_passes_the_stream_unread(edge):
    e, workspaces = edge
    body = Body(forbidden=True)
    await send(e, "PUT", W + "/files", "path=/workspace/x&mode=0755", {"content-length": "1000"}, body)
    assert workspaces.calls == [
        ("team", "proj", "write_file", {"path": "/workspace/x", "mode": 0o755, "length": 1000}, body.stream)
    ]
    assert not body.read_called


async def test_workspace_response_passes_through_untouched(edge):
    e, workspaces = edge
    stream = object()
    workspaces.response = Response(200, stream, {"content-type": "application/x-ndjson"})
    resp = await send(e, "POST", W + "/exec", headers=JSON, body=Body(exec_body()))
    assert resp.body is stream


async def test_workspace_protocol_errors_keep_their_status(edge):
    e, workspaces = edge
    workspaces.raise_exc = ProtocolError("workspace_not_found")
    assert error(await send(e, "GET", W)) == (404, "workspace_not_found")


async def test_unexpected_errors_are_generic_500s(edge, caplog):
    e, workspaces = edge
    workspaces.raise_exc = RuntimeError("secret detail " + "t" * 40)
    resp = await send(e, "GET", W)
    assert error(resp) == (500, "internal_error")
    assert b"secret detail" not in resp.body
    assert "t" * 40 not in caplog.text  # the token is redacted even from the log


# --- errors the edge produces, none of which reaches the workspace -----------------------------------------

BAD_ROUTES = [
    ("GET", "/", "", 404, "not_found"),
    ("GET", "/v1", "", 404, "not_found"),
    ("GET", "/v1/health/", "", 404, "not_found"),
    ("GET", "/v2/health", "", 404, "not_found"),
    ("GET", "/v1/workspaces/team", "", 404, "not_found"),
    ("GET", W + "/", "", 404, "not_found"),
    ("GET", W + "/nope", "", 404, "not_found"),
    ("POST", W + f"/exec/{RID}/cancel/x", "", 404, "not_found"),
    ("GET", "/v1/workspaces/BAD/x/nope", "", 404, "not_found"),  # unknown route wins over a bad name
    ("POST", "/v1/health", "", 405, "method_not_allowed"),
    ("POST", W, "", 405, "method_not_allowed"),
    ("GET", W + "/exec", "", 405, "method_not_allowed"),
    ("PATCH", W + "/files", "", 405, "method_not_allowed"),
    ("GET", W + "/stop", "", 405, "method_not_allowed"),
    ("GET", "/v1/workspaces/Team/proj", "", 400, "invalid_name"),
    ("GET", "/v1/workspaces/team/%70roj", "", 400, "invalid_name"),
    ("GET", "/v1/workspaces/../proj", "", 400, "invalid_name"),
    ("GET", "/v1/workspaces/team/..", "", 400, "invalid_name"),
    ("GET", "/v1/workspaces/caf%C3%A9/proj", "", 400, "invalid_name"),
    ("GET", "/v1/workspaces/café/proj", "", 400, "invalid_name"),
    ("GET", "/v1/workspaces/-team/proj", "", 400, "invalid_name"),
    ("GET", "/v1/workspaces/" + "a" * 64 + "/proj", "", 400, "invalid_name"),
    ("GET", W + "/exec/" + RID.upper(), "", 400, "invalid_request_id"),
    ("POST", W + "/exec/abc/cancel", "", 400, "invalid_request_id"),
    ("GET", W, "x=1", 400, "invalid_query"),
    ("GET", "/v1/health", "verbose=1", 400, "invalid_query"),
    ("POST", W + "/stop", "force=true", 400, "invalid_query"),
    ("DELETE", W, "confirm=true&confirm=true", 400, "invalid_query"),
    ("DELETE", W, "confirm=true&x=1", 400, "invalid_query"),
    ("DELETE", W, "", 400, "confirm_required"),
    ("DELETE", W, "confirm=yes", 400, "confirm_required"),
    ("DELETE", W, "confirm=TRUE", 400, "confirm_required"),
    ("GET", W + f"/exec/{RID}", "offset=-1", 400, "invalid_query"),
    ("GET", W + f"/exec/{RID}", "offset=abc", 400, "invalid_query"),
    ("GET", W + f"/exec/{RID}", "offset=", 400, "invalid_query"),
    ("GET", W + f"/exec/{RID}", "from=1", 400, "invalid_query"),
    ("GET", W + "/files", "", 400, "invalid_query"),
    ("GET", W + "/files", "path=/a&path=/b", 400, "invalid_query"),
    ("GET", W + "/files", "path=%zz", 400, "invalid_query"),
    ("GET", W + "/files", "path=/%ff", 400, "invalid_query"),
    ("GET", W + "/files", "path=relative", 400, "invalid_path"),
    ("GET", W + "/files", "path=/a%00b", 400, "invalid_path"),
    ("GET", W + "/files", "path=/" + "a" * limits.MAX_PATH_BYTES, 400, "invalid_path"),
    ("PUT", W + "/files", "path=/a&mode=999", 400, "invalid_query"),
    ("PUT", W + "/files", "path=/a&mode=0x1", 400, "invalid_query"),
    ("PUT", W + "/files", "path=/a&owner=root", 400, "invalid_query"),
]


@pytest.mark.parametrize("method,path,query,status,code", BAD_ROUTES)
async def test_route_and_query_errors(edge, method, path, query, status, code):
    e, workspaces = edge
    body = Body(forbidden=True)
    resp = await send(e, method, path, query, {"content-length": "5"}, body)
    assert error(resp) == (status, code)
    assert workspaces.calls == [] and not body.read_called
    if status == 405:
        assert resp.headers["allow"]


@pytest.mark.parametrize(
    "path,headers,data,status,code",
    [
        (W + "/exec", {}, exec_body(), 415, "unsupported_media_type"),
        (W + "/exec", {"content-type": "text/plain"}, exec_body(), 415, "unsupported_media_type"),
        (W + "/exec", JSON, b"", 400, "invalid_json"),
        (W + "/exec", JSON, b"[1]", 400, "invalid_json"),
        (W + "/exec", JSON, b"\xff{}", 400, "invalid_json"),
        (W + "/exec", JSON, exec_body(shell="zsh"), 400, "unknown_field"),
        (W + "/exec", JSON, exec_body(login="yes"), 400, "invalid_field"),
        (W + "/exec", JSON, exec_body(timeout=0), 400, "invalid_timeout"),
        (W + "/exec", JSON, exec_body(timeout=901), 400, "invalid_timeout"),
        (W + "/exec", JSON, exec_body(cwd="rel"), 400, "invalid_cwd"),
        (W + "/exec", JSON, json.dumps({"request_id": "x", "command": "ls"}).encode(), 400, "invalid_request_id"),
        (
            W + "/exec",
            JSON,
            json.dumps({"request_id": RID, "command": "x" * (limits.MAX_COMMAND_BYTES + 1)}).encode(),
            413,
            "command_too_large",
        ),
        (W + "/exec", JSON, b" " * (limits.MAX_BODY_BYTES + 1), 413, "payload_too_large"),  # no Content-Length
        (W, {"content-type": "text/plain"}, b"{}", 415, "unsupported_media_type"),
        (W, {}, b'{"image":"hermes"}', 415, "unsupported_media_type"),
        (W, JSON, b'{"image":"ubuntu"}', 400, "image_not_found"),
        (W, JSON, b'{"image":"bad/name"}', 400, "invalid_field"),
        (W, JSON, b'{"instance":"standard-4"}', 400, "instance_not_allowed"),
        (W, JSON, b'{"instance":"huge"}', 400, "instance_not_allowed"),
        (W, JSON, b'{"cwd":"workspace"}', 400, "invalid_cwd"),
        (W, JSON, b'{"persistent":"yes"}', 400, "invalid_field"),
        (W, JSON, b'{"size":1}', 400, "unknown_field"),
    ],
)
async def test_body_errors(edge, path, headers, data, status, code):
    e, workspaces = edge
    method = "PUT" if path == W else "POST"
    resp = await send(e, method, path, headers=headers, body=Body(data))
    assert error(resp) == (status, code)
    assert workspaces.calls == []


async def test_declared_oversize_json_is_refused_before_reading(edge):
    e, workspaces = edge
    body = Body(forbidden=True)
    headers = {**JSON, "content-length": str(limits.MAX_BODY_BYTES + 1)}
    resp = await send(e, "POST", W + "/exec", headers=headers, body=body)
    assert error(resp) == (413, "payload_too_large")
    assert not body.read_called and workspaces.calls == []


async def test_a_json_body_at_the_limit_is_read(edge):
    e, workspaces = edge
    data = exec_body()
    data = data + b" " * (limits.MAX_BODY_BYTES - len(data))
    resp = await send(e, "POST", W + "/exec", headers={**JSON, "content-length": str(len(data))}, body=Body(data))
    assert resp.status == 200 and workspaces.calls[0][2] == "exec"


async def test_a_malformed_json_content_length_is_refused_unread(edge):
    e, workspaces = edge
    body = Body(forbidden=True)
    resp = await send(e, "POST", W + "/exec", headers={**JSON, "content-length": "12x"}, body=body)
    assert error(resp) == (400, "invalid_json")
    assert not body.read_called and workspaces.calls == []


@pytest.mark.parametrize(
    "headers,status,code",
    [
        ({}, 411, "length_required"),
        ({"content-length": "ten"}, 411, "length_required"),
        ({"content-length": "1001"}, 413, "file_too_large"),
    ],
)
async def test_upload_length_rules(edge, headers, status, code):
    e, workspaces = edge
    body = Body(forbidden=True)
    resp = await send(e, "PUT", W + "/files", "path=/workspace/x", headers, body)
    assert error(resp) == (status, code)
    assert workspaces.calls == [] and not body.read_called
