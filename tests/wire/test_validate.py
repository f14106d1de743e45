"""The wire contract's validators: each bad input maps to its documented error code."""

import json

import pytest

from protocol import (
    ProtocolError,
    decode_line,
    encode_event,
    error_event,
    exit_event,
    limits,
    output_event,
    parse_exec_request,
    parse_json_object,
    parse_workspace_config,
    started_event,
    status_event,
    validate_abs_path,
    validate_name,
    validate_offset,
    validate_request_id,
)
from protocol.errors import ERRORS, error_body
from protocol.validate import parse_file_mode

RID = "0123456789abcdef0123456789abcdef"


def code_of(fn, *args):
    with pytest.raises(ProtocolError) as info:
        fn(*args)
    return info.value.code


@pytest.mark.parametrize("name", ["a", "proj-1", "my.project_2", "0" * 63, "a..b"])
def test_valid_names(name):
    assert validate_name(name) == name


@pytest.mark.parametrize(
    "name", ["", "A", "-a", ".a", "..", "a/b", "a%2fb", "a" * 64, "a\n", "é", "a b", "a\x00", None, 5]
)
def test_invalid_names(name):
    assert code_of(validate_name, name) == "invalid_name"


def test_request_ids():
    assert validate_request_id(RID) == RID
    for bad in [RID.upper(), RID[:-1], RID + "0", RID[:-1] + "g", RID + "\n", None, 1]:
        assert code_of(validate_request_id, bad) == "invalid_request_id"


def test_paths():
    assert validate_abs_path("/workspace/a b/é") == "/workspace/a b/é"
    assert code_of(validate_abs_path, "relative") == "invalid_path"
    assert code_of(validate_abs_path, "/a\x00b") == "invalid_path"
    assert code_of(validate_abs_path, "/" + "a" * limits.MAX_PATH_BYTES) == "invalid_path"
    assert validate_abs_path("/" + "a" * (limits.MAX_PATH_BYTES - 1))
    # the limit counts UTF-8 bytes, not characters
    assert code_of(validate_abs_path, "/" + "é" * 2048) == "invalid_path"
    assert code_of(validate_abs_path, "/\udcff") == "invalid_path"
    assert code_of(validate_abs_path, "x", "invalid_cwd", "cwd") == "invalid_cwd"


def test_offsets():
    assert validate_offset("0") == 0
    assert validate_offset("123") == 123
    for bad in ["-1", "1.5", "", "x", "١٢", "9" * 13]:
        assert code_of(validate_offset, bad) == "invalid_query"


def test_json_object():
    assert parse_json_object(b'{"a": 1}') == {"a": 1}
    for bad in [b"[]", b"1", b"{", b"\xff", b"null"]:
        assert code_of(parse_json_object, bad) == "invalid_json"
    assert code_of(parse_json_object, b" " * (limits.MAX_BODY_BYTES + 1)) == "payload_too_large"


def exec_body(**fields):
    return {"request_id": RID, "command": "echo hi", **fields}


def test_exec_defaults():
    req = parse_exec_request(exec_body())
    assert (req.timeout, req.stdin, req.login, req.cwd, req.env) == (120, None, False, None, {})
    assert parse_exec_request(req.to_json()) == req


@pytest.mark.parametrize(
    "fields,code",
    [
        ({"extra": 1}, "unknown_field"),
        ({"command": 5}, "invalid_field"),
        ({"command": "a\x00b"}, "invalid_field"),
        ({"command": "x" * (limits.MAX_COMMAND_BYTES + 1)}, "command_too_large"),
        ({"command": "é" * (limits.MAX_COMMAND_BYTES // 2 + 1)}, "command_too_large"),
        ({"timeout": 0}, "invalid_timeout"),
        ({"timeout": -1}, "invalid_timeout"),
        ({"timeout": 901}, "invalid_timeout"),
        ({"timeout": True}, "invalid_timeout"),
        ({"timeout": "10"}, "invalid_timeout"),
        ({"timeout": float("nan")}, "invalid_timeout"),
        ({"stdin": 3}, "invalid_field"),
        ({"stdin": "\udc80"}, "invalid_field"),
        ({"login": "yes"}, "invalid_field"),
        ({"cwd": "tmp"}, "invalid_cwd"),
        ({"cwd": "/a\x00"}, "invalid_cwd"),
        ({"env": []}, "invalid_field"),
        ({"env": {"1A": "x"}}, "invalid_field"),
        ({"env": {"A-B": "x"}}, "invalid_field"),
        ({"env": {"A": 1}}, "invalid_field"),
        ({"env": {"A": "a\x00"}}, "invalid_field"),
        ({"env": {f"V{i}": "" for i in range(limits.MAX_ENV_VARS + 1)}}, "invalid_field"),
        ({"request_id": "x"}, "invalid_request_id"),
    ],
)
def test_exec_rejects(fields, code):
    assert code_of(parse_exec_request, exec_body(**fields)) == code


def test_exec_limits_are_inclusive():
    assert parse_exec_request(exec_body(command="x" * limits.MAX_COMMAND_BYTES))
    assert parse_exec_request(exec_body(timeout=limits.MAX_TIMEOUT_SECONDS)).timeout == 900
    assert parse_exec_request(exec_body(timeout=0.1)).timeout == 0.1


def test_workspace_config():
    cfg = parse_workspace_config({})
    assert cfg.to_json() == {"image": "hermes", "instance": None, "persistent": True, "cwd": "/workspace"}
    assert parse_workspace_config({"instance": "standard-4", "persistent": False}).persistent is False
    assert code_of(parse_workspace_config, {"instance": "huge"}) == "instance_not_allowed"
    assert code_of(parse_workspace_config, {"image": "../x"}) == "invalid_field"
    assert code_of(parse_workspace_config, {"persistent": 1}) == "invalid_field"
    assert code_of(parse_workspace_config, {"cwd": "rel"}) == "invalid_cwd"
    assert code_of(parse_workspace_config, {"cpu": 2}) == "unknown_field"


def test_file_mode():
    assert parse_file_mode(None) == 0o644
    assert parse_file_mode("0755") == 0o755
    assert parse_file_mode("600") == 0o600
    for bad in ["", "8", "07777", "rwx", "0x1"]:
        assert code_of(parse_file_mode, bad) == "invalid_query"


def test_events_roundtrip_and_shape():
    events = [
        status_event("restoring", "from s-1"),
        started_event(RID, "restored", {"id": "s-1", "created_at": "2026-01-01T00:00:00.000Z", "size": 3}),
        output_event("é\n😀", 7),
        exit_event(124, "timeout", 10),
        error_event("output_limit"),
    ]
    for event in events:
        line = encode_event(event)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert decode_line(line) == event
    # a newline inside data is escaped, so one event is always one line
    assert encode_event(output_event("a\nb", 0)).count(b"\n") == 1
    with pytest.raises(ValueError):
        status_event("booting")
    with pytest.raises(ValueError):
        exit_event(1, "crashed", 0)
    with pytest.raises(ValueError):
        error_event("made_up")
    for bad in [b"[]", b'{"type":"nope"}', b"{}"]:
        with pytest.raises(ValueError):
            decode_line(bad)


def test_error_table():
    for code, (status, message) in ERRORS.items():
        assert code.isidentifier() and code == code.lower()
        assert 400 <= status <= 599 and message
        err = ProtocolError(code)
        assert err.status == status and err.body() == error_body(code)
    assert json.dumps(ProtocolError("unauthorized").body()) == (
        '{"error": {"code": "unauthorized", "message": "missing or wrong bearer token"}}'
    )
    with pytest.raises(ValueError):
        ProtocolError("no_such_code")
