"""The three places that name an operation agree: the edge's route table, the operations table and the
workspace's handlers — names, argument types, and the JSON that carries the arguments across a Durable Object stub."""

import dataclasses
import json
import typing

import pytest
from test_workspace import Env

from durable import operations
from durable.operations import EDGE_ONLY, OPERATIONS
from protocol.errors import ProtocolError
from protocol.files import ListRequest, MkdirRequest, MoveRequest, SignalRequest
from protocol.pty import PtyRequest
from protocol.services import parse_service
from protocol.validate import parse_exec_request, parse_workspace_config
from worker.routes import WORKSPACE_ROUTES


def _endpoints():
    listed = [endpoint for methods in WORKSPACE_ROUTES.values() for endpoint in methods.values()]
    return listed + [endpoint.switch[1] for endpoint in listed if endpoint.switch is not None]


def _handlers():
    return Env().ws.handlers


def test_every_operation_is_routed_and_every_route_names_a_known_operation():
    routed = {endpoint.operation for endpoint in _endpoints()}
    assert routed == set(OPERATIONS.values()) - EDGE_ONLY and not routed & EDGE_ONLY
    assert all(OPERATIONS[op.name] is op for op in routed)


def test_the_workspace_handles_exactly_the_operations():
    assert set(_handlers()) == set(OPERATIONS.values())


def test_each_handler_takes_its_operations_argument_type():
    for operation, handler in _handlers().items():
        hints = typing.get_type_hints(handler)
        assert hints["args"] is operation.args, (operation.name, hints["args"])


def test_each_route_prepares_its_operations_argument_type():
    for endpoint in _endpoints():
        hints = typing.get_type_hints(endpoint.prepare)
        assert hints["return"] is endpoint.operation.args, (endpoint.operation.name, hints["return"])


def test_argument_types_are_frozen_dataclasses():
    for operation in OPERATIONS.values():
        assert dataclasses.is_dataclass(operation.args), operation.name
        assert operation.args.__dataclass_params__.frozen, operation.name


def test_only_uploads_and_the_proxy_stream_their_body():
    streamed = [op.name for op in OPERATIONS.values() if op.streams_body]
    assert streamed == ["write_file", "put_archive", "import", "proxy"]


RID = "0" * 32

EXAMPLES = [
    operations.NoArgs(),
    operations.PutConfigArgs(parse_workspace_config({"instance": "lite", "persistent": False})),
    operations.ExecArgs(
        parse_exec_request({"request_id": RID, "command": "echo é", "env": {"A": "1"}, "secrets": ["KEY"]})
    ),
    operations.ReattachArgs(RID, 17),
    operations.CancelArgs(RID),
    operations.ReadFileArgs("/workspace/ä b"),
    operations.WriteFileArgs("/workspace/x", 0o755, 12),
    operations.PutServiceArgs(
        "web", parse_service({"command": "serve", "port": 3000, "allow_paths": ["/v1"]}).to_json()
    ),
    operations.ServiceArgs("web"),
    operations.ServiceLogsArgs("web", 10),
    operations.SecretArgs("API_KEY"),
    operations.PutSecretArgs("API_KEY", "sk-é"),
    operations.ProxyArgs("POST", "/v1/chat", "a=1", {"content-type": "application/json"}, port=3000),
    operations.PutConfigArgs(
        parse_workspace_config({}),
        operations.ForkSource("team", "src", "latest", image_given=True),
        {"handle": {"id": "snap-é"}, "created_at_ms": 1},
    ),
    operations.ShareArgs("s-1764406800123-9f2c1a"),
    operations.SnapshotArgs("before-migration é", keep=True),
    operations.PatchSnapshotArgs("snap-1", label=None, set_label=True, keep=False),
    operations.RestoreArgs(backup="b-1764406800123-9f2c1a", discard_changes=True),
    operations.ImportArgs(None),
    ListRequest("/workspace/é", depth=3, limit=10, cursor="a/b"),
    operations.StatArgs("/workspace/x"),
    operations.DeleteFileArgs("/workspace/x", recursive=True),
    MoveRequest("/workspace/a", "/workspace/b", overwrite=True),
    MkdirRequest("/workspace/d", parents=True, mode=0o700),
    operations.ArchiveArgs("/workspace/src", 1234),
    operations.SignalArgs(42, SignalRequest("TERM", group=True)),
    PtyRequest("0" * 32, cols=120, rows=40),
]


def test_every_argument_type_has_an_example():
    assert {type(a) for a in EXAMPLES} == {op.args for op in OPERATIONS.values()}


@pytest.mark.parametrize("args", EXAMPLES, ids=lambda a: type(a).__name__)
def test_arguments_round_trip_through_json(args):
    op = next(op for op in OPERATIONS.values() if op.args is type(args))
    wire = json.loads(json.dumps(operations.to_json(args)))
    assert operations.from_json(op.name, wire) == args


def test_from_json_is_strict():
    with pytest.raises(ValueError):
        operations.from_json("cancel", {"request_id": RID, "extra": 1})
    with pytest.raises(ValueError):
        operations.from_json("cancel", {})
    assert operations.from_json("reattach", {"request_id": RID}) == operations.ReattachArgs(RID, 0)


def test_an_unknown_operation_is_not_found():
    with pytest.raises(ProtocolError) as err:
        operations.from_json("nope", {})
    assert err.value.code == "not_found"
