"""The edge's half of issue 13: a fork (the source's scope, the source sharing a snapshot before the PUT, its
image) and the validation of the new bodies — every refusal answered before a workspace is called."""

import json

import pytest
from edge_doubles import TOKEN, Body, directory_object

from durable import operations
from durable.ports import Response
from durable.settings import Settings
from protocol import limits
from worker.edge import Edge
from worker.request import EdgeRequest

REF = {"handle": {"id": "snap-9"}, "created_at_ms": 5}


class Workspaces:
    """Answers per (workspace, operation); records each call's JSON arguments."""

    def __init__(self, answers=None):
        self.calls = []
        self.answers = answers or {}

    def get(self, namespace, workspace):
        double = self

        class Stub:
            async def call(self, op, args, body=None):
                double.calls.append((workspace, op, operations.to_json(args)))
                return double.answers.get((workspace, op), Response.json(200, {}))

        return Stub()


def make(answers=None):
    workspaces = Workspaces(answers)
    settings = Settings(images=("hermes", "hermes-agent"))
    edge = Edge(token=TOKEN, settings=settings, workspaces=workspaces, directory=directory_object(), version="1")
    return edge, workspaces


async def send(edge, method, path, obj=None, credential=TOKEN, headers=None):
    data = json.dumps(obj).encode() if obj is not None else b""
    head = {"authorization": f"Bearer {credential}", "content-type": "application/json", **(headers or {})}
    resp = await edge.handle(EdgeRequest(method, path, "", head, Body(data)))
    return resp.status, json.loads(resp.body) if resp.headers.get("content-type") == "application/json" else None


def not_found(code="workspace_not_found"):
    return Response.json(404, {"error": {"code": code, "message": "x"}})


def shared(image="hermes-agent"):
    return Response.json(200, {"snapshot": {"id": "snap-9"}, "ref": REF, "image": image})


async def test_a_fork_shares_the_sources_snapshot_and_takes_its_image():
    edge, ws = make({("new", "get"): not_found(), ("src", "share_snapshot"): shared()})
    status, _ = await send(edge, "PUT", "/v1/workspaces/ns/new", {"from": {"namespace": "ns", "workspace": "src"}})
    assert status == 200
    share = next(c for c in ws.calls if c[1] == "share_snapshot")
    assert share == ("src", "share_snapshot", {"snapshot": None})
    put = next(c for c in ws.calls if c[1] == "put_config")
    assert put[2]["fork"] == REF and put[2]["config"]["image"] == "hermes-agent"


async def test_a_fork_naming_another_image_is_refused():
    edge, ws = make({("new", "get"): not_found(), ("src", "share_snapshot"): shared()})
    body = {"image": "hermes", "from": {"namespace": "ns", "workspace": "src"}}
    status, answer = await send(edge, "PUT", "/v1/workspaces/ns/new", body)
    assert (status, answer["error"]["code"]) == (400, "invalid_field")
    assert not any(c[1] == "put_config" for c in ws.calls)


async def test_an_existing_workspace_answers_its_put_without_a_new_snapshot_of_the_source():
    existing = Response.json(200, {"config": {"image": "hermes-agent"}})
    edge, ws = make({("new", "get"): existing})
    status, _ = await send(edge, "PUT", "/v1/workspaces/ns/new", {"from": {"namespace": "ns", "workspace": "src"}})
    assert status == 200 and not any(c[1] == "share_snapshot" for c in ws.calls)
    put = next(c for c in ws.calls if c[1] == "put_config")
    assert put[2]["fork"] is None and put[2]["source"] is None
    assert put[2]["config"]["image"] == "hermes-agent"  # a repeated fork PUT is idempotent, inherited image too


async def test_a_missing_source_is_named_in_the_answer():
    edge, ws = make({("new", "get"): not_found(), ("src", "share_snapshot"): not_found()})
    status, answer = await send(edge, "PUT", "/v1/workspaces/ns/new", {"from": {"namespace": "ns", "workspace": "src"}})
    assert (status, answer["error"]["code"]) == (404, "workspace_not_found") and "ns/src" in answer["error"]["message"]
    assert not any(c[1] == "put_config" for c in ws.calls)


async def test_a_workspace_cannot_fork_itself():
    edge, ws = make()
    status, answer = await send(edge, "PUT", "/v1/workspaces/ns/a", {"from": {"namespace": "ns", "workspace": "a"}})
    assert (status, answer["error"]["code"]) == (400, "invalid_field") and ws.calls == []


async def test_a_key_needs_snapshots_on_the_source_too():
    edge, ws = make({("new", "get"): not_found(), ("src", "share_snapshot"): shared()})
    _, minted = await send(edge, "POST", "/v1/keys", {"namespace": "ns", "workspace": "new", "scopes": ["manage"]})
    fork = {"from": {"namespace": "ns", "workspace": "src"}}
    status, answer = await send(edge, "PUT", "/v1/workspaces/ns/new", fork, credential=minted["key"])
    assert (status, answer["error"]["code"]) == (403, "forbidden") and ws.calls == []
    _, wide = await send(edge, "POST", "/v1/keys", {"namespace": "ns", "scopes": ["manage", "snapshots"]})
    status, _ = await send(edge, "PUT", "/v1/workspaces/ns/new", fork, credential=wide["key"])
    assert status == 200


@pytest.mark.parametrize(
    "method,path,body",
    [
        ("POST", "snapshot", {"label": "x" * 101}),
        ("POST", "snapshot", {"label": "a\nb"}),
        ("POST", "snapshot", {"keep": "yes"}),
        ("POST", "snapshot", {"pin": True}),
        ("PATCH", "snapshots/snap-1", {}),
        ("PATCH", "snapshots/snap-1", {"keep": 1}),
        ("PATCH", "snapshots/-bad", {"keep": True}),
        ("POST", "restore", {}),
        ("POST", "restore", {"snapshot": "latest", "backup": "b-1764406800123-9f2c1a"}),
        ("POST", "restore", {"backup": "s-1764406800123-9f2c1a"}),
        ("POST", "restore", {"snapshot": "latest", "discard_changes": "true"}),
        ("PUT", "", {"from": "ns/src"}),
        ("PUT", "", {"from": {"namespace": "ns"}}),
        ("PUT", "", {"from": {"namespace": "ns", "workspace": "Src"}}),
        ("PUT", "", {"from": {"namespace": "ns", "workspace": "src", "snapshot": ""}}),
    ],
)
async def test_bad_bodies_are_refused_before_any_workspace_is_called(method, path, body):
    edge, ws = make()
    status, answer = await send(edge, method, f"/v1/workspaces/ns/ws/{path}".rstrip("/"), body)
    assert status == 400 and answer["error"]["code"] in ("invalid_field", "unknown_field", "invalid_name")
    assert ws.calls == []


async def test_an_import_over_its_limit_is_413_before_the_workspace():
    edge, ws = make()
    headers = {"content-length": str(limits.MAX_IMPORT_BYTES + 1)}
    status, answer = await send(edge, "PUT", "/v1/workspaces/ns/ws/import", headers=headers)
    assert (status, answer["error"]["code"]) == (413, "payload_too_large") and ws.calls == []


async def test_valid_bodies_reach_the_workspace_as_typed_arguments():
    edge, ws = make()
    await send(edge, "POST", "/v1/workspaces/ns/ws/snapshot", {"label": "before-migration", "keep": True})
    await send(edge, "PATCH", "/v1/workspaces/ns/ws/snapshots/snap-1", {"label": None})
    await send(edge, "POST", "/v1/workspaces/ns/ws/restore", {"snapshot": "latest", "discard_changes": True})
    assert [c[1:] for c in ws.calls] == [
        ("snapshot", {"label": "before-migration", "keep": True}),
        ("patch_snapshot", {"snapshot_id": "snap-1", "label": None, "set_label": True, "keep": None}),
        ("restore", {"snapshot": "latest", "backup": None, "discard_changes": True}),
    ]
