"""JSON bodies that once gave a 500 (issue: hardening round 2, defect 3): a huge integer, deep nesting, duplicate
keys. Each is a 400 with a documented code, decided before anything is walked."""

import json

import pytest

from protocol import limits
from protocol.errors import ProtocolError
from protocol.validate import parse_exec_request, parse_json_object, parse_timeout

RID = "0123456789abcdef0123456789abcdef"


def _code(call) -> str:
    with pytest.raises(ProtocolError) as err:
        call()
    return err.value.code


def test_an_integer_too_large_for_a_float_is_an_invalid_timeout():
    assert _code(lambda: parse_timeout(10**400)) == "invalid_timeout"
    body = b'{"request_id":"%s","command":"true","timeout":%s}' % (RID.encode(), b"9" * 400)
    assert _code(lambda: parse_exec_request(parse_json_object(body))) == "invalid_timeout"
    assert parse_timeout(900) == 900 and _code(lambda: parse_timeout(901)) == "invalid_timeout"


@pytest.mark.parametrize("opener,closer", [(b"[", b"]"), (b'{"a":', b"}")])
def test_nesting_past_the_limit_is_refused_before_it_is_parsed(opener, closer):
    deep = 10_000  # far past the parser's own recursion limit: a RecursionError (500) before the bound existed
    body = b'{"x":' + opener * deep + b"1" + closer * deep + b"}"
    assert _code(lambda: parse_json_object(body)) == "invalid_json"
    at_limit = b'{"x":' + b"[" * (limits.MAX_JSON_DEPTH - 1) + b"1" + b"]" * (limits.MAX_JSON_DEPTH - 1) + b"}"
    assert parse_json_object(at_limit)["x"]  # exactly MAX_JSON_DEPTH levels, the outer object included
    over = b'{"x":' + b"[" * limits.MAX_JSON_DEPTH + b"1" + b"]" * limits.MAX_JSON_DEPTH + b"}"
    assert _code(lambda: parse_json_object(over)) == "invalid_json"


def test_brackets_inside_strings_do_not_count_as_nesting():
    text = '[{"\\"' * 5000  # brackets and escaped quotes inside one string value
    body = json.dumps({"command": "cat", "stdin": text}).encode()
    assert parse_json_object(body)["stdin"] == text


def test_a_key_named_twice_is_refused_whatever_the_values():
    body = b'{"request_id":"%s","command":"echo safe","command":"rm -rf /workspace"}' % RID.encode()
    with pytest.raises(ProtocolError) as err:
        parse_json_object(body)
    assert err.value.code == "invalid_json" and "'command'" in err.value.message
    nested = b'{"env":{"A":"1","A":"2"}}'
    assert _code(lambda: parse_json_object(nested)) == "invalid_json"
