"""Validation exactly at its limits, and the seed's user-visible limits as literal numbers: a silent change of
one of them changes what every client may send."""

import json

import pytest

from protocol import limits
from protocol.errors import ProtocolError
from protocol.validate import parse_env, parse_exec_request

RID = "0123456789abcdef0123456789abcdef"


def exec_body(**extra):
    return {"request_id": RID, "command": "echo hi", **extra}


def code_of(fn, *args):
    with pytest.raises(ProtocolError) as info:
        fn(*args)
    return info.value.code


@pytest.mark.parametrize("command", ["\ud800", "a\udfffb", "x" * 10 + "\udc80"])
def test_a_command_with_a_lone_surrogate_is_an_invalid_field(command):
    # json.loads("\"\\ud800\"") gives such a string; it cannot be encoded as UTF-8
    assert json.loads(json.dumps(command)) == command
    assert code_of(parse_exec_request, exec_body(command=command)) == "invalid_field"


def test_exactly_256_env_variables_are_accepted_and_257_refused():
    env = {f"V{i}": "" for i in range(256)}
    assert parse_env(env) == env
    assert parse_exec_request(exec_body(env=env)).env == env
    env["V256"] = ""
    assert code_of(parse_env, env) == "invalid_field"


def test_an_env_name_of_exactly_256_bytes_is_accepted_and_257_refused():
    assert parse_env({"A" * 256: "x"}) == {"A" * 256: "x"}
    assert code_of(parse_env, {"A" * 257: "x"}) == "invalid_field"


def test_the_seed_limits_users_see():
    assert limits.MAX_COMMAND_BYTES == 65_536  # 64 KiB of UTF-8
    assert limits.MAX_BODY_BYTES == 1_048_576  # 1 MiB per JSON body
    assert limits.MAX_OUTPUT_CHARS == 2_000_000  # code points of output per command
    assert limits.MAX_TIMEOUT_SECONDS == 900
    assert limits.DEFAULT_TIMEOUT_SECONDS == 120
    assert limits.MAX_ENV_VARS == 256 and limits.MAX_ENV_NAME_BYTES == 256
    assert limits.MAX_PATH_BYTES == 4096
    assert (limits.TIMEOUT_EXIT_CODE, limits.CANCELLED_EXIT_CODE) == (124, 130)
    assert limits.MIN_TOKEN_CHARS == 32
    # and the validators apply them
    assert parse_exec_request(exec_body()).timeout == 120
    assert parse_exec_request(exec_body(command="x" * 65_536)).command == "x" * 65_536
    assert code_of(parse_exec_request, exec_body(command="x" * 65_537)) == "command_too_large"
    assert parse_exec_request(exec_body(timeout=900)).timeout == 900
    assert code_of(parse_exec_request, exec_body(timeout=900.001)) == "invalid_timeout"
