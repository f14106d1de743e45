"""The edge with scoped keys (worker/edge.py over the real directory object): what a key reaches, what is read
before the decision, and a directory that cannot answer."""

import json

import pytest
from edge_doubles import TOKEN, Body, ByOperation, Workspaces, directory_object

from durable.ports import Response
from durable.settings import Settings
from protocol.errors import ProtocolError
from worker.edge import Edge
from worker.request import EdgeRequest

RID = "0" * 32


class BrokenDirectory:
    def __init__(self):
        self.calls = []

    async def call(self, op, args):
        self.calls.append(op)
        raise RuntimeError("the directory object is gone")


def make(directory=None):
    workspaces = Workspaces()
    edge = Edge(
        token=TOKEN, settings=Settings(), workspaces=workspaces, directory=directory or directory_object(), version="1"
    )
    return edge, workspaces


async def send(edge, method, path, credential=TOKEN, body=b"", query="", forbidden_body=False):
    headers = {"authorization": f"Bearer {credential}", "content-type": "application/json"}
    resp = await edge.handle(EdgeRequest(method, path, query, headers, Body(body, forbidden=forbidden_body)))
    is_json = resp.headers.get("content-type") == "application/json"
    return resp.status, (json.loads(resp.body) if is_json else resp.body)


async def mint(edge, **fields):
    status, minted = await send(edge, "POST", "/v1/keys", body=json.dumps(fields).encode())
    assert status == 201, minted
    return minted["key"]


async def test_out_of_scope_is_decided_before_the_body_is_read_or_the_workspace_called():
    edge, workspaces = make()
    key = await mint(edge, namespace="ns", workspace="ws", scopes=["files"])
    status, answer = await send(edge, "POST", "/v1/workspaces/ns/ws/exec", key, forbidden_body=True)
    assert (status, answer["error"]["code"]) == (403, "forbidden")
    assert workspaces.calls == []


async def test_in_scope_reaches_the_workspace_with_the_request():
    edge, workspaces = make()
    key = await mint(edge, namespace="ns", workspace="ws", scopes=["exec"])
    body = json.dumps({"request_id": RID, "command": "true"}).encode()
    status, _ = await send(edge, "POST", "/v1/workspaces/ns/ws/exec", key, body=body)
    assert status == 200
    assert [(c[0], c[1], c[2]) for c in workspaces.calls] == [("ns", "ws", "exec")]


@pytest.mark.parametrize("credential", ["fbk_", "fbk_0123456789abcdef_" + "a" * 32, TOKEN + "x", "", "bearer"])
async def test_no_key_shape_or_unknown_key_gets_past_401(credential):
    edge, workspaces = make()
    status, answer = await send(edge, "GET", "/v1/workspaces/ns/ws", credential)
    assert (status, answer["error"]["code"]) == (401, "unauthorized")
    assert workspaces.calls == []


async def test_a_directory_that_cannot_answer_is_503_for_a_key_never_a_pass():
    directory = BrokenDirectory()
    edge, workspaces = make(directory)
    status, answer = await send(edge, "GET", "/v1/workspaces/ns/ws", "fbk_0123456789abcdef_" + "a" * 32)
    assert (status, answer["error"]["code"]) == (503, "directory_unavailable")
    assert directory.calls == ["verify_key"] and workspaces.calls == []


async def test_a_create_without_the_directory_is_503_and_creates_nothing():
    edge, workspaces = make(BrokenDirectory())
    status, answer = await send(edge, "PUT", "/v1/workspaces/ns/ws", body=b"{}")
    assert (status, answer["error"]["code"]) == (503, "directory_unavailable")
    assert workspaces.calls == []


async def test_an_admin_command_runs_when_only_its_audit_record_is_lost(caplog):
    edge, workspaces = make(BrokenDirectory())
    body = json.dumps({"request_id": RID, "command": f"echo {TOKEN}"}).encode()
    status, _ = await send(edge, "POST", "/v1/workspaces/ns/ws/exec", body=body)
    assert status == 200 and len(workspaces.calls) == 1
    assert "audit record lost for exec on ns/ws" in caplog.text and TOKEN not in caplog.text


NOT_FOUND = Response.json(404, {"error": {"code": "workspace_not_found", "message": "x"}})
CREATED = Response.json(201, {})


def capped_edge(answers):
    workspaces = ByOperation(answers)
    edge = Edge(
        token=TOKEN,
        settings=Settings(),
        workspaces=workspaces,
        directory=directory_object(Settings(max_workspaces_per_namespace=1)),
        version="1",
    )
    return edge, workspaces


@pytest.mark.parametrize(
    "failure",
    [
        Response.json(400, {"error": {"code": "image_not_found", "message": "x"}}),
        RuntimeError("the workspace object did not answer"),
    ],
)
async def test_a_failed_create_of_a_workspace_that_does_not_exist_gives_its_slot_back(failure):
    edge, workspaces = capped_edge({"put_config": failure, "get": NOT_FOUND})
    assert (await send(edge, "PUT", "/v1/workspaces/ns/a", body=b"{}"))[0] >= 400
    workspaces.answers.update(put_config=CREATED, get=Response.json(200, {"workspace": "b"}))
    assert (await send(edge, "PUT", "/v1/workspaces/ns/b", body=b"{}"))[0] == 201
    status, answer = await send(edge, "PUT", "/v1/workspaces/ns/c", body=b"{}")
    assert (status, answer["error"]["code"]) == (403, "quota_exceeded")


async def test_a_conflicting_create_keeps_the_slot_of_the_workspace_that_exists():
    # another PUT created it meanwhile: it exists, so it stays indexed and counted
    conflict = Response.json(409, {"error": {"code": "config_conflict", "message": "x"}})
    edge, workspaces = capped_edge({"put_config": conflict, "get": Response.json(200, {"workspace": "a"})})
    assert (await send(edge, "PUT", "/v1/workspaces/ns/a", body=b"{}"))[0] == 409
    workspaces.answers["put_config"] = CREATED
    status, answer = await send(edge, "PUT", "/v1/workspaces/ns/b", body=b"{}")
    assert (status, answer["error"]["code"]) == (403, "quota_exceeded")
    status, listed = await send(edge, "GET", "/v1/workspaces")
    assert [w["workspace"] for w in listed["workspaces"]] == ["a"]


async def test_at_the_cap_workspaces_that_forgot_themselves_give_their_slots_back():
    edge, workspaces = capped_edge({"put_config": CREATED, "get": Response.json(200, {"workspace": "a"})})
    assert (await send(edge, "PUT", "/v1/workspaces/ns/a", body=b"{}"))[0] == 201
    workspaces.answers["get"] = NOT_FOUND  # ephemeral, idle: gone without a word to the directory
    assert (await send(edge, "PUT", "/v1/workspaces/ns/b", body=b"{}"))[0] == 201
    workspaces.answers["get"] = Response.json(200, {"workspace": "b"})
    status, answer = await send(edge, "PUT", "/v1/workspaces/ns/c", body=b"{}")
    assert (status, answer["error"]["code"]) == (403, "quota_exceeded")


async def test_an_ephemeral_stop_and_a_delete_leave_the_index():
    edge, workspaces = make()
    workspaces.response = Response.json(201, {})
    for name in ("a", "b", "c"):
        await send(edge, "PUT", f"/v1/workspaces/ns/{name}", body=b"{}")
    workspaces.response = Response.json(200, {"deleted": True})
    await send(edge, "POST", "/v1/workspaces/ns/a/stop")
    await send(edge, "DELETE", "/v1/workspaces/ns/b", query="confirm=true")
    workspaces.response = Response.json(200, {"namespace": "ns", "workspace": "c", "state": "stopped"})
    await send(edge, "POST", "/v1/workspaces/ns/c/stop")  # a persistent stop: still there
    status, listed = await send(edge, "GET", "/v1/workspaces")
    assert status == 200 and [w["workspace"] for w in listed["workspaces"]] == ["c"]


async def test_a_listed_workspace_that_forgot_itself_drops_out_of_the_index():
    edge, workspaces = make()
    workspaces.response = Response.json(201, {})
    await send(edge, "PUT", "/v1/workspaces/ns/gone", body=b"{}")
    workspaces.response = Response.json(404, {"error": {"code": "workspace_not_found", "message": "x"}})
    assert (await send(edge, "GET", "/v1/workspaces"))[1]["workspaces"] == []
    workspaces.response = Response.json(200, {"namespace": "ns", "workspace": "gone"})
    assert (await send(edge, "GET", "/v1/workspaces"))[1]["workspaces"] == []  # out of the index for good


async def test_a_secret_quoted_back_in_an_error_is_redacted():
    edge, _ = make()
    key = await mint(edge, namespace="ns", scopes=["exec"])
    status, answer = await send(edge, "GET", "/v1/health", key, query=f"{key}=1")
    assert status == 400 and key not in json.dumps(answer) and "[redacted]" in answer["error"]["message"]


class FailingUnindex:
    """The real directory, except that dropping an index entry fails (its disk just filled up)."""

    def __init__(self):
        self.real = directory_object()

    async def call(self, op, args):
        if op == "unindex_workspace":
            raise ProtocolError("storage_full")
        return await self.real.call(op, args)


async def test_a_delete_that_happened_is_answered_as_such_when_the_index_cannot_follow(caplog):
    edge, workspaces = make(FailingUnindex())
    workspaces.response = Response.json(200, {"deleted": True})
    status, answer = await send(edge, "DELETE", "/v1/workspaces/ns/ws", query="confirm=true")
    assert (status, answer) == (200, {"deleted": True})
    assert "could not drop ns/ws from the index (storage_full)" in caplog.text
