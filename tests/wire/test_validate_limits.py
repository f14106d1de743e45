"""The validators at their exact limits (protocol/validate.py): the last accepted value and the first refused one,
for JSON nesting, env entries, offsets and file modes; and the shapes of what they return."""

import dataclasses
import json

import pytest

from protocol import limits
from protocol.errors import ProtocolError
from protocol.validate import (
    ExecRequest,
    WorkspaceConfig,
    parse_env,
    parse_exec_request,
    parse_file_mode,
    parse_json_object,
    parse_workspace_config,
    validate_offset,
)

RID = "0" * 32


def code_of(fn, *args):
    with pytest.raises(ProtocolError) as err:
        fn(*args)
    return err.value.code


def nested(depth: int) -> bytes:
    """An object whose "a" holds `depth` - 1 nested lists, with many siblings so the bracket count passes the limit."""
    siblings = ",".join(["[]"] * (limits.MAX_JSON_DEPTH + 5))
    inner = "[" * (depth - 1) + "]" * (depth - 1)
    return f'{{"a":{inner},"b":[{siblings}]}}'.encode()


def test_nesting_up_to_the_limit_parses_and_one_more_is_refused():
    assert parse_json_object(nested(limits.MAX_JSON_DEPTH))["b"][0] == []
    assert code_of(parse_json_object, nested(limits.MAX_JSON_DEPTH + 1)) == "invalid_json"


def test_siblings_do_not_add_up_to_depth():
    many = b'{"a":[' + b",".join([b"[[]]"] * 100) + b"]}"  # 300 brackets, nesting 4
    assert len(parse_json_object(many)["a"]) == 100


def test_brackets_inside_strings_do_not_count():
    text = "[{" * 100 + '\\"' + "]}"
    body = json.dumps({"command": text, "nest": [[[]]]}).encode()
    assert parse_json_object(body)["command"] == text


def test_a_body_that_is_not_utf8_is_invalid_json():
    assert code_of(parse_json_object, b'{"command":"\xff"}') == "invalid_json"


def test_the_first_unknown_field_in_name_order_is_named():
    with pytest.raises(ProtocolError) as err:
        parse_workspace_config({"zz": 1, "aa": 2})
    assert err.value.code == "unknown_field" and "'aa'" in err.value.message


@pytest.mark.parametrize("name_len", [1, 100])
def test_an_env_entry_of_exactly_the_kernels_limit_is_accepted_and_one_byte_more_is_not(name_len):
    name = "N" * name_len
    value = "v" * (limits.MAX_ENV_ENTRY_BYTES - name_len - 1)  # NAME=value, the '=' included
    assert parse_env({name: value}) == {name: value}
    assert code_of(parse_env, {name: value + "v"}) == "invalid_field"


def test_env_entries_count_utf8_bytes():
    name = "N"
    value = "é" * ((limits.MAX_ENV_ENTRY_BYTES - 2) // 2)  # 2 bytes each
    assert parse_env({name: value}) == {name: value}
    assert code_of(parse_env, {name: value + "é"}) == "invalid_field"


def test_an_env_value_that_cannot_be_utf8_is_invalid_field():
    assert code_of(parse_env, {"A": "\ud800"}) == "invalid_field"


@pytest.mark.parametrize("value,ok", [("0", True), ("999999999999", True), ("1000000000000", False), ("-1", False)])
def test_offsets_have_at_most_twelve_digits(value, ok):
    if ok:
        assert validate_offset(value) == int(value)
    else:
        assert code_of(validate_offset, value) == "invalid_query"


@pytest.mark.parametrize(
    "value,mode", [("7", 0o7), ("644", 0o644), ("0644", 0o644), ("7777", 0o7777), ("", None), ("07777", None)]
)
def test_file_modes_have_one_to_four_octal_digits(value, mode):
    if mode is None:
        assert code_of(parse_file_mode, value) == "invalid_query"
    else:
        assert parse_file_mode(value) == mode


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), float("-inf")])
def test_timeouts_that_are_not_finite_are_refused(timeout):
    assert code_of(parse_exec_request, {"request_id": RID, "command": "x", "timeout": timeout}) == "invalid_timeout"


def test_what_the_validators_return_is_frozen():
    request = parse_exec_request({"request_id": RID, "command": "x"})
    config = parse_workspace_config({})
    for value in (request, config):
        with pytest.raises(dataclasses.FrozenInstanceError):
            value.command = "rm -rf /" if isinstance(value, ExecRequest) else None  # type: ignore[misc]


def test_defaults_of_the_typed_requests():
    # what an argument omitted in a call across the Durable Object stub becomes (operations.from_json)
    assert ExecRequest(RID, "x") == ExecRequest(RID, "x", limits.DEFAULT_TIMEOUT_SECONDS, None, False, None, {})
    assert WorkspaceConfig() == WorkspaceConfig(limits.DEFAULT_IMAGE, None, True, limits.DEFAULT_CWD)


def test_to_json_carries_every_field():
    request = ExecRequest(RID, "x", 5.5, "in", True, "/srv", {"A": "1"}, ("TOKEN",))
    assert request.to_json() == {
        "request_id": RID,
        "command": "x",
        "timeout": 5.5,
        "stdin": "in",
        "login": True,
        "cwd": "/srv",
        "env": {"A": "1"},
        "secrets": ["TOKEN"],
    }
    assert WorkspaceConfig("py", "lite", False, "/w").to_json() == {
        "image": "py",
        "instance": "lite",
        "persistent": False,
        "cwd": "/w",
    }


def test_secrets_join_env_without_clashing_or_passing_the_variable_limit():
    from protocol.services import parse_service

    env = {f"V{i}": "x" for i in range(limits.MAX_ENV_VARS)}
    for parse, body in (
        (parse_exec_request, {"request_id": RID, "command": "x"}),
        (parse_service, {"command": "x", "port": 3000}),
    ):
        with pytest.raises(ProtocolError, match="more than"):
            parse({**body, "env": env, "secrets": ["KEY"]})
        with pytest.raises(ProtocolError, match="both in env and in secrets"):
            parse({**body, "env": {"KEY": "1"}, "secrets": ["KEY"]})
        assert parse({**body, "env": dict(list(env.items())[:-1]), "secrets": ["KEY"]})
