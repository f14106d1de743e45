"""Every route refuses a query parameter it does not define; Content-Length is ASCII digits only; an internal error
is logged (redacted) while the client sees a generic 500; a trailing `&` is tolerated."""

import json
import logging

import pytest
from edge_doubles import Body, Workspaces, auth, directory_object, error, send

from durable.settings import Settings
from protocol.errors import ProtocolError
from worker.edge import Edge
from worker.query import parse_query
from worker.request import EdgeRequest

RID = "0123456789abcdef0123456789abcdef"
W = "/v1/workspaces/team/proj"
SETTINGS = Settings(
    allowed_instance_types=("lite", "standard-1"),
    default_instance_type="standard-1",
    images=("hermes",),
    max_file_write_bytes=1000,
)
JSON = {"content-type": "application/json"}
EXEC_BODY = json.dumps({"request_id": RID, "command": "true"}).encode()


@pytest.fixture
def edge():
    workspaces = Workspaces()
    return Edge(
        token="t" * 40, settings=SETTINGS, workspaces=workspaces, directory=directory_object(), version="9.9"
    ), workspaces


# (method, path, a valid query, headers, body): each is accepted as given, and refused with one unknown parameter
ROUTES = [
    ("GET", "/v1/health", "", {}, b""),
    ("GET", W, "", {}, b""),
    ("PUT", W, "", JSON, b"{}"),
    ("DELETE", W, "confirm=true", {}, b""),
    ("POST", W + "/exec", "", JSON, EXEC_BODY),
    ("GET", W + f"/exec/{RID}", "offset=3", {}, b""),
    ("POST", W + f"/exec/{RID}/cancel", "", {}, b""),
    ("GET", W + "/files", "path=/workspace/a", {}, b""),
    ("PUT", W + "/files", "path=/workspace/a&mode=0600", {"content-length": "3"}, b"abc"),
    ("POST", W + "/snapshot", "", {}, b""),
    ("GET", W + "/snapshots", "", {}, b""),
    ("POST", W + "/stop", "", {}, b""),
]


@pytest.mark.parametrize("method,path,query,headers,data", ROUTES)
async def test_every_route_refuses_an_unknown_query_parameter(edge, method, path, query, headers, data):
    e, workspaces = edge
    assert (await send(e, method, path, query, headers, Body(data))).status == 200
    calls = len(workspaces.calls)
    extra = "&".join(filter(None, [query, "unknown=1"]))
    resp = await send(e, method, path, extra, headers, Body(data))
    assert error(resp) == (400, "invalid_query")
    assert len(workspaces.calls) == calls  # the workspace was not called


@pytest.mark.parametrize("method,path,query,headers,data", ROUTES)
async def test_a_trailing_ampersand_is_tolerated(edge, method, path, query, headers, data):
    e, _ = edge
    resp = await send(e, method, path, query + "&", headers, Body(data))
    assert resp.status == 200, resp.body


def test_empty_items_in_a_query_are_skipped():
    assert parse_query("a=1&", frozenset({"a"})) == {"a": "1"}
    assert parse_query("&&a=1&&", frozenset({"a"})) == {"a": "1"}
    assert parse_query("&", frozenset()) == {}


# Fullwidth "１２", Arabic-Indic "١٢", Devanagari "१२", superscript "²": str.isdigit() (and int()) accept some or
# all of them; HTTP allows only ASCII digits.
NON_ASCII_LENGTHS = ["１２", "١٢", "१२", "²", "1２", " ١٢ "]


@pytest.mark.parametrize("length", NON_ASCII_LENGTHS)
async def test_a_json_content_length_in_non_ascii_digits_is_refused_unread(edge, length):
    e, workspaces = edge
    body = Body(EXEC_BODY, forbidden=True)
    resp = await send(e, "POST", W + "/exec", headers={**JSON, "content-length": length}, body=body)
    assert error(resp) == (400, "invalid_json")
    assert not body.read_called and workspaces.calls == []


@pytest.mark.parametrize("length", NON_ASCII_LENGTHS)
async def test_an_upload_length_in_non_ascii_digits_is_length_required(edge, length):
    e, workspaces = edge
    resp = await send(e, "PUT", W + "/files", "path=/workspace/a", {"content-length": length}, Body(forbidden=True))
    assert error(resp) == (411, "length_required")
    assert workspaces.calls == []


async def test_an_internal_error_is_logged_with_its_traceback_but_never_the_token(edge, caplog):
    e, workspaces = edge
    workspaces.raise_exc = RuntimeError("boom-detail " + "t" * 40)
    with caplog.at_level(logging.ERROR, logger="flarebox.edge"):
        resp = await send(e, "GET", W + "/snapshots")
    assert error(resp) == (500, "internal_error")
    records = [r for r in caplog.records if r.name == "flarebox.edge" and r.levelno == logging.ERROR]
    assert len(records) == 1
    text = records[0].getMessage()
    assert "GET" in text and W + "/snapshots" in text
    assert "RuntimeError" in text and "boom-detail [redacted]" in text
    assert "t" * 40 not in caplog.text


async def test_a_protocol_error_is_not_logged_as_internal(edge, caplog):
    e, workspaces = edge
    workspaces.raise_exc = ProtocolError("workspace_not_found")
    with caplog.at_level(logging.ERROR, logger="flarebox.edge"):
        assert error(await send(e, "GET", W)) == (404, "workspace_not_found")
    assert not [r for r in caplog.records if r.name == "flarebox.edge"]


# --- Content-Length and Content-Type at their edges ----------------------------------------------------------


async def test_a_content_length_with_surrounding_whitespace_is_accepted(edge):
    e, workspaces = edge
    resp = await send(e, "PUT", W + "/files", "path=/workspace/a", {"content-length": " 3 "}, Body(b"abc"))
    assert resp.status == 200 and workspaces.calls[-1][3]["length"] == 3
    resp = await send(
        e, "POST", W + "/exec", headers={**JSON, "content-length": f" {len(EXEC_BODY)}\t"}, body=Body(EXEC_BODY)
    )
    assert resp.status == 200


async def test_a_content_length_of_18_digits_is_a_number_and_19_digits_malformed(edge):
    e, workspaces = edge
    for digits, expected in (("9" * 18, (413, "payload_too_large")), ("1" + "0" * 18, (400, "invalid_json"))):
        body = Body(EXEC_BODY, forbidden=True)
        resp = await send(e, "POST", W + "/exec", headers={**JSON, "content-length": digits}, body=body)
        assert error(resp) == expected, digits
        assert not body.read_called
    resp = await send(e, "PUT", W + "/files", "path=/a", {"content-length": "9" * 18}, Body(forbidden=True))
    assert error(resp) == (413, "file_too_large")
    resp = await send(e, "PUT", W + "/files", "path=/a", {"content-length": "1" + "0" * 18}, Body(forbidden=True))
    assert error(resp) == (411, "length_required")
    assert workspaces.calls == []


@pytest.mark.parametrize(
    "headers,data",
    [
        ({}, b""),  # no Content-Type, no body
        ({}, EXEC_BODY),
        ({"content-type": "text/plain"}, EXEC_BODY),
        ({"content-type": "application/jsonx"}, EXEC_BODY),
    ],
)
async def test_exec_without_a_json_content_type_is_refused_unread(edge, headers, data):
    e, workspaces = edge
    body = Body(data, forbidden=True)
    resp = await send(e, "POST", W + "/exec", headers=headers, body=body)
    assert error(resp) == (415, "unsupported_media_type")
    assert not body.read_called and workspaces.calls == []


@pytest.mark.parametrize("route", ["cancel", "reattach"])
async def test_a_request_id_route_without_its_id_is_not_found(route):
    from worker import prepare
    from worker.request import PathParams

    req = EdgeRequest("POST", W, "", auth(), Body())
    with pytest.raises(ProtocolError) as info:
        await getattr(prepare, route)(req, PathParams(), SETTINGS)
    assert info.value.code == "not_found"


def test_an_unknown_parameter_is_quoted_back_at_most_64_characters():
    with pytest.raises(ProtocolError) as info:
        parse_query("k" * 63 + "xy" + "z" * 100 + "=1", frozenset({"path"}))
    assert info.value.code == "invalid_query"
    assert info.value.message == "unknown query parameter " + repr("k" * 63 + "x")


@pytest.mark.parametrize("path", ["xv1/health", "v1/health", "", "?v1/health"])
async def test_a_path_not_starting_with_a_slash_is_not_found(edge, path):
    e, workspaces = edge
    assert error(await send(e, "GET", path)) == (404, "not_found")
    assert workspaces.calls == []


def test_routes_and_endpoints_are_immutable():
    import dataclasses

    from worker.routes import match

    route = match("GET", W + "/snapshots")
    with pytest.raises(dataclasses.FrozenInstanceError):
        route.namespace = "other"
    with pytest.raises(dataclasses.FrozenInstanceError):
        route.endpoint.prepare = None
    assert hash(route) == hash(match("GET", W + "/snapshots"))


async def test_the_token_quoted_in_an_error_message_is_redacted(edge):
    e, workspaces = edge
    token = "t" * 40
    resp = await send(e, "GET", W, f"{token}=1")
    assert error(resp) == (400, "invalid_query")
    message = json.loads(resp.body)["error"]["message"]
    assert token not in message and "[redacted]" in message
    resp = await send(e, "GET", W, "other=1")  # a message without the token is passed on as it is
    assert json.loads(resp.body)["error"]["message"] == "unknown query parameter 'other'"
