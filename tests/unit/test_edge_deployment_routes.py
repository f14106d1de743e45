"""The edge's deployment routes (/v1/keys, /v1/workspaces, /v1/audit) over the real directory object: their queries,
their answers, what each writes to the audit log, and the route table itself."""

import dataclasses
import json

import pytest
from edge_doubles import TOKEN, Body, ByOperation, FixedClock, Workspaces, directory_object

from durable.ports import Response
from durable.settings import Settings
from protocol import limits
from protocol.errors import ProtocolError
from worker.edge import Edge
from worker.request import EdgeRequest
from worker.routes import DEPLOYMENT_ROUTES, PROXY_METHODS, DeploymentEndpoint, match

RID = "0" * 32
STATUS = Response.json(200, {"state": "running"})


def make(workspaces=None, directory=None, access=None):
    workspaces = workspaces if workspaces is not None else Workspaces()
    directory = directory or directory_object()
    edge = Edge(
        token=TOKEN, settings=Settings(), workspaces=workspaces, directory=directory, version="1", access=access
    )
    return edge, workspaces, directory


async def send(edge, method, path, credential=TOKEN, body=b"", query=""):
    headers = {"authorization": f"Bearer {credential}", "content-type": "application/json"}
    resp = await edge.handle(EdgeRequest(method, path, query, headers, Body(body)))
    return resp.status, json.loads(resp.body) if resp.headers.get("content-type") == "application/json" else resp.body


def code(answer) -> str:
    return answer["error"]["code"]


async def mint(edge, **fields):
    status, minted = await send(edge, "POST", "/v1/keys", body=json.dumps(fields).encode())
    assert status == 201, minted
    return minted


async def audit(edge, query=""):
    status, page = await send(edge, "GET", "/v1/audit", query=query)
    assert status == 200, page
    return page["records"]


# --- the route table ------------------------------------------------------------------------------------------


def test_the_deployment_routes_are_exactly_these():
    table = {
        (path, method): (e.name, e.need, e.audited)
        for path, ms in DEPLOYMENT_ROUTES.items()
        for method, e in ms.items()
    }
    assert table == {
        (("health",), "GET"): ("health", "*", False),
        (("keys",), "POST"): ("mint_key", None, True),
        (("keys",), "GET"): ("list_keys", None, False),
        (("keys", "{key}"), "DELETE"): ("revoke_key", None, True),
        (("workspaces",), "GET"): ("list_workspaces", "*", False),
        (("audit",), "GET"): ("list_audit", "manage", False),
        **{(("proxy", "{path}"), m): ("proxy", "proxy", False) for m in PROXY_METHODS},
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEPLOYMENT_ROUTES[("audit",)]["GET"].need = None  # type: ignore[misc]


def test_a_key_id_in_the_path_is_carried_as_sent():
    route = match("DELETE", "/v1/keys/0123456789abcdef")
    assert isinstance(route.endpoint, DeploymentEndpoint) and route.key_id == "0123456789abcdef"
    assert match("GET", "/v1/keys").key_id is None


@pytest.mark.parametrize("path", ["/v1/workspaces/ns", "/v1/nothing", "/v1/keys/a/b", "/v1/audit/x"])
def test_unknown_deployment_shapes_are_not_found(path):
    with pytest.raises(ProtocolError) as err:
        match("GET", path)
    assert err.value.code == "not_found"


# --- Access ---------------------------------------------------------------------------------------------------


async def test_access_is_checked_before_anything_else():
    class Refuse:
        async def check(self, headers):
            raise ProtocolError("access_denied")

    edge, workspaces, _ = make(access=Refuse())
    for method, path in (("GET", "/v1/health"), ("POST", "/v1/workspaces/ns/ws/exec"), ("GET", "/v1/keys")):
        status, answer = await send(edge, method, path)
        assert (status, code(answer)) == (401, "access_denied")
    assert workspaces.calls == []
    assert await audit(make()[0]) == []


# --- keys -----------------------------------------------------------------------------------------------------


async def test_minting_answers_the_key_and_audits_its_target_without_the_secret():
    edge, _, _ = make()
    minted = await mint(edge, namespace="ns", workspace="ws", scopes=["files", "exec"], label="ci")
    assert set(minted) == {
        "id",
        "key",
        "label",
        "namespace",
        "workspace",
        "scopes",
        "service",
        "created_at",
        "expires_at",
        "last_used_at",
    }
    (record,) = await audit(edge)
    assert record["operation"] == "mint_key" and (record["namespace"], record["workspace"]) == ("ns", "ws")
    assert record["target_key_id"] == minted["id"] and record["scopes"] == ["exec", "files"]
    assert minted["key"] not in json.dumps(record)


@pytest.mark.parametrize(
    "method,path,query",
    [
        ("POST", "/v1/keys", "x=1"),
        ("GET", "/v1/keys", "x=1"),
        ("GET", "/v1/keys", "namespace=Bad"),
        ("DELETE", "/v1/keys/0123456789abcdef", "x=1"),
        ("GET", "/v1/health", "x=1"),
    ],
)
async def test_key_routes_take_only_their_query(method, path, query):
    edge, _, _ = make()
    body = json.dumps({"namespace": "ns", "scopes": ["exec"]}).encode()
    status, answer = await send(edge, method, path, body=body, query=query)
    assert (status, code(answer)) == (400, "invalid_query")


async def test_listing_keys_filters_by_namespace():
    edge, _, _ = make()
    await mint(edge, namespace="a", scopes=["exec"])
    await mint(edge, namespace="b", scopes=["exec"])
    status, listed = await send(edge, "GET", "/v1/keys", query="namespace=b")
    assert status == 200 and [k["namespace"] for k in listed["keys"]] == ["b"]
    assert len((await send(edge, "GET", "/v1/keys"))[1]["keys"]) == 2


async def test_revoking_answers_the_key_and_audits_it():
    edge, _, _ = make()
    minted = await mint(edge, namespace="ns", workspace="ws", scopes=["exec"])
    status, answer = await send(edge, "DELETE", f"/v1/keys/{minted['id']}")
    assert status == 200 and answer["revoked"] is True and answer["key"]["id"] == minted["id"]
    assert "key" not in answer["key"]
    record = (await audit(edge))[0]
    assert record["operation"] == "revoke_key" and record["target_key_id"] == minted["id"]
    assert (record["namespace"], record["workspace"], record["status"]) == ("ns", "ws", 200)
    status, answer = await send(edge, "DELETE", "/v1/keys/not-an-id")
    assert (status, code(answer)) == (404, "key_not_found")


# --- listing workspaces ----------------------------------------------------------------------------------------


async def index(directory, *names):
    for ns, ws in names:
        directory.adopt(ns, ws)


async def test_a_workspace_whose_status_fails_is_listed_with_its_error():
    workspaces = ByOperation({"get": Response.json(503, {"error": {"code": "container_unavailable", "message": "x"}})})
    edge, _, directory = make(workspaces)
    await index(directory, ("ns", "a"))
    status, listed = await send(edge, "GET", "/v1/workspaces")
    assert status == 200
    assert listed["workspaces"] == [
        {"namespace": "ns", "workspace": "a", "state": None, "error": "container_unavailable"}
    ]


async def test_a_workspace_that_cannot_be_asked_is_listed_as_internal_error(caplog):
    edge, _, directory = make(ByOperation({"get": RuntimeError("gone")}))
    await index(directory, ("ns", "a"))
    listed = (await send(edge, "GET", "/v1/workspaces"))[1]["workspaces"]
    assert listed == [{"namespace": "ns", "workspace": "a", "state": None, "error": "internal_error"}]
    assert "listing: the status of ns/a failed" in caplog.text


async def test_a_page_holds_100_by_default_and_limit_and_after_page_on():
    edge, _, directory = make(ByOperation({"get": STATUS}))
    await index(directory, *(("ns", f"w{i:03d}") for i in range(101)))
    page = (await send(edge, "GET", "/v1/workspaces"))[1]
    assert len(page["workspaces"]) == 100 and page["next"] == "ns/w099"
    rest = (await send(edge, "GET", "/v1/workspaces", query="after=ns/w099"))[1]
    assert len(rest["workspaces"]) == 1 and rest["next"] is None
    assert (
        len((await send(edge, "GET", "/v1/workspaces", query=f"limit={limits.MAX_PAGE_RECORDS}"))[1]["workspaces"])
        == 101
    )
    two = (await send(edge, "GET", "/v1/workspaces", query="limit=2&namespace=ns"))[1]
    assert len(two["workspaces"]) == 2 and two["next"] == "ns/w001"


@pytest.mark.parametrize(
    "query",
    [
        "limit=0",
        f"limit={limits.MAX_PAGE_RECORDS + 1}",
        "limit=x",
        "limit=-1",
        "after=ns",
        "after=NS/w",
        "after=ns/W",
        "namespace=N!",
        "x=1",
    ],
)
async def test_bad_listing_queries_are_invalid_query(query):
    edge, _, _ = make()
    status, answer = await send(edge, "GET", "/v1/workspaces", query=query)
    assert (status, code(answer)) == (400, "invalid_query")


async def test_a_key_lists_its_namespace_whatever_it_asks():
    edge, _, directory = make(ByOperation({"get": STATUS}))
    await index(directory, ("ns", "a"), ("other", "b"))
    key = (await mint(edge, namespace="ns", scopes=["exec"]))["key"]
    listed = (await send(edge, "GET", "/v1/workspaces", key))[1]["workspaces"]
    assert len(listed) == 1
    status, answer = await send(edge, "GET", "/v1/workspaces", key, query="namespace=other")
    assert (status, code(answer)) == (403, "forbidden")


async def test_a_create_below_the_cap_asks_no_workspace_for_its_status():
    workspaces = ByOperation({"put_config": Response.json(201, {})})
    edge = Edge(
        token=TOKEN,
        settings=Settings(),
        workspaces=workspaces,
        directory=directory_object(Settings(max_workspaces_per_namespace=5)),
        version="1",
    )
    for name in ("a", "b"):
        assert (await send(edge, "PUT", f"/v1/workspaces/ns/{name}", body=b"{}"))[0] == 201
    assert [c[2] for c in workspaces.calls] == ["put_config", "put_config"]


async def test_at_the_cap_every_page_of_the_index_is_checked(monkeypatch):
    monkeypatch.setattr(limits, "MAX_PAGE_RECORDS", 2)
    gone = Response.json(404, {"error": {"code": "workspace_not_found", "message": "x"}})

    class Answers(ByOperation):
        def get(self, namespace, workspace):
            self.answers["get"] = gone if workspace == "c" else STATUS
            return super().get(namespace, workspace)

    workspaces = Answers({"put_config": Response.json(201, {})})
    directory = directory_object(Settings(max_workspaces_per_namespace=3))
    edge = Edge(token=TOKEN, settings=Settings(), workspaces=workspaces, directory=directory, version="1")
    await index(directory, ("ns", "a"), ("ns", "b"), ("ns", "c"))  # "c" forgot itself; it is on the second page
    assert (await send(edge, "PUT", "/v1/workspaces/ns/d", body=b"{}"))[0] == 201


async def test_at_the_cap_a_workspace_that_cannot_be_asked_keeps_its_slot(caplog):
    workspaces = ByOperation({"put_config": Response.json(201, {}), "get": RuntimeError("gone")})
    directory = directory_object(Settings(max_workspaces_per_namespace=1))
    edge = Edge(token=TOKEN, settings=Settings(), workspaces=workspaces, directory=directory, version="1")
    await index(directory, ("ns", "a"))
    status, answer = await send(edge, "PUT", "/v1/workspaces/ns/b", body=b"{}")
    assert (status, code(answer)) == (403, "quota_exceeded")
    assert "could not check whether ns/a exists" in caplog.text


# --- what the index learns from answers --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method,path,query,answer,stays",
    [
        ("POST", "/v1/workspaces/ns/a/stop", "", Response.json(200, {"state": "stopped"}), True),
        ("POST", "/v1/workspaces/ns/a/stop", "", Response.json(503, {"deleted": True}), True),
        ("POST", "/v1/workspaces/ns/a/snapshot", "", Response.json(200, {"deleted": True}), True),
        ("GET", "/v1/workspaces/ns/a", "", Response.json(200, {"deleted": True}), True),
        (
            "DELETE",
            "/v1/workspaces/ns/a",
            "confirm=true",
            Response.json(409, {"error": {"code": "workspace_busy", "message": "x"}}),
            True,
        ),
        ("DELETE", "/v1/workspaces/ns/a", "confirm=true", Response.json(200, {"deleted": True}), False),
        ("POST", "/v1/workspaces/ns/a/stop", "", Response.json(200, {"deleted": True}), False),
        ("POST", "/v1/workspaces/ns/a/stop", "", Response(200, b"not json"), True),
    ],
)
async def test_only_a_delete_or_an_ephemeral_stop_leaves_the_index(method, path, query, answer, stays):
    workspaces = ByOperation({"get": STATUS})
    edge, _, directory = make(workspaces)
    await index(directory, ("ns", "a"))
    workspaces.response = answer
    await send(edge, method, path, query=query)
    page = await directory.call("list_workspaces", {"namespace": None, "workspace": None, "after": None, "limit": 9})
    assert (page["workspaces"] == [("ns", "a")]) is stays


# --- the audit log --------------------------------------------------------------------------------------------


async def test_each_audited_operation_keeps_its_details():
    workspaces = Workspaces()
    workspaces.response = Response.json(200, {})
    edge, _, _ = make(workspaces)
    await send(
        edge, "POST", "/v1/workspaces/ns/a/exec", body=json.dumps({"request_id": RID, "command": "make"}).encode()
    )
    await send(edge, "POST", f"/v1/workspaces/ns/a/exec/{RID}/cancel")
    headers = {"authorization": f"Bearer {TOKEN}", "content-length": "3"}
    await edge.handle(EdgeRequest("PUT", "/v1/workspaces/ns/a/files", "path=/w/x", headers, Body(b"abc")))
    write, cancel, executed = await audit(edge)
    assert (executed["request_id"], executed["command"]) == (RID, "make")
    assert cancel["request_id"] == RID and "command" not in cancel
    assert (write["path"], write["size"], write["request_id"]) == ("/w/x", 3, None)


async def test_audit_queries():
    clock = FixedClock(1_800_000_000_000)
    directory = directory_object(clock=clock)
    workspaces = Workspaces()
    workspaces.response = Response.json(200, {})
    edge, _, _ = make(workspaces, directory)
    for ns, ws in (("a", "x"), ("a", "y"), ("b", "z")):
        clock.ms += 60_000
        await send(edge, "POST", f"/v1/workspaces/{ns}/{ws}/stop")
    targets = lambda records: [(r["namespace"], r["workspace"]) for r in records]  # noqa: E731
    assert targets(await audit(edge, "namespace=a")) == [("a", "y"), ("a", "x")]
    assert targets(await audit(edge, "namespace=a&workspace=x")) == [("a", "x")]
    assert targets(await audit(edge, "since=2027-01-15T08:02:00Z")) == [("b", "z"), ("a", "y")]
    newest = (await audit(edge))[0]["seq"]
    assert targets(await audit(edge, f"before={newest}")) == [("a", "y"), ("a", "x")]
    assert targets(await audit(edge, "limit=1")) == [("b", "z")]
    for bad in ("workspace=x", "since=yesterday", "before=x", "before=-1", "limit=0", "namespace=A", "x=1"):
        status, answer = await send(edge, "GET", "/v1/audit", query=bad)
        assert (status, code(answer)) == (400, "invalid_query"), bad


async def test_a_key_reads_the_audit_of_its_reach_only_with_manage():
    workspaces = Workspaces()
    workspaces.response = Response.json(200, {})
    edge, _, _ = make(workspaces)
    for ns, ws in (("a", "x"), ("a", "y"), ("b", "z")):
        await send(edge, "POST", f"/v1/workspaces/{ns}/{ws}/stop")
    one = (await mint(edge, namespace="a", workspace="x", scopes=["manage"]))["key"]
    whole = (await mint(edge, namespace="a", scopes=["manage"]))["key"]
    without = (await mint(edge, namespace="a", scopes=["exec", "files", "snapshots"]))["key"]
    status, page = await send(edge, "GET", "/v1/audit", one)
    assert status == 200 and {(r["namespace"], r["workspace"]) for r in page["records"]} == {("a", "x")}
    status, page = await send(edge, "GET", "/v1/audit", whole, query="workspace=y&namespace=a")
    assert {(r["namespace"], r["workspace"]) for r in page["records"]} == {("a", "y")}
    status, page = await send(edge, "GET", "/v1/audit", whole)
    assert {r["namespace"] for r in page["records"]} == {"a"} and len(page["records"]) >= 2
    for credential, query in ((without, ""), (whole, "namespace=b"), (one, "namespace=a&workspace=y")):
        status, answer = await send(edge, "GET", "/v1/audit", credential, query=query)
        assert (status, code(answer)) == (403, "forbidden"), query


async def test_a_directory_failure_is_logged(caplog):
    class Broken:
        async def call(self, op, args):
            raise RuntimeError("down")

    edge, _, _ = make(directory=Broken())
    status, answer = await send(edge, "GET", "/v1/keys")
    assert (status, code(answer)) == (503, "directory_unavailable")
    assert "the directory failed on list_keys" in caplog.text


# --- details the audit log and the answers depend on -------------------------------------------------------------


async def test_a_key_can_neither_mint_nor_revoke_and_nothing_changes():
    edge, _, directory = make()
    minted = await mint(edge, namespace="ns", scopes=["exec", "files", "snapshots", "manage", "proxy"])
    body = json.dumps({"namespace": "ns", "scopes": ["exec"]}).encode()
    status, answer = await send(edge, "POST", "/v1/keys", minted["key"], body=body)
    assert (status, code(answer)) == (403, "forbidden")
    status, answer = await send(edge, "DELETE", f"/v1/keys/{minted['id']}", minted["key"])
    assert (status, code(answer)) == (403, "forbidden")
    assert [k["id"] for k in await directory.call("list_keys", {"namespace": None})] == [minted["id"]]


async def test_minting_needs_a_json_body():
    edge, _, _ = make()
    resp = await edge.handle(EdgeRequest("POST", "/v1/keys", "", {"authorization": f"Bearer {TOKEN}"}, Body(b"")))
    assert (resp.status, code(json.loads(resp.body))) == (415, "unsupported_media_type")


async def test_a_listed_workspace_is_its_status_object():
    status_object = {"namespace": "ns", "workspace": "a", "state": "stopped", "running": False}
    edge, _, directory = make(ByOperation({"get": Response.json(200, status_object)}))
    await index(directory, ("ns", "a"))
    assert (await send(edge, "GET", "/v1/workspaces"))[1]["workspaces"] == [status_object]


@pytest.mark.parametrize("status,kept", [(200, True), (201, True), (299, True), (300, False), (409, False)])
async def test_only_a_2xx_create_keeps_its_slot(status, kept):
    answer = Response.json(status, {} if status < 300 else {"error": {"code": "config_conflict", "message": "x"}})
    not_found = Response.json(404, {"error": {"code": "workspace_not_found", "message": "x"}})
    edge, _, directory = make(ByOperation({"put_config": answer, "get": not_found}))
    await send(edge, "PUT", "/v1/workspaces/ns/a", body=b"{}")
    page = await directory.call("list_workspaces", {"namespace": None, "workspace": None, "after": None, "limit": 9})
    assert (page["workspaces"] == [("ns", "a")]) is kept


async def test_a_directory_refusal_other_than_the_cap_asks_no_workspace():
    class FullDisk:
        def __init__(self):
            self.real = directory_object()

        async def call(self, op, args):
            if op == "reserve_workspace":
                raise ProtocolError("storage_full")
            return await self.real.call(op, args)

    workspaces = ByOperation({"get": STATUS})
    edge, _, _ = make(workspaces, FullDisk())
    status, answer = await send(edge, "PUT", "/v1/workspaces/ns/a", body=b"{}")
    assert (status, code(answer)) == (507, "storage_full") and workspaces.calls == []


async def test_audit_records_who_and_the_error_code_of_a_refusal():
    workspaces = Workspaces()
    workspaces.response = Response.json(200, {})
    edge, _, _ = make(workspaces)
    key = await mint(edge, namespace="ns", workspace="a", scopes=["exec"], label="bot")
    await send(edge, "POST", "/v1/workspaces/ns/a/exec", key["key"], body=b"{")  # 400 invalid_json
    await send(edge, "POST", "/v1/workspaces/ns/b/exec", key["key"], body=b"{}")  # 403
    await send(edge, "POST", "/v1/workspaces/ns/a/stop")  # the admin
    admin, refused, invalid, minted = await audit(edge)
    assert (admin["actor"], admin["key_id"], admin["key_label"], admin["code"]) == ("admin", None, None, None)
    assert (refused["key_label"], refused["status"], refused["code"]) == ("bot", 403, "forbidden")
    assert (invalid["status"], invalid["code"]) == (400, "invalid_json")
    assert minted["operation"] == "mint_key"


async def test_an_audit_record_holds_how_long_the_request_took():
    import asyncio

    class Slow(Workspaces):
        def get(self, namespace, workspace):
            stub = super().get(namespace, workspace)

            class Later:
                async def call(self, op, args, body=None):
                    await asyncio.sleep(0.05)
                    return await stub.call(op, args, body)

            return Later()

    workspaces = Slow()
    workspaces.response = Response.json(200, {})
    edge, _, _ = make(workspaces)
    await send(edge, "POST", "/v1/workspaces/ns/a/stop")
    (record,) = await audit(edge)
    assert 50 <= record["duration_ms"] < 5000


@pytest.mark.parametrize("before,ok", [("9" * 18, True), ("9" * 19, False)])
async def test_the_audit_cursor_has_at_most_eighteen_digits(before, ok):
    edge, _, _ = make()
    status, _ = await send(edge, "GET", "/v1/audit", query=f"before={before}")
    assert (status == 200) is ok


async def test_an_internal_error_logs_the_first_200_characters_of_the_path(caplog):
    edge, workspaces, _ = make()
    workspaces.raise_exc = RuntimeError("boom")
    path = "/v1/workspaces/ns/ws/exec/" + "b" * 300
    status, answer = await send(edge, "GET", path)
    assert (status, code(answer)) == (400, "invalid_request_id")  # a route error, not logged
    edge._log_unexpected(EdgeRequest("GET", path), RuntimeError("boom"))
    line = caplog.records[-1].getMessage().splitlines()[0]
    assert line == "internal error on GET " + path[:200]
